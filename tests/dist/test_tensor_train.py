"""`approxdist train --parallel tensor`: the trainer's tensor-parallel runs against one
process, resume per shard, a dead shard named, and bad input as one line.

The oracle is the trainer's own single-process run (`--parallel dp`, one rank) of the
same model, data and seed: every shard of every rank after the run must equal the
matching slice of its parameters. fp32 wires change only the order partial sums are
added in, so the bound is fp32 rounding grown over the run's steps (`ROUNDING`); on a
`tp x dp` mesh the replicas' gradient average adds one more such rounding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from approxdist.cli.main import main
from approxdist.config.loader import build_config, write_config
from approxdist.data import load_dataset
from approxdist.errors import LaunchError
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.models import build_model
from approxdist.train.checkpoint import NAME
from approxdist.train.evaluate import evaluate_run, run_config, whole_state
from tests.helpers.runs import full_and_resumed, rank_dies, train

#: fp32 rounding after the run's 12 SGD steps: a few ulps of the weights' scale per step
ROUNDING = 2e-5

FAST = ["--set", "model.hidden=32", "--set", "train.progress=false"]


def _sections(model: str, world: int, tp: int, parallel: str = "tensor",
              **extra: dict[str, Any]) -> dict[str, Any]:
    shape = [12] if model == "mlp" else [3, 8, 8]
    sections: dict[str, Any] = {
        "train": {"parallel": parallel, "world_size": world, "progress": False, "seed": 3},
        "data": {"dataset": "synthetic", "synthetic_shape": shape, "synthetic_samples": 96,
                 "batch_size": 16, "augment": False},
        "model": {"name": model, "hidden": 32, "depth": 3, "width": 4},
        "optim": {"lr": 0.05, "schedule": "step", "step_size": 7, "gamma": 0.5},
        "tp": {"size": tp},
    }
    for name, table in extra.items():
        sections.setdefault(name, {}).update(table)
    return sections


def _one_process(sections: dict[str, Any]) -> dict[str, Any]:
    sec = {k: dict(v) for k, v in sections.items()}
    sec["train"].update(parallel="dp", world_size=1)
    for split in ("tp", "pipeline"):
        sec.pop(split, None)
    return sec


def _shards(ctx: DistContext, sections: dict[str, Any], root: str) -> dict[str, Any]:
    """This rank's parameters after 2 epochs, and where each split one lies in the whole."""
    from approxdist.config.loader import build_config
    from approxdist.train.build import build_trainer
    sec = {k: dict(v) for k, v in sections.items()}
    sec["train"]["epochs"] = 2
    trainer = build_trainer(build_config(sec), ctx, Path(root), False)
    trainer.run()
    engine = trainer.engine
    state = {k.removeprefix("module."): v.clone() for k, v in engine.module.state_dict().items()}
    where = {k.removeprefix("module."): v for k, v in engine.split.tp.shard_index().items()}
    return {"state": state, "where": {k: v for k, v in where.items() if k in state}}


def _whole(ctx: DistContext, sections: dict[str, Any], root: str) -> dict[str, torch.Tensor]:
    return train(ctx, sections, Path(root), 2)


def _part(full: torch.Tensor, where: tuple[int, Any] | None) -> torch.Tensor:
    if where is None:
        return full
    dim, index = where
    return full.index_select(dim, torch.as_tensor(index)) if not isinstance(index, slice) \
        else full.narrow(dim, index.start, index.stop - index.start)


def _assert_shards_equal_whole(ranks: list[dict[str, Any]], whole: dict[str, torch.Tensor]) -> None:
    assert whole.keys() == {k for r in ranks for k in r["state"]}  # every stage's, together
    for rank, got in enumerate(ranks):
        for name, value in got["state"].items():
            want = _part(whole[name], got["where"].get(name))
            assert value.shape == want.shape, (rank, name)
            err = float((value.float() - want.float()).abs().max())
            assert err <= ROUNDING * max(1.0, float(want.abs().max())), (rank, name, err)


@pytest.mark.parametrize(("model", "world", "tp", "parallel"), [
    ("mlp", 4, 2, "tensor"), ("resnet20", 2, 2, "tensor"), ("mlp", 4, 2, "pipeline")])
def test_every_shard_of_a_run_equals_one_process(tmp_path: Path, model: str, world: int,
                                                 tp: int, parallel: str) -> None:
    """mlp on a tp=2 x dp=2 mesh (column-row pairs; the replicas average their shards'
    gradients); ResNet-20 split by channel (batch norms per channel, the shortcut's
    channels selected) on tp=2; mlp on a pp=2 x tp=2 mesh (each stage split over two
    ranks, 4 micro-batches a step: each tp lane a pipeline of its own)."""
    extra = {"pipeline": {"stages": 2, "microbatches": 4}} if parallel == "pipeline" else {}
    sections = _sections(model, world, tp, parallel, **extra)
    ranks = run_on_ranks(_shards, world, sections, str(tmp_path / "tp"), timeout_s=240)
    whole = run_on_ranks(_whole, 1, _one_process(sections), str(tmp_path / "one"))[0]
    assert any(r["where"] for r in ranks)  # something was split
    whole = {k.removeprefix("module."): v for k, v in whole.items()}
    _assert_shards_equal_whole(ranks, whole)
    if parallel == "tensor":
        _assert_merged_equals_whole(tmp_path / "tp", sections, whole, 4 if model == "mlp" else 0)


def _assert_merged_equals_whole(run_dir: Path, sections: dict[str, Any],
                                whole: dict[str, torch.Tensor], tp: int) -> None:
    """`approxdist evaluate`'s merge of the run's shard checkpoints is the one-process
    model; scored in one process and resharded over `tp` ranks, the same figures."""
    sec = {k: dict(v) for k, v in sections.items()}
    sec["train"]["epochs"] = 2
    write_config(build_config(sec), run_dir / "config.toml")
    cfg = run_config(run_dir)
    data = load_dataset(cfg.data)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    merged, saved_tp, epoch, plan = whole_state(run_dir, model)
    assert (saved_tp, epoch, bool(plan)) == (2, 2, True)
    assert merged.keys() == whole.keys()
    for name, want in whole.items():
        err = float((merged[name].float() - want.float()).abs().max())
        assert err <= ROUNDING * max(1.0, float(want.abs().max())), (name, err)
    if tp:
        one, split = evaluate_run(run_dir, 1), evaluate_run(run_dir, tp)
        assert one.accuracy == split.accuracy
        assert abs(one.loss - split.loss) <= ROUNDING * max(1.0, one.loss)


def test_resume_with_lossy_wires_and_feedback_is_bit_exact(tmp_path: Path) -> None:
    """bf16 on both tp wires with error feedback, and bf16 gradients between the replicas:
    1 epoch, then a resume to 3, equals 3 straight on every rank, bit for bit (each
    shard's weights, optimiser state and wire residuals are in its own checkpoint)."""
    lossy = {"codec": "bf16", "error_feedback": True}
    sections = _sections("mlp", 4, 2, wire={"tp_fwd": lossy, "tp_bwd": lossy,
                                            "grad": {"codec": "bf16"}})
    ranks = run_on_ranks(full_and_resumed, 4, sections, str(tmp_path), timeout_s=240)
    for rank, (full, resumed) in enumerate(ranks):
        for name, ref in full.items():
            assert torch.equal(resumed[name], ref), (rank, name)
    assert (tmp_path / "part" / "shard1" / "checkpoint.pt").exists()


def test_a_dead_shard_is_named(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:
        run_on_ranks(rank_dies, 4, _sections("mlp", 4, 2), str(tmp_path), 3, timeout_s=90,
                     comm_timeout_s=10)
    text = str(info.value)
    assert "rank 3 failed" in text and "lost rank 3" in text, text


@pytest.mark.parametrize(("args", "message"), [
    (["--tp", "3", "--model", "mlp"], "tp size 3 does not divide the 32 output features"),
    (["--tp", "2", "--world-size", "3", "--model", "mlp"], "tp.size = 2 does not divide the "
                                                           "world of 3 ranks"),
    (["--tp", "2", "--model", "mlp", "--tp-plan", "9=colwise"],
     "tp plan names layer '9', which the model does not have"),
    (["--tp", "2", "--model", "mlp", "--tp-plan", "0=diagonal"], "'diagonal'"),
    (["--tp", "2", "--model", "mlp", "--tp-plan", "0=colwise,2"], "'2' is not 'layer.path=style'"),
    (["--tp", "2", "--model", "mlp", "--tp-plan", "/nonexistent/plan"],
     "cannot be read (No such file or directory); pass a file"),
    (["--mesh", "tp=2,pp=2", "--model", "mlp"], "pp"),
    (["--tp", "2", "--model", "mlp", "--stages", "2"], "--stages"),
    (["--tp", "2", "--model", "mlp", "--codec", "adaprec:fp32,bf16"],
     "a tensor-parallel run has one with replicas: use --world-size 4 with --tp 2"),
    (["--tp", "2", "--model", "mlp", "--fwd-codec", "nope"], "nope"),
    (["--tp", "2", "--model", "mlp", "--set", "tp.sequence_parallel=true"],
     "but model 'mlp' has none; use a gpt model"),
    (["--tp", "2", "--model", "gpt-tiny", "--dataset", "stdlib-text", "--tp-plan",
      "1.mlp.0=colwise,1.mlp.2=rowwise", "--set", "tp.sequence_parallel=true"],
     "uses the model's own sequence-parallel plan, but tp.plan"),
    (["--tp", "2", "--model", "gpt-tiny", "--dataset", "stdlib-text", "--set", "data.seq_len=7",
      "--set", "tp.sequence_parallel=true"],
     "tp size 2 does not divide the sequence length 7 of stdlib-text; use a length it divides "
     "(e.g. --set data.seq_len=8)"),
    (["--tp", "0", "--model", "mlp"], "tp.size = 0 must be >= 1 ranks per layer"),
    (["--tp", "3", "--model", "gpt-tiny", "--dataset", "stdlib-text"],
     "tp size 3 does not divide the 4 attention heads of 1.attn; use a tp size among 1, 2, 4"),
])
def test_bad_tensor_input_is_one_line_exit_2(args: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--parallel", "tensor", *args, *FAST]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(("args", "message"), [
    (["--parallel", "pipeline", "--stages", "2", "--tp", "3"],
     "tp size 3 does not divide the 32 output features"),
    (["--parallel", "pipeline", "--mesh", "pp=2,tp=2", "--world-size", "3"],
     "world_size = 3"),
    (["--parallel", "hybrid", "--stages", "2", "--replicas", "2", "--tp", "2",
      "--set", "tp.algorithm=fastest"], "tp.algorithm = 'fastest' is not one of"),
    (["--parallel", "dp", "--tp", "2"], "--tp sets tp.size, which --parallel dp does not use"),
])
def test_bad_split_stage_input_is_one_line_exit_2(args: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *args, "--model", "mlp", *FAST]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_resume_at_another_tp_size_is_one_line_exit_2(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.toml").write_text('[train]\nparallel = "tensor"\nworld_size = 2\n'
                                          '[tp]\nsize = 2\n[model]\nname = "mlp"\n')
    assert main(["train", "--resume", str(tmp_path), "--tp", "4", "--world-size", "4"]) == 2
    err = capsys.readouterr().err
    assert "hold the layers split over tp.size = 2 rank(s), not 4; resume with --tp 2" in err
    assert len(err.strip().splitlines()) == 1


def test_resume_checks_every_shards_checkpoint_first(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A tp run keeps one checkpoint per shard; `--resume` finds them before it starts a
    worker, and a missing one is one line naming it (the run left as it was)."""
    run = tmp_path / "run"
    assert main(["train", "--parallel", "tensor", "--tp", "2", "--model", "mlp", "--epochs", "1",
                 "--out", str(run), *FAST]) == 0
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob(NAME)) == \
        [f"shard0/{NAME}", f"shard1/{NAME}"]
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "2", "--check"]) == 0
    assert "check passed" in capsys.readouterr().out
    (run / "shard1" / NAME).unlink()
    config = (run / "config.toml").read_bytes()
    assert main(["train", "--resume", str(run), "--epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'shard1' / NAME} is missing while the other checkpoints are there " \
           f"(epoch 1)" in err and len(err.strip().splitlines()) == 1, err
    assert (run / "config.toml").read_bytes() == config
