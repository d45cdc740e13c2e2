"""AdaPrec on 2 ranks: snapshot/restore is exact, the controller never corrupts training.

* a run that snapshots mid-epoch, speculates k steps in another codec, restores and goes
  on equals, bit for bit, a run that never speculated (fp32; a lossy codec with
  error-feedback residuals, speculating in top-k, whose phase parks the residuals; top-k,
  speculating in QSGD: the compressor's residual survives the undone speculation), on
  every rank — weights, optimiser state, residuals and compressor states;
* `adaprec:fp32,signsgd` (a compressor candidate, fp32's steps slowed as below) keeps fp32
  at every boundary, decided by signSGD's measured error, and equals plain fp32;
* `--codec adaprec:fp32,<poison>` (digits, mlp) with DEFAULT settings and fp32's steps
  made slow on purpose (`--straggler 0:60ms@fp32`), so that speed alone would pick the
  poison: its measured error on the update keeps it out at every boundary (`damaging`,
  decided by `error`), the run equals plain fp32 training bit for bit, and two runs
  decide identically; the decisions,
  predictions and overhead are in metrics.jsonl and summary.json; the winner's
  speculative steps become the run's (the engine trains each run step once: a run that
  retrained them, or went on from another state, would not equal plain training), and
  every rank takes rank 0's decisions; the decisions are in TensorBoard's event files too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from approxdist.config.loader import build_config
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.train.build import build_trainer
from approxdist.train.engines.data_parallel import DataParallelEngine
from approxdist.train.snapshot import Position, RunSnapshot
from approxdist.train.tensorboard import codec_bits
from tests.helpers.tensorboard import read_events

SECTIONS: dict[str, dict[str, Any]] = {
    "train": {"progress": False, "seed": 5, "world_size": 2, "epochs": 2},
    "data": {"dataset": "synthetic", "synthetic_shape": [12], "synthetic_samples": 96,
             "batch_size": 16, "augment": False},
    "model": {"name": "mlp", "hidden": 32, "depth": 2},
    "optim": {"lr": 0.05, "schedule": "cosine"},
    "dp": {"bucket_mb": 0.002},
}
POISON = "bits:s0e8m7"  # the sign dropped: every gradient value turns positive
#: a compressor candidate: 1 bit a value, the gradient's signs where its values are small
COMPRESSOR = "signsgd"


def _sections(**grad: Any) -> dict[str, dict[str, Any]]:
    """The run, its gradient wire's keys `grad`."""
    sec = {k: dict(v) for k, v in SECTIONS.items()}
    sec["wire"] = {"grad": dict(grad)}
    return sec


def _state(trainer: Any) -> dict[str, torch.Tensor]:
    engine = trainer.engine
    out = {f"model.{k}": v.clone() for k, v in engine.module.state_dict().items()}
    for i, st in engine.optimizer.state_dict()["state"].items():
        out[f"momentum.{i}"] = st["momentum_buffer"].clone()
    extra = engine.sync.get_extra_state()
    for k, v in extra["residuals"].items():
        out[f"residual.{k}"] = v.clone()
    for spec, states in extra["compressors"].items():
        for name, state in states.items():
            for key, v in state.items():
                out[f"{spec}.{name}.{key}"] = v.clone()
    return out


def _speculating(ctx: DistContext, root: Path, dp: dict[str, Any], at: int,
                 other: str = "table1") -> dict[str, Any]:
    """Train; before step `at` snapshot, train 4 steps in `other`, restore and go on."""
    trainer = build_trainer(build_config(_sections(**dp)), ctx, root, False)
    engine = trainer.engine
    assert isinstance(engine, DataParallelEngine)
    moved: list[bool] = []

    def hook(pos: Position) -> None:
        if pos.step != at:
            return
        snap = RunSnapshot.take(engine, pos)
        before = {k: v.clone() for k, v in engine.module.state_dict().items()}
        engine.set_wire("grad", other)
        trainer.train_steps(pos, 4)
        moved.append(any(not torch.equal(v, before[k])
                         for k, v in engine.module.state_dict().items()))
        assert snap.restore(engine) == pos
        engine.set_wire("grad", dp["codec"])

    trainer.step_hooks.append(hook)
    trainer.run()
    return {"state": _state(trainer), "moved": moved}


def _exactness(ctx: DistContext, root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ef = {"codec": "bits:s1e8m3", "error_feedback": True}
    for name, dp, other in (("fp32", {"codec": "fp32"}, "table1"), ("ef", ef, "topk:0.1"),
                            ("topk", {"codec": "topk:0.1"}, "qsgd:7")):
        plain = build_trainer(build_config(_sections(**dp)), ctx, Path(root) / f"{name}-p", False)
        plain.run()
        # step 4 of 6 per epoch is mid-epoch; 4 steps run into the next epoch
        spec = _speculating(ctx, Path(root) / f"{name}-s", dp, at=4, other=other)
        out[name] = {"plain": _state(plain), **spec}
    return out


ADAPREC: dict[str, dict[str, Any]] = {
    "train": {"progress": False, "seed": 1, "world_size": 2, "epochs": 2},
    "data": {"dataset": "digits", "batch_size": 64, "augment": False},
    "model": {"name": "mlp", "hidden": 64, "depth": 2},
    "optim": {"lr": 0.1},
    # the decision rule, the error budget and every guard at their defaults
    "adaprec": {"phase_steps": 10, "speculate_steps": 4, "points": 2, "overhead_budget": 1.0},
}
#: fp32's steps slowed on rank 0 (the other waits for it in the all-reduce): the poison
#: (half fp32's bytes) is the faster candidate by far at every boundary
SLOW_FP32 = "0:60ms@fp32"


def _adaprec(ctx: DistContext, root: str) -> dict[str, Any]:
    def train(name: str, codec: str) -> dict[str, Any]:
        sec = {k: dict(v) for k, v in ADAPREC.items()}
        sec["wire"] = {"grad": {"codec": codec}}
        if not codec.startswith("adaprec:"):  # the same held-out split, no controller
            sec["wire"]["grad"]["codec"] = f"adaprec:{codec}"
            sec["adaprec"] = {**sec["adaprec"], "phase_steps": 1000, "speculate_steps": 1,
                          "points": 1}
        if name == "a":  # its decisions in TensorBoard too
            sec["train"]["tensorboard"] = str(Path(root) / "tb-a")
        if name != "plain":
            sec["train"]["stragglers"] = [SLOW_FP32]
        trainer = build_trainer(build_config(sec), ctx, Path(root) / name, False)
        calls = [0]
        step = trainer.engine.train_step

        def counted(*args: Any) -> Any:
            calls[0] += 1
            return step(*args)

        trainer.engine.train_step = counted  # type: ignore[method-assign]
        summary = trainer.run()
        return {"summary": summary, "train_steps": calls[0],
                "weights": {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}}

    return {"plain": train("plain", "fp32"), "a": train("a", f"adaprec:fp32,{POISON}"),
            "b": train("b", f"adaprec:fp32,{POISON}"),
            "c": train("c", f"adaprec:fp32,{COMPRESSOR}")}


def _both(ctx: DistContext, root: str) -> dict[str, Any]:
    return {"exact": _exactness(ctx, root), "adaprec": _adaprec(ctx, root)}


def test_snapshot_and_controller(tmp_path: Path) -> None:
    ranks = run_on_ranks(_both, 2, str(tmp_path), timeout_s=300)
    for rank in ranks:
        for name in ("fp32", "ef", "topk"):
            case = rank["exact"][name]
            assert case["moved"] == [True]  # the speculation did change the model
            assert case["plain"].keys() == case["state"].keys()
            for k, v in case["plain"].items():
                assert torch.equal(case["state"][k], v), (name, k)
        assert any(k.startswith("residual.") for k in rank["exact"]["ef"]["state"])
        residuals = [v for k, v in rank["exact"]["topk"]["state"].items()
                     if k.startswith("topk:0.1.") and k.endswith(".residual")]
        assert residuals and all(v.any() for v in residuals)  # compressor state compared

    runs = ranks[0]["adaprec"]
    a, b, plain = runs["a"]["summary"]["adaprec"], runs["b"]["summary"]["adaprec"], \
        runs["plain"]["summary"]["adaprec"]
    assert plain["chosen"] == [[0, "fp32"]]  # no boundary: an ordinary fp32 run
    assert [c for _, c in a["chosen"]] == ["fp32"] * len(a["chosen"]) and len(a["chosen"]) > 2
    assert a["chosen"] == b["chosen"] and a["blacklist"] == b["blacklist"]
    for rank in ranks:  # never corrupted: the same weights as plain fp32, on every rank
        for k, v in runs["plain"]["weights"].items():
            assert torch.equal(rank["adaprec"]["a"]["weights"][k], v), k
            assert torch.equal(rank["adaprec"]["c"]["weights"][k], v), k
    c = runs["c"]["summary"]["adaprec"]  # the compressor: measured, kept out by its error
    assert [x for _, x in c["chosen"]] == ["fp32"] * len(c["chosen"]) and len(c["chosen"]) > 2
    c_bounds = [r for r in (json.loads(s) for s in (tmp_path / "c" / "metrics.jsonl")
                            .read_text().splitlines())
                if r.get("kind") == "adaprec" and "candidates" in r]  # the boundaries
    assert c_bounds[0]["step"] == 0  # the error rule decides from the first step
    assert c_bounds[0]["decided_by"] == "error", c_bounds  # not its speed
    for r in c_bounds:  # its signs are no update of the gradient's size: no better than none
        if COMPRESSOR in r["candidates"]:  # until its collapse blacklists it
            measured = r["candidates"][COMPRESSOR]
            assert measured["verdict"] in ("damaging", "collapsed"), r
            assert measured["error"] > 1.0 and measured["s_per_step"] > 0, r

    records = [json.loads(s) for s in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    decisions = [r for r in records if r.get("kind") == "adaprec"]
    scalars, texts = read_events(tmp_path / "tb-a")  # rank 0's, the same as metrics.jsonl
    assert [(s, t.split(" (")[0]) for s, t in texts["wire/grad/codec"]] \
        == [(r["step"], r["chosen"]) for r in decisions]
    assert scalars["wire/grad/bits_per_value"] \
        == [(r["step"], codec_bits(r["chosen"])) for r in decisions]
    assert scalars["adaprec/signal"] == [(r["step"], float(np.float32(r["signal"])))
                                         for r in decisions if "signal" in r]
    bounds = [r for r in records if r.get("kind") == "adaprec" and "candidates" in r]
    assert bounds and all(set(r["candidates"]) <= {"fp32", POISON} for r in bounds)
    assert POISON in bounds[0]["candidates"]
    for r in bounds:  # speed alone would pick the poison; its error on the update did not
        if POISON not in r["candidates"]:  # damaging at the last test: it rests (resting.py)
            assert POISON in r["resting"] and r["chosen"] == "fp32", r
            continue
        poison, exact = r["candidates"][POISON], r["candidates"]["fp32"]
        assert poison["s_per_step"] < exact["s_per_step"], r
        assert poison["verdict"] == "damaging" and poison["error"] > 1.0, r
        assert exact["error"] == 0.0 and r["decided_by"] == "error", r
        assert len(poison["points"]) == 1  # stopped after its first chunk: damaging already
    first = bounds[0]
    fp32 = first["candidates"]["fp32"]
    assert len(fp32["points"]) == 2 and fp32["s_per_step"] > 0
    assert fp32["prediction"] is None  # the default rule fits no curve
    blacklisted = [r["step"] for r in bounds if POISON in r["blacklist"]]
    if blacklisted:  # once out, never speculated again
        assert all(POISON not in r["candidates"] for r in bounds if r["step"] > blacklisted[0])
    assert a["speculation_s"] > 0 and a["fit_s"] == 0
    # the winner's speculative steps are the run's own, never trained again: every step
    # the engine trained is a run step or a speculative step that was not kept
    assert a["reused_steps"] > 0 and a["reused_steps"] == sum(r["reused_steps"] for r in bounds)
    speculated = sum(c["points"][-1][0] - r["step"] for r in bounds
                     for c in r["candidates"].values())
    steps = runs["a"]["summary"]["steps"]
    assert steps == runs["plain"]["summary"]["steps"]
    for rank in ranks:  # every rank took rank 0's decisions (only rank 0 fitted)
        assert rank["adaprec"]["a"]["train_steps"] == steps + speculated - a["reused_steps"]
        mine = rank["adaprec"]["a"]["summary"]["adaprec"]
        assert mine["chosen"] == a["chosen"] and mine["blacklist"] == a["blacklist"]


#: AdaPrec on the other engines with a gradient wire: a parameter server's pushes (1 server,
#: 3 workers, sync), a hybrid's replica all-reduce (stage 0 on 1 rank, stage 1 on 3) and the
#: replicas' all-reduce of a tensor-parallel run (tp 2 x dp 2: each shard's replicas)
OTHER_MODES: dict[str, dict[str, Any]] = {
    "ps": {"train": {"parallel": "ps", "world_size": 4},
           "ps": {"servers": 1, "workers": 3, "mode": "sync"}, "wire": "push"},
    "hybrid": {"train": {"parallel": "hybrid", "world_size": 4},
               "pipeline": {"stages": 2, "replicas": [1, 3], "microbatches": 4,
                            "schedule": "1f1b"}, "wire": "grad"},
    "tensor": {"train": {"parallel": "tensor", "world_size": 4}, "tp": {"size": 2},
               "wire": "grad"},
}


def _other_modes(ctx: DistContext, root: str) -> dict[str, Any]:
    """Per mode: plain fp32 (the same held-out split, no controller) and AdaPrec between
    fp32 and a sign-dropping poison."""
    out: dict[str, Any] = {}
    for mode, keys in OTHER_MODES.items():
        for name, codec in (("plain", "fp32"), ("a", f"fp32,{POISON}")):
            sec = {k: dict(v) for k, v in ADAPREC.items()}
            sec["train"].update(keys["train"], epochs=1)
            sec.update({k: v for k, v in keys.items() if k not in ("train", "wire")})
            sec["data"] = {**sec["data"], "batch_size": 48}
            sec["wire"] = {keys["wire"]: {"codec": f"adaprec:{codec}"}}
            if name == "plain":
                sec["adaprec"] = {**sec["adaprec"], "phase_steps": 1000, "speculate_steps": 1,
                                  "points": 1}
            trainer = build_trainer(build_config(sec), ctx, Path(root) / f"{mode}-{name}",
                                    False)
            summary = trainer.run()
            out[f"{mode}-{name}"] = {
                "adaprec": summary["adaprec"], "wires": trainer.engine.wires(),
                "weights": {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}}
    return out


def test_adaprec_drives_a_parameter_servers_pushes_and_the_replicas_of_hybrid_and_tp(
        tmp_path: Path) -> None:
    """Every speculation in the poison is rolled back exactly: the run equals plain fp32
    training bit for bit on every rank (a server's shard, every worker, every stage, every
    tensor-parallel shard)."""
    ranks = run_on_ranks(_other_modes, 4, str(tmp_path), timeout_s=300)
    for mode, keys in OTHER_MODES.items():
        decided = ranks[0][f"{mode}-a"]["adaprec"]
        assert len(decided["chosen"]) > 1, mode  # it did reach decisions
        assert [c for _, c in decided["chosen"]] == ["fp32"] * len(decided["chosen"]), mode
        for rank in ranks:
            assert rank[f"{mode}-a"]["adaprec"]["chosen"] == decided["chosen"], mode
            plain, a = rank[f"{mode}-plain"]["weights"], rank[f"{mode}-a"]["weights"]
            for k, v in plain.items():
                assert torch.equal(a[k], v), (mode, k)
            wires = rank[f"{mode}-a"]["wires"]
            if keys["wire"] in wires:  # the codec in force is the one decided
                assert wires[keys["wire"]] == "fp32", (mode, wires)
    for mode, keys in OTHER_MODES.items():  # the poison was tried, from step 0, and refused
        records = [json.loads(s) for s in (tmp_path / f"{mode}-a" / "metrics.jsonl")
                   .read_text().splitlines()]
        bounds = [r for r in records if r.get("kind") == "adaprec"]
        assert {r["wire"] for r in bounds} == {keys["wire"]}, mode
        assert bounds[0]["step"] == 0, mode
        assert bounds[0]["candidates"][POISON]["verdict"] == "damaging", (mode, bounds[0])
