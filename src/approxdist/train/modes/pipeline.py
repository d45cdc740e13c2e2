"""The records of pipeline and hybrid training (seeds 000, 002): the model cut into `pp`
stages, each on one rank (pipeline) or replicated over `dp` ranks (hybrid)."""

from __future__ import annotations

from torch import nn

from approxdist.config.schema import Config
from approxdist.data import TensorDataset
from approxdist.errors import ConfigError
from approxdist.pipeline.runtime import check_run
from approxdist.pipeline.schedule import async_schedule_names
from approxdist.pipeline.split_check import check_splittable
from approxdist.planner.kinds import plan_kind
from approxdist.topology import Mesh
from approxdist.train.engines.pipeline import build_pipeline
from approxdist.train.engines.tp_split import check_split
from approxdist.train.mode import Mode, Sections, given_mesh, implied_by_mesh, modes, register
from approxdist.train.parts import check_dp, check_grad_shapes, check_pipeline, check_tp, check_wire

#: a stage split over `tp` ranks (`--tp`, `--mesh pp=2,tp=2`): the split's keys
TP_KEYS = ("tp.*", "wire.tp_fwd.*", "wire.tp_bwd.*")


def _preflight(cfg: Config, model: nn.Module, data: TensorDataset) -> None:
    check_run(cfg.pipeline, len(list(model.children())), cfg.data.batch_size)
    check_splittable(cfg.pipeline, model, data.train_x[:2])
    check_split(cfg, model)


def _hybrid_preflight(cfg: Config, model: nn.Module, data: TensorDataset) -> None:
    """A pipeline's checks, and every parameter a compressor on the replicas' gradient wire
    cannot take (PowerSGD on a bias), named with the rule that would exclude it; a stage
    keeps the model's parameter names, so the whole model is checked."""
    _preflight(cfg, model, data)
    check_grad_shapes(cfg, model)


def _streamed(cfg: Config) -> str | None:
    """An asynchronous schedule fixes an epoch's steps when its stream starts."""
    if cfg.pipeline.schedule in async_schedule_names():
        return f"the asynchronous schedule {cfg.pipeline.schedule!r}"
    return None


def _stage_mesh(mode: str, cfg: Config) -> Mesh:
    p = cfg.pipeline
    given = given_mesh(cfg, modes().get(mode))
    if given is not None and p.placement:
        return Mesh(given.axes, tuple(p.placement))
    return given or Mesh.stages(p.stages, p.replica_counts, p.placement or None, cfg.tp.size)


def _check_pipeline(cfg: Config) -> None:
    check_pipeline(cfg.pipeline)
    for name in ("fwd", "bwd"):
        check_wire(cfg, name)
    if cfg.tp.size > 1:
        check_tp(cfg)


def _tp_of(mesh: Mesh) -> Sections:
    return {"tp": {"size": mesh.extent("tp")}} if "tp" in mesh.names else {}


def _pipeline_implied(sections: Sections) -> Sections:
    """One rank per stage (`tp` ranks with `--tp`): `--stages` or `--world-size` sets both."""
    sections = implied_by_mesh(sections, lambda mesh: {
        "train": {"world_size": mesh.world_size}, "pipeline": {"stages": mesh.num_stages},
        **_tp_of(mesh)})
    train, pipe = sections.setdefault("train", {}), sections.setdefault("pipeline", {})
    tp = int(sections.get("tp", {}).get("size", 1))
    if "stages" in pipe and "world_size" not in train:
        train["world_size"] = pipe["stages"] * tp
    elif "world_size" in train and "stages" not in pipe:
        pipe["stages"] = max(1, train["world_size"] // tp)
    return sections


PIPELINE = register(Mode(
    name="pipeline", help="pipeline parallelism: the model cut into stages, one rank each "
                          "(docs/pipeline.md)",
    axes=frozenset({"pp", "tp"}), mesh=lambda cfg: _stage_mesh("pipeline", cfg),
    engine=build_pipeline,
    options=("comm.*", "pipeline.*", "-pipeline.replicas", "wire.fwd.*", "wire.bwd.*", *TP_KEYS),
    implied=_pipeline_implied, check=_check_pipeline, preflight=_preflight,
    batch_share=lambda cfg: None, fixed_steps=_streamed,
    plan=plan_kind("pipeline")))


def _hybrid_implied(sections: Sections) -> Sections:
    """One rank per stage replica (`tp` ranks with `--tp`): the world is the replica counts'
    sum (times tp)."""
    sections = implied_by_mesh(sections, lambda mesh: {
        "train": {"world_size": mesh.world_size},
        "pipeline": {"stages": mesh.num_stages, "replicas": list(mesh.replicas)},
        **_tp_of(mesh)})
    train, pipe = sections.setdefault("train", {}), sections.setdefault("pipeline", {})
    counts, stages = pipe.get("replicas"), pipe.get("stages")
    tp = int(sections.get("tp", {}).get("size", 1))
    if "world_size" not in train and stages and counts:
        train["world_size"] = sum(counts * stages if len(counts) == 1 else counts) * tp
    return sections


def _check_hybrid(cfg: Config) -> None:
    if cfg.dp.reducer != "approxdist" or cfg.dp.early_forward:
        raise ConfigError("--parallel hybrid: a replicated stage sums its gradients during "
                          "the last micro-batch's backward and steps after the flush, which "
                          "the plain engine and early forward cannot; drop --dp-reducer plain "
                          "and --early-forward")
    if cfg.wire.grad.adaptive and cfg.pipeline.schedule in async_schedule_names():
        raise ConfigError(f"wire.grad.codec = {cfg.wire.grad.codec!r}: AdaPrec speculates from "
                          f"snapshots of every stage between steps, and the asynchronous "
                          f"schedule {cfg.pipeline.schedule!r} keeps micro-batches in flight "
                          f"across steps; use a flushed schedule (gpipe, 1f1b)")
    check_dp(cfg)
    check_wire(cfg, "grad")
    _check_pipeline(cfg)


HYBRID = register(Mode(
    name="hybrid", help="pipeline stages replicated with data parallelism (--stages, "
                        "--replicas; docs/hybrid.md)",
    axes=frozenset({"pp", "dp", "tp"}), mesh=lambda cfg: _stage_mesh("hybrid", cfg),
    engine=build_pipeline, implied=_hybrid_implied,
    options=("comm.*", "pipeline.*", "dp.*", "adaprec.*", "wire.grad.*", "wire.fwd.*",
             "wire.bwd.*", *TP_KEYS),
    check=_check_hybrid, preflight=_hybrid_preflight, batch_share=lambda cfg: None,
    fixed_steps=_streamed, plan=plan_kind("hybrid")))
