"""Asynchronous schedules as data (PipeDream, PipeDream-2BW): orders, weight versions, the
2BW update rule, bubbles against the flushed schedules, and their refusal by the trainer."""

from __future__ import annotations

import pytest

from approxdist.cli.main import main
from approxdist.config.loader import load_config
from approxdist.errors import ConfigError
from approxdist.pipeline.errors import PipelineError, ScheduleError
from approxdist.pipeline.schedule import (
    Action,
    Kind,
    async_schedule_names,
    build_async_schedule,
    build_schedule,
    check_schedule,
    check_versions,
    schedule_names,
)
from approxdist.pipeline.schedule.action import format_actions
from approxdist.pipeline.schedule.async_grid import (
    flushed_stream,
    format_async_grid,
    stream_bubbles,
)
from approxdist.pipeline.schedule.grid import theoretical_bubble
from approxdist.pipeline.schedule.versions import (
    AsyncSchedule,
    Stream,
    gradient_delays,
    peak_versions,
    versions_alive,
)
from approxdist.train.check import check_parts

ASYNC = ["pipedream", "pipedream-vsync", "2bw"]
#: (P, M, K); 2bw needs M >= P - 1
SIZES = [(p, m, k) for p in range(1, 6) for m in range(max(p - 1, 1), 7) for k in (1, 2, 3)]


def _forward_versions(s: AsyncSchedule, rank: int) -> list[int]:
    """The version of each forward of `rank`, by micro-batch."""
    return [s.version_of(rank, Action(rank, Kind.FORWARD, n)) for n in range(s.stream.items)]


def test_async_names_live_apart_from_the_executable_ones() -> None:
    assert async_schedule_names() == sorted(ASYNC)
    assert not set(ASYNC) & set(schedule_names())


def test_pipedream_actions_with_comm_and_versions_golden() -> None:
    s = build_async_schedule("pipedream", 2, 2, 2)
    assert format_actions(s.order[0]) == ("0F0 0SF0 0RB0 0F1 0SF1 0B0 0RB1 0F2 0SF2 0B1 0RB2 "
                                          "0F3 0SF3 0RB3 0B2 0B3")
    assert format_actions(s.order[1]) == ("1RF0 1F0 1RF1 1B0 1SB0 1F1 1RF2 1B1 1SB1 1F2 1RF3 "
                                          "1B2 1SB2 1F3 1B3 1SB3")
    assert _forward_versions(s, 0) == [0, 0, 1, 2] and _forward_versions(s, 1) == [0, 1, 2, 3]


PIPEDREAM_2 = """\
step       0     1     2     3     4     5     6     7     8     9
rank 0 0F0v0 0F1v0     . 0B0v0 0F2v1 0B1v0 0F3v2 0B2v1     . 0B3v2
rank 1     . 1F0v0 1B0v0 1F1v1 1B1v1 1F2v2 1B2v2 1F3v3 1B3v3     ."""

TWO_BW_2 = """\
step       0     1     2     3     4     5     6     7     8     9    10    11    12    13
rank 0 0F0v0 0F1v0     . 0B0v0 0F2v0 0B1v0 0F3v0 0B2v0 0F4v1 0B3v0 0F5v1 0B4v1     . 0B5v1
rank 1     . 1F0v0 1B0v0 1F1v0 1B1v0 1F2v0 1B2v0 1F3v0 1B3v0 1F4v1 1B4v1 1F5v1 1B5v1     ."""

PIPEDREAM_4 = "\n".join([
    "step       0     1     2     3     4     5     6     7     8"
    "     9    10    11    12    13    14    15    16    17",
    "rank 0 0F0v0 0F1v0 0F2v0 0F3v0     .     .     . 0B0v0 0F4v1"
    " 0B1v0 0F5v2 0B2v0     . 0B3v0     . 0B4v1     . 0B5v2",
    "rank 1     . 1F0v0 1F1v0 1F2v0     .     . 1B0v0 1F3v1 1B1v0"
    " 1F4v2 1B2v0 1F5v3 1B3v1     . 1B4v2     . 1B5v3     .",
    "rank 2     .     . 2F0v0 2F1v0     . 2B0v0 2F2v1 2B1v0 2F3v2"
    " 2B2v1 2F4v3 2B3v2 2F5v4 2B4v3     . 2B5v4     .     .",
    "rank 3     .     .     . 3F0v0 3B0v0 3F1v1 3B1v1 3F2v2 3B2v2"
    " 3F3v3 3B3v3 3F4v4 3B4v4 3F5v5 3B5v5     .     .     .",
])

VSYNC_4_RANK_1 = ("rank 1     . 1F0v0 1F1v0 1F2v0     .     . 1B0v0 1F3v0 1B1v0"
                  " 1F4v1 1B2v0 1F5v2 1B3v0     . 1B4v1     . 1B5v2     .")

TWO_BW_4 = "\n".join([
    "step       0     1     2     3     4     5     6     7     8     9    10    11"
    "    12    13    14    15    16    17    18    19    20    21    22    23",
    "rank 0 0F0v0 0F1v0 0F2v0 0F3v0     .     .     . 0B0v0 0F4v0 0B1v0 0F5v0 0B2v0"
    " 0F6v1 0B3v0 0F7v1 0B4v0 0F8v1 0B5v0     . 0B6v1     . 0B7v1     . 0B8v1",
    "rank 1     . 1F0v0 1F1v0 1F2v0     .     . 1B0v0 1F3v0 1B1v0 1F4v0 1B2v0 1F5v0"
    " 1B3v0 1F6v1 1B4v0 1F7v1 1B5v0 1F8v1 1B6v1     . 1B7v1     . 1B8v1     .",
    "rank 2     .     . 2F0v0 2F1v0     . 2B0v0 2F2v0 2B1v0 2F3v0 2B2v0 2F4v0 2B3v0"
    " 2F5v0 2B4v0 2F6v1 2B5v0 2F7v1 2B6v1 2F8v1 2B7v1     . 2B8v1     .     .",
    "rank 3     .     .     . 3F0v0 3B0v0 3F1v0 3B1v0 3F2v0 3B2v0 3F3v0 3B3v0 3F4v0"
    " 3B4v0 3F5v0 3B5v0 3F6v1 3B6v1 3F7v1 3B7v1 3F8v1 3B8v1     .     .     .",
])


def test_golden_grids_with_versions() -> None:
    assert format_async_grid(build_async_schedule("pipedream", 2, 2, 2)) == PIPEDREAM_2
    assert format_async_grid(build_async_schedule("2bw", 2, 2, 3)) == TWO_BW_2
    assert format_async_grid(build_async_schedule("pipedream", 4, 2, 3)) == PIPEDREAM_4
    assert format_async_grid(build_async_schedule("2bw", 4, 3, 3)) == TWO_BW_4
    vsync = format_async_grid(build_async_schedule("pipedream-vsync", 4, 2, 3)).splitlines()
    assert vsync[2] == VSYNC_4_RANK_1


def test_grid_with_comm_labels_only_compute() -> None:
    lines = format_async_grid(build_async_schedule("2bw", 2, 1, 2), with_comm=True).splitlines()
    assert lines[1].split()[2:5] == ["0F0v0", "0SF0", "0RB0"]


@pytest.mark.parametrize("name", ASYNC)
@pytest.mark.parametrize("p, m, k", SIZES)
def test_every_async_schedule_validates(name: str, p: int, m: int, k: int) -> None:
    s = build_async_schedule(name, p, m, k)  # raises if invalid
    assert check_versions(s) == []
    assert s.stream == Stream(m, k) and sorted(s.order) == list(range(p))
    assert len(s.versions) == 2 * p * m * k  # one per forward and backward


@pytest.mark.parametrize("p, m, k", SIZES)
def test_pipedream_versions_stash_and_limit(p: int, m: int, k: int) -> None:
    """Stage s's forward of n uses the newest version: n - (P - s - 1) steps made so far."""
    s = build_async_schedule("pipedream", p, m, k)
    n_items = m * k
    for r in range(p):
        assert _forward_versions(s, r) == [max(0, n - (p - r - 1)) for n in range(n_items)]
        for n in range(n_items):
            assert s.version_of(r, Action(r, Kind.BACKWARD, n)) == _forward_versions(s, r)[n]
    assert gradient_delays(s) == {r: min(p - r - 1, n_items - 1) for r in range(p)}
    peaks = peak_versions(s)
    assert all(peaks[r] <= p - r for r in range(p))
    if n_items >= 2 * p - 1:  # stage 0 reaches its steady state (P - 1 warm-up forwards)
        assert peaks == {r: p - r for r in range(p)}


@pytest.mark.parametrize("p, m, k", SIZES)
def test_vertical_sync_uses_the_first_stage_version_everywhere(p: int, m: int, k: int) -> None:
    s = build_async_schedule("pipedream-vsync", p, m, k)
    first = [max(0, n - p + 1) for n in range(m * k)]
    assert all(_forward_versions(s, r) == first for r in range(p))
    assert max(peak_versions(s).values()) <= p
    assert gradient_delays(s) == {r: min(p - 1, m * k - 1) for r in range(p)}
    if m * k >= 2 * p - 1:  # steady state on every stage: P versions each
        assert peak_versions(s) == {r: p for r in range(p)}


@pytest.mark.parametrize("p, m, k", SIZES)
def test_2bw_versions_are_one_minibatch_behind_and_two_at_most(p: int, m: int, k: int) -> None:
    s = build_async_schedule("2bw", p, m, k)
    expected = [max(n // m - 1, 0) for n in range(m * k)]
    assert all(_forward_versions(s, r) == expected for r in range(p))
    assert max(peak_versions(s).values()) == (2 if k >= 2 else 1)


def test_2bw_update_rule_as_data() -> None:
    """W(t+1) = W(t) - lr * grad f(W(t-1)): the step making version t+1 applies mini-batch
    t's M gradients, computed at version t-1 (t = 0: at version 0)."""
    s = build_async_schedule("2bw", 4, 4, 5)
    for r in range(4):
        steps = s.updates[r]
        assert [(u.version, u.computed_at) for u in steps] == [(1, 0), (2, 0), (3, 1), (4, 2),
                                                                (5, 3)]
        assert [u.items for u in steps] == [tuple(range(4 * b, 4 * b + 4)) for b in range(5)]
        assert all(s.order[r][u.after] == Action(r, Kind.BACKWARD, u.items[-1]) for u in steps)
    assert str(s.updates[0][2]) == "v3 = v2 - lr*g(8-11 @ v1)"


def test_pipedream_update_rule_as_data() -> None:
    """A step after every backward; stage s's gradient is P - s - 1 steps old."""
    s = build_async_schedule("pipedream", 3, 2, 3)
    assert [(u.version, u.items, u.computed_at) for u in s.updates[0]] == [
        (1, (0,), 0), (2, (1,), 0), (3, (2,), 0), (4, (3,), 1), (5, (4,), 2), (6, (5,), 3)]
    assert [u.computed_at for u in s.updates[2]] == [0, 1, 2, 3, 4, 5]


def test_versions_alive_at_each_point_of_a_stage() -> None:
    s = build_async_schedule("pipedream", 2, 2, 2)
    # rank 0: 0F0 0SF0 0RB0 0F1 0SF1 0B0 | step v1 | 0RB1 0F2 ...: v0 stays for 0B1
    alive = versions_alive(s)[0]
    assert alive[:6] == [(0,)] * 6 and alive[6] == (0, 1)
    assert alive[-1] == (4,)  # after the last backward and its step only the newest is left


def test_2bw_needs_p_minus_1_microbatches() -> None:
    with pytest.raises(ScheduleError, match=r"P - 1 = 3 micro-batches per mini-batch for 4 "
                                            r"stages, got 2.*use --microbatches 3 or more"):
        build_async_schedule("2bw", 4, 2, 3)


def test_bad_stream_names_the_value() -> None:
    with pytest.raises(PipelineError, match=r"mini-batches \(0\) must be an integer >= 1"):
        build_async_schedule("pipedream", 2, 2, 0)
    with pytest.raises(ScheduleError, match="unknown asynchronous schedule 'zb'; valid: 2bw, "
                                            "pipedream, pipedream-vsync"):
        build_async_schedule("zb", 2, 2)


def test_flushed_stream_is_a_valid_schedule_of_k_minibatches() -> None:
    order = flushed_stream("1f1b", 3, Stream(2, 3))
    assert check_schedule(order, 3, 6) == []
    assert format_actions([a for a in order[2] if a.is_compute]) == (
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2F4 2B4 2F5 2B5")


@pytest.mark.parametrize("name", ASYNC)
def test_async_bubble_is_below_the_flushed_ones(name: str) -> None:
    """P = 4, M = 4, K = 3: one fill and drain for the stream instead of one per mini-batch."""
    bubbles = stream_bubbles(build_async_schedule(name, 4, 4, 3))
    assert bubbles["1f1b"] == pytest.approx(theoretical_bubble(4, 4))  # 3/7
    assert bubbles["gpipe"] == pytest.approx(theoretical_bubble(4, 4))
    assert bubbles[name] == pytest.approx(theoretical_bubble(4, 12))  # 3/15
    assert bubbles[name] < bubbles["1f1b"]


def test_one_minibatch_saves_no_flush() -> None:
    bubbles = stream_bubbles(build_async_schedule("pipedream", 4, 4, 1))
    assert bubbles["pipedream"] == pytest.approx(bubbles["1f1b"])


# -- what the trainer accepts ------------------------------------------------------------

@pytest.mark.parametrize("name", ASYNC)
def test_config_check_accepts_async_schedules(name: str) -> None:
    check_parts(load_config(None, {"train": {"parallel": "pipeline"},
                                   "pipeline": {"schedule": name}}))


def test_config_check_accepts_async_schedules_on_replicated_stages() -> None:
    for name in ("2bw", "pipedream"):
        check_parts(load_config(None, {"train": {"parallel": "hybrid", "world_size": 3},
                                       "pipeline": {"schedule": name, "replicas": [2, 1],
                                                    "stages": 2, "microbatches": 4}}))


@pytest.mark.parametrize("section,match", [
    ({"replicas": [3, 1], "stages": 2},
     r"pipeline.schedule = '2bw': 2bw with replicas 3,1 steps each stage once per round of "
     r"its replicas: micro-batches \(4\) must be a multiple of 3; try 3 or 6"),
    ({"replicas": [2], "schedule": "pipedream-vsync"},
     r"pipeline.schedule = 'pipedream-vsync': pipedream-vsync with replicated stages "
     r"\(replicas 2,2\) is not available: .*; use pipedream or 2bw"),
    ({"comm_threads": "sra"}, r"pipeline.comm_threads = 'sra' agrees a message order per flushed "
                              r"step and does not run '2bw'; use inline, per-message or sa"),
])
def test_config_check_refuses_what_streams_cannot_run(section: dict[str, object],
                                                      match: str) -> None:
    cfg = load_config(None, {"train": {"parallel": "hybrid"},
                             "pipeline": {"schedule": "2bw", "microbatches": 4, **section}})
    with pytest.raises(ConfigError, match=match) as info:
        check_parts(cfg)
    assert len(str(info.value).splitlines()) == 1


def test_build_schedule_refuses_async_names() -> None:
    """The flushed executor's entry point (`build_schedule`) cannot hand out an asynchronous
    order."""
    with pytest.raises(ScheduleError, match="'2bw' is an asynchronous schedule"):
        build_schedule("2bw", 4, 4)


def test_train_refuses_2bw_with_too_few_microbatches_in_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--parallel", "pipeline", "--stages", "4", "--microbatches", "2",
                 "--schedule", "2bw", "--model", "mlp"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("approxdist: error: 2bw needs at least P - 1 = 3 micro-batches")
    assert "--microbatches 3" in err and err.count("\n") == 1
