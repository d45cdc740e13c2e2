"""The parts a config names, checked against their registries: codecs, channels,
algorithms, schedules, AdaPrec candidates, parameter-server modes.

`config/` only knows its own values (ranges, fixed choices, syntax), so it need not
import the layers it configures. The mode records (`train/modes/`) check the sections
their mode reads with these functions; each error names the key, the value and what
would be valid, as the config's own checks do.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar

from torch import nn

from approxdist.adaptive.candidates import check_candidate_shapes, check_candidates
from approxdist.comm.channel import get_channel
from approxdist.comm.codecs import get_codec
from approxdist.comm.collectives import algorithm_names
from approxdist.comm.compressors import is_compressor
from approxdist.config.adaprec import candidates_of
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.schema import Config
from approxdist.config.wire import TRAFFIC
from approxdist.data_parallel.codec_rules import CodecRules, param_owners, unmatched
from approxdist.data_parallel.codec_times import CodecTimes
from approxdist.data_parallel.compressed import check_shapes
from approxdist.errors import ApproxDistError, ConfigError
from approxdist.param_server.compressed import check_push_compressor
from approxdist.param_server.modes import parse_mode
from approxdist.pipeline.schedule import async_schedule_names, schedule_names
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.topology.dealing import Dealing

T = TypeVar("T")


def check_tp(cfg: Config) -> None:
    """The `[tp]` section's all-reduce and the `tp_fwd` / `tp_bwd` wires (AdaPrec chooses
    only the replicas' gradient wire)."""
    if cfg.tp.algorithm not in algorithm_names():
        raise ConfigError(f"tp.algorithm = {cfg.tp.algorithm!r} is not one of: "
                          f"{', '.join(algorithm_names())}")
    for name in ("tp_fwd", "tp_bwd"):
        check_wire(cfg, name)


def check_ps(cfg: Config) -> None:
    """The `[ps]` section's mode, the push and pull wires, and `--tolerate-worker-loss`."""
    mode = parse_mode(cfg.ps.mode, cfg.ps.workers)
    if cfg.ps.staleness_lr and mode.kind in ("sync", "backup"):
        raise ConfigError(f"--staleness-lr divides the learning rate by a gradient's "
                          f"staleness, which --ps-mode {cfg.ps.mode} keeps at 0; drop it or "
                          f"use --ps-mode async or ssp:<s>")
    for name in ("push", "pull"):
        check_wire(cfg, name)
    _check_worker_loss(cfg)


def _check_worker_loss(cfg: Config) -> None:
    """`--tolerate-worker-loss`: only where the servers can go on without a worker (async,
    ssp, backup; not sync, whose every step needs every worker), and not with `--trace`,
    whose timelines are gathered from every rank at the end (docs/param_server.md,
    "Failures"). The launcher it needs is checked when the run starts
    (`train.build.survivable`)."""
    if not cfg.ps.tolerate_worker_loss:
        return
    mode = parse_mode(cfg.ps.mode, cfg.ps.workers)
    if mode.kind == "sync":
        raise ConfigError("--tolerate-worker-loss with --ps-mode sync: every step waits for a "
                          "gradient from every worker, so a dead worker must end the run; "
                          "drop the flag or use --ps-mode async, ssp:<s> or backup:<b>")
    if cfg.train.trace:
        raise ConfigError("--tolerate-worker-loss with --trace: the trace is gathered from "
                          "every rank at the end of the run, which a lost worker cannot "
                          "join; drop one of the two")


def check_dp(cfg: Config) -> None:
    """The `[dp]` section's algorithm (the approxdist reducer's)."""
    dp = cfg.dp
    if dp.reducer == "approxdist" and dp.algorithm not in algorithm_names():
        raise ConfigError(f"dp.algorithm = {dp.algorithm!r} is not one of: "
                          f"{', '.join(algorithm_names())}")


def check_wire(cfg: Config, name: str, per_parameter: bool = False) -> None:
    """Wire `name`'s codec (or AdaPrec's candidates), channel and, on a gradient wire, its
    per-parameter rules against the times file; `per_parameter`: the mode's gradient wire
    names a codec per parameter of the whole model (data parallelism's record says so), so
    AdaPrec may choose one per layer."""
    wire, key = cfg.wire.wire(name), f"wire.{name}"
    if wire.has_channel:
        named(f"{key}.channel", wire.channel, partial(get_channel, wire.channel))
    if name != "grad":
        if wire.rules or wire.times:
            raise ConfigError(f"{key}.{'rules' if wire.rules else 'times'}: per-parameter "
                              f"codec rules are for the data-parallel gradient wire (wire.grad);"
                              f" {TRAFFIC[name].split(',')[0]} travel one codec per shard; "
                              f"drop it")
        if is_compressor(wire.codec) and name == "push":
            named(f"{key}.codec", wire.codec,
                  partial(check_push_compressor, wire.codec, wire.has_channel))
            return
        if is_compressor(wire.codec):
            raise ConfigError(f"{key}.codec = {wire.codec!r}: compressors travel on gradient "
                              f"wires (wire.grad: dp and hybrid runs; wire.push: parameter-"
                              f"server pushes) and in approxdist.ddp_hook; "
                              f"{TRAFFIC[name].split(',')[0]} take a codec, e.g. bf16 or "
                              f"bits:s0e2+2m0 (docs/compressors.md)")
        if wire.adaptive:
            check_candidates((*(candidates_of(wire.codec) or ()), cfg.adaprec.first), (), None,
                             compressors=False)
        else:
            named(f"{key}.codec", wire.codec, partial(get_codec, wire.codec))
        return
    times = None
    if wire.times:
        times = named(f"{key}.times", wire.times,
                      partial(CodecTimes.load, wire.times, cfg.dp.algorithm))
    candidates = candidates_of(wire.codec)
    if candidates is not None:
        per_layer = cfg.adaprec.choose == "layer"
        if per_layer and not per_parameter:
            raise ConfigError(f"adaprec.choose = 'layer' names a codec per parameter of a "
                              f"data-parallel run; a {cfg.train.parallel} run's stages name "
                              f"their own: use adaprec.choose = 'all'")
        check_candidates((*candidates, cfg.adaprec.first), wire.rules, times, per_layer,
                         cfg.dp.algorithm)
    else:
        named(f"{key}.codec", wire.codec,
              partial(_check_rules, [], wire.codec, times, cfg.dp.algorithm))
    default = "fp32" if candidates is not None else wire.codec
    for rule in wire.rules:
        named(f"{key}.rules", rule, partial(_check_rules, [rule], default, times,
                                            cfg.dp.algorithm))


def check_rules_match(cfg: Config, model: nn.Module) -> None:
    """Each per-parameter rule of a data-parallel run's gradient wire names a parameter of
    `model` (the dp record's preflight: a pipeline stage's parameters are its own)."""
    for rule in unmatched(cfg.wire.grad.rules, model):
        names = list(param_owners(model))
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise ConfigError(f"wire.grad.rules = {rule!r} names no parameter of the model "
                          f"({cfg.model.name}: {shown}); write a glob that matches one "
                          f"(e.g. '*.weight') or type:Module[.attr] (e.g. type:Linear.bias)")


def _check_rules(rules: list[str], default: str, times: CodecTimes | None,
                 algorithm: str) -> None:
    CodecRules.parse(rules, default, times).validate(algorithm)


def check_pipeline(p: PipelineConfig) -> None:
    """The `[pipeline]` section's schedule. An asynchronous schedule
    (pipedream, pipedream-vsync, 2bw) runs with any communication-thread strategy but `sra`
    (whose agreed order is per flushed step); pipedream and 2bw also on replicated stages,
    with micro-batches a multiple of every replica count (docs/pipeline.md)."""
    names = schedule_names() + async_schedule_names()
    if p.schedule not in names:
        raise ConfigError(f"pipeline.schedule = {p.schedule!r} is not one of: {', '.join(names)}")
    if p.schedule in async_schedule_names():
        if max(p.replica_counts) > 1:
            named("pipeline.schedule", p.schedule, partial(
                build_async_schedule, p.schedule, p.stages, p.microbatches, 1,
                dealing=Dealing(p.replica_counts)))
        if p.comm_threads == "sra":
            raise ConfigError(f"pipeline.comm_threads = 'sra' agrees a message order per "
                              f"flushed step and does not run {p.schedule!r}; use inline, "
                              f"per-message or sa")


def named(key: str, value: str, build: Callable[[], T]) -> T:
    """Build a part once so a bad spec fails here, as one line naming the key."""
    try:
        return build()
    except ApproxDistError as exc:
        lines = str(exc).splitlines()
        rest = "; ".join(" ".join(line.split()) for line in lines[1:])
        raise ConfigError(f"{key} = {value!r}: {lines[0]}" + (f" {rest}" if rest else "")) from None


def check_grad_shapes(cfg: Config, model: nn.Module) -> None:
    """Every parameter a compressor on the gradient wire (or among AdaPrec's candidates)
    cannot take (PowerSGD on a bias), named with the rule that would exclude it."""
    grad = cfg.wire.grad
    if not grad.adaptive:
        check_shapes(model, CodecRules.parse(grad.rules, grad.codec))
    else:
        check_candidate_shapes(model, (*(candidates_of(grad.codec) or ()), cfg.adaprec.first),
                               grad.rules)
