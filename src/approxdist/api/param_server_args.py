"""`approxdist.ParameterServer`'s keyword arguments checked and turned into the parts the
parameter-server layer takes: roles on the group's ranks, the wire formats, checked
factories (one `ConfigError` line each)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from approxdist.comm.channel import get_channel
from approxdist.comm.codecs import get_codec
from approxdist.comm.compressors import is_compressor
from approxdist.comm.netem import parse_link
from approxdist.errors import ConfigError, SpecError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, check_ranks
from approxdist.param_server.modes import PSMode, parse_mode
from approxdist.param_server.node import (
    OptimizerFactory,
    Scheduler,
    SchedulerFactory,
    check_backend,
)
from approxdist.param_server.roles import Roles
from approxdist.param_server.wire import WireFormats


def wire_formats(push_codec: str, pull_codec: str, push_channel: str,
                 pull_channel: str) -> WireFormats:
    """The codecs (a compressor on pushes) and channels of pushes and pulls, a bad spec
    named by its argument."""
    pushed = channel("push_channel", push_channel)
    pulled = channel("pull_channel", pull_channel)
    spec(get_codec, "pull_codec", pull_codec)
    if not is_compressor(push_codec):
        spec(get_codec, "push_codec", push_codec)
    return spec(lambda s: WireFormats.build(s, pull_codec, pushed, pulled), "push_codec",
                push_codec)


def link_shaping(link: str) -> Any:
    return spec(parse_link, "link", link)


def check_arguments(ctx: DistContext, model: nn.Module, optimizer: object, steps: object,
                     scheduler: object) -> None:
    if not ctx.distributed:
        raise ConfigError("approxdist.ParameterServer needs torch.distributed: call "
                          "dist.init_process_group(...) on every rank first (e.g. under "
                          "torchrun), one rank per server and per worker")
    if not callable(optimizer):
        raise ConfigError(f"optimizer={optimizer!r} must be a function of a server's "
                          f"parameters, e.g. optimizer=lambda params: "
                          f"torch.optim.SGD(params, lr=0.1)")
    if scheduler is not None and not callable(scheduler):
        raise ConfigError(f"scheduler={scheduler!r} must be a function of a server's "
                          f"optimizer, e.g. scheduler=lambda opt: "
                          f"torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=100)")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps={steps!r} must be the number of mini-batches each worker "
                          f"steps per round (>= 1), e.g. steps=len(batches)")
    if not any(True for _ in model.parameters()):
        raise ConfigError(f"the model ({type(model).__name__}) has no parameters for the "
                          f"servers to hold")


def placed(ctx: DistContext, group: Group, servers: int | Sequence[int],
           workers: int | Sequence[int] | None, mode: str) -> tuple[Roles, PSMode]:
    """The roles on `group` and the mode over them (one the backend can run)."""
    roles = roles_of(servers, workers, group, ctx.world_size)
    ps_mode = parse_mode(mode, roles.workers, name="mode")
    check_backend(ps_mode.spec, ps_mode.any_source, ctx.backend, name="mode")
    return roles, ps_mode


def check_mode_options(mode: PSMode, spec: str, *, staleness_lr: bool,
                       tolerate_worker_loss: bool) -> None:
    """The options `mode` (`spec` as given) cannot take, refused in one line."""
    if staleness_lr and mode.kind in ("sync", "backup"):
        raise ConfigError(f"staleness_lr=True divides the learning rate by a gradient's "
                          f"staleness, which mode={spec!r} keeps at 0; drop it or use "
                          f"mode='async' or 'ssp:<s>'")
    if tolerate_worker_loss and mode.kind == "sync":
        raise ConfigError("tolerate_worker_loss=True with mode='sync': every step waits "
                          "for a gradient from every worker, so a dead worker must end "
                          "the run; use mode='async', 'ssp:<s>' or 'backup:<b>'")


def roles_of(servers: int | Sequence[int], workers: int | Sequence[int] | None, group: Group,
           world: int) -> Roles:
    """Servers then workers as global ranks of `group`: counts take its members in order."""
    members, n = group.ranks, group.size
    if isinstance(servers, int):
        if not 1 <= servers < n:
            raise ConfigError(f"servers={servers} must be >= 1 and leave at least one of the "
                              f"{n} ranks for the workers; e.g. servers=1")
        held = members[:servers]
    else:
        held = check_ranks(servers, world, f"servers={list(servers)}")
    rest = tuple(r for r in members if r not in held)
    if workers is None or isinstance(workers, int):
        if workers is not None and workers != len(rest):
            raise ConfigError(f"servers={servers} and workers={workers} make "
                              f"{len(held) + workers} rank(s) but the group has {n}; use "
                              f"workers={len(rest)} (or leave it out)")
        computing = rest
    else:
        computing = check_ranks(workers, world, f"workers={list(workers)}")
    both = sorted(set(held) & set(computing))
    if both:
        raise ConfigError(f"servers={list(held)} and workers={list(computing)} both name "
                          f"rank(s) {both}; give each rank one role")
    outside = sorted(set(held + computing) - set(members))
    left = sorted(set(members) - set(held + computing))
    if outside or left or not computing:
        why = (f"name rank(s) {outside} outside the group {list(members)}" if outside else
               f"leave rank(s) {left} of the group without a role" if left else
               "leave no rank for the workers")
        raise ConfigError(f"servers={list(held)} and workers={list(computing)} {why}; name "
                          f"every rank of the group once (or pass group= of the ranks used)")
    return Roles(len(held), len(computing), tuple(held) + tuple(computing))


def spec(parse: Callable[[str], Any], name: str, value: str) -> Any:
    """`parse(value)`, with a bad spec's message naming the argument."""
    if name == "link" and not value:
        return None
    try:
        return parse(value)
    except SpecError as exc:
        raise ConfigError(f"{name}={value!r}: {exc}") from exc


def channel(name: str, value: str) -> Any:
    return None if value in ("", "none") else spec(get_channel, name, value)


def checked(factory: OptimizerFactory) -> OptimizerFactory:
    """`factory`, refusing what is not an optimiser."""
    def make(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        opt = factory(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise ConfigError(f"optimizer= returned {type(opt).__name__}, not a "
                              f"torch.optim.Optimizer; e.g. optimizer=lambda params: "
                              f"torch.optim.SGD(params, lr=0.1)")
        return opt
    return make


def stepping(factory: SchedulerFactory) -> SchedulerFactory:
    """`factory`, refusing what has no `step()`."""
    def make(optimizer: torch.optim.Optimizer) -> Scheduler:
        made = factory(optimizer)
        if not callable(getattr(made, "step", None)):
            raise ConfigError(f"scheduler= returned {type(made).__name__}, which has no "
                              f"step(); return a learning-rate scheduler of the optimizer "
                              f"it is given, e.g. scheduler=lambda opt: "
                              f"torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=100)")
        return made
    return make
