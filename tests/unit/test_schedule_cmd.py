"""`approxdist schedule show|list`, driven through its own `register` (no processes)."""

from __future__ import annotations

import argparse

import pytest

from approxdist.cli import schedule_cmd
from approxdist.pipeline.errors import PipelineError, ScheduleError


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    parser = argparse.ArgumentParser(prog="approxdist")
    schedule_cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_show_1f1b_prints_grid_bubble_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["schedule", "show", "1f1b", "--stages", "4", "--microbatches", "8"], capsys)
    lines = out.splitlines()
    assert lines[0] == "schedule 1f1b: 4 stages (one per rank), 8 micro-batches; valid"
    assert lines[1].split()[:2] == ["step", "0"] and lines[1].split()[-1] == "21"
    assert [line.split()[:2] for line in lines[2:6]] == [["rank", str(r)] for r in range(4)]
    assert "(P-1)/(M+P-1) = 3/11 = 0.273; simulated" in lines[6]
    assert lines[7] == ("peak in-flight activations per stage: "
                        "stage 0: 4, stage 1: 3, stage 2: 2, stage 3: 1")


def test_show_with_comm_prints_sends(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["schedule", "show", "gpipe", "-p", "2", "-m", "2", "--with-comm"], capsys)
    assert "0SF0" in out and "1RF0" in out and "1SB1" in out


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["schedule", "list"], capsys)
    assert out.startswith("1f1b ") and "\ngpipe " in out
    assert "\npipedream       PipeDream: " in out
    assert out.splitlines()[5].endswith("(asynchronous)")  # after the 5 flushed ones
    assert "\nzbh1            ZB-H1 (zero bubble, 1F1B's memory): " in out


def test_errors_are_domain_errors() -> None:
    with pytest.raises(ScheduleError, match="unknown schedule 'zb'; valid: 1f1b, 2bw, gpipe, "
                                            "pipedream, pipedream-vsync, zbh1, zbh2"):
        schedule_cmd.render_show("zb", 2, 2)
    with pytest.raises(PipelineError, match=r"micro-batches \(0\)"):
        schedule_cmd.render_show("gpipe", 2, 0)


def test_show_pipedream_prints_versions_bubbles_and_limits(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["schedule", "show", "pipedream", "--stages", "4", "--microbatches", "8"], capsys)
    lines = out.splitlines()
    assert lines[0] == ("schedule pipedream (asynchronous: no flush between mini-batches; "
                        "train streams each epoch): 4 stages (one per rank), a stream of 2 mini-batches x "
                        "8 micro-batches = 16; valid, with versions")
    assert lines[1].startswith("cells <stage><F|B><n>v<version>")
    assert lines[3].split()[2:12] == ["0F0v0", "0F1v0", "0F2v0", "0F3v0", ".", ".", ".",
                                      "0B0v0", "0F4v1", "0B1v0"]
    assert lines[7] == ("bubble fraction over the stream (simulated, forward = backward = 1 "
                        "step): pipedream 0.158 (theory (P-1)/(K*M+P-1) = 3/19); flushed after "
                        "every mini-batch: 1f1b 0.273, gpipe 0.273 (theory (P-1)/(M+P-1) = 3/11)")
    assert lines[8].startswith("optimizer steps per stage: 16, one after every backward")
    assert lines[9].endswith("stage 0: 3, stage 1: 2, stage 2: 1, stage 3: 0")
    assert lines[10] == ("weight versions alive per stage, most (limit): stage 0: 4 (4), "
                         "stage 1: 3 (3), stage 2: 2 (2), stage 3: 1 (1)")


def test_show_2bw_prints_the_update_rule(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["schedule", "show", "2bw", "-p", "4", "-m", "4"], capsys)
    lines = out.splitlines()
    assert "a stream of 3 mini-batches x 4 micro-batches = 12" in lines[0]
    assert "0F8v1" in lines[3] and "0B7v0" in lines[3]
    assert lines[8] == ("optimizer steps per stage: 3, one per mini-batch, after its last "
                        "backward, applying 4 gradients; the last on stage 0: "
                        "v1 = v0 - lr*g(0-3 @ v0); v2 = v1 - lr*g(4-7 @ v0); "
                        "v3 = v2 - lr*g(8-11 @ v1)")
    assert lines[10].endswith("stage 0: 2 (2), stage 1: 2 (2), stage 2: 2 (2), stage 3: 2 (2)")


def test_show_prints_each_rank_as_executed(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _run(["schedule", "show", "2bw", "-p", "2", "-m", "2"], capsys).splitlines()
    assert lines[-3].startswith("as executed (V<v>: the next forwards and backwards run on "
                                "version v; U<v>: the optimizer step making version v")
    assert lines[-2] == ("rank 0: 0V0 0F0 0F1 0B0 0F2 0B1 0U1 0F3 0B2 0V1 0F4 0V0 0B3 0U2 0V1 "
                         "0F5 0B4 0B5 0U3")
    assert lines[-1] == "rank 1: 1V0 1F0 1B0 1F1 1B1 1U1 1F2 1B2 1F3 1B3 1U2 1V1 1F4 1B4 1F5 1B5 1U3"
    out = _run(["schedule", "show", "2bw", "-p", "2", "-m", "2", "--with-comm"], capsys)
    # a step waits for the sends after its backward: the stage before gets its gradient first
    assert "rank 1: 1RF0 1V0 1F0 1RF1 1B0 1SB0 1F1 1RF2 1B1 1SB1 1U1 1F2" in out


def test_show_async_stream_length_and_comm(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["schedule", "show", "pipedream-vsync", "-p", "2", "-m", "1", "--minibatches",
                "3", "--with-comm"], capsys)
    assert "a stream of 3 mini-batches x 1 micro-batches = 3" in out
    assert "1F2v1" in out and "0SF2" in out


def test_stream_options_are_refused_where_they_do_not_apply() -> None:
    with pytest.raises(ScheduleError, match=r"--minibatches 2: gpipe flushes after every "
                                            r"mini-batch"):
        schedule_cmd.render_show("gpipe", 2, 2, minibatches=2)
    with pytest.raises(ScheduleError, match=r"pipedream-vsync with replicated stages \(replicas "
                                            r"2,2\) is not available"):
        schedule_cmd.render_show("pipedream-vsync", 2, 2, replicas="2")
    with pytest.raises(ScheduleError, match=r"2bw with replicas 3,1 steps each stage once per "
                                            r"round of its replicas: micro-batches \(4\) must "
                                            r"be a multiple of 3; try 3 or 6"):
        schedule_cmd.render_show("2bw", 2, 4, replicas="3,1")


def test_show_async_on_replicated_stages(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["schedule", "show", "pipedream", "-p", "2", "-m", "2", "--replicas", "2,1",
                "-k", "3", "--with-comm"], capsys)
    lines = out.splitlines()
    assert lines[0] == ("schedule pipedream (asynchronous: no flush between mini-batches; "
                        "train streams each epoch): 2 stages (replicas 2,1 (3 ranks, "
                        "stage-major, micro-batches dealt round robin)), a stream of 3 "
                        "mini-batches x 2 micro-batches = 6; valid, with versions")
    rows = {line.split()[1]: line.split()[2:] for line in lines[3:6]}
    assert [c for c in rows["0"] if c != "."][:7] == ["0RB0", "0F0v0", "0SF0", "0B0v0", "0RB2",
                                                      "0AR0", "0F2v1"]
    assert "0F3v1" in rows["1"] and "0AR1" in rows["1"] and "1F1v1" in rows["2"]
    assert lines[7] == ("optimizer steps per stage, every replica of a stage in lockstep: "
                        "stage 0: 3, one per 2 micro-batch(es) (1 on each of 2 replicas, "
                        "summed by AR); stage 1: 6, one per 1 micro-batch(es)")
    assert lines[9] == ("weight versions alive per stage, most (limit): rank 0 (stage 0): 1 (1), "
                        "rank 1 (stage 0): 1 (1), rank 2 (stage 1): 1 (1)")


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """`approxdist schedule show ... | head -1`: no traceback when the reader goes away."""
    import subprocess
    import sys

    cmd = [sys.executable, "-c", "from approxdist.cli.main import main; raise SystemExit(main())",
           "schedule", "show", "pipedream", "--stages", "4", "--microbatches", "8",
           "--minibatches", "60"]  # ~100 KB: more than a pipe's 64 KB holds
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away after one line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err
