"""Our codecs, compressors and algorithms as a torch DDP communication hook (seeds 001, 004).

    state, hook = approxdist.ddp_hook("powersgd:2", ddp_model, codec_rules=["*.bias=fp32"],
                                      link="bw=1gbit")
    ddp_model.register_comm_hook(state, hook)
    state = register_hook(ddp_model, algorithm="native", codec="fp16", link="bw=1gbit")

DDP calls the hook once per bucket, in bucket order, during backward; the hook hands the
bucket to one communication thread (its own process group and `Link`, so the emulated
link, byte counts and codecs apply exactly as in `DataParallel`) and returns a Future
that completes with the bucket's mean. With `fp32` it equals plain DDP.

Per-parameter codecs (`codec_rules`, the rules and named policies of `codec_rules.py`,
e.g. `["policy:seed004"]`): a DDP bucket is cut into runs of consecutive parameters that
share a codec, and each run is reduced in its own codec (DDP's padding travels with the
last run); a run whose codec is `fastest` gets the fastest codec for its size in
`codec_times`. With one codec the whole bucket is one message, as before.

Compressors (docs/compressors.md): a parameter whose codec is a compressor is a run of
its own, reduced by `compressed.reduce_compressed` exactly as `DataParallel` reduces it
(its messages through the thread's all-reduce or all-gather), with one compressor per
parameter name, so its residual, warm-start factor and random stream survive DDP's
bucket rebuild. The runs of the bucket's (first) all-reduce compatible compressor and
its fp32 runs form one exchange (`comm.compressors.together`): one all-reduce a round
for all of them, as torch's `powerSGD_hook` sends a bucket's P and Q; a bucket with no
such compressor sends its first all-gather compressor's runs and its fp32 runs in one
all-gather (`comm.compressors.gathered_together`). `start_step` sends
every bucket in exact fp32 for the first steps, as torch's `powerSGD_hook` does before
`start_powerSGD_iter`.

Error feedback (`comm.error_feedback`, the one `DataParallel` uses) keeps its residuals
per *parameter* (found through `GradBucket.parameters()`): each bucket layout gets its
own `ErrorFeedback`, and a new layout (DDP's bucket rebuild after the first iteration)
starts from the residuals saved under the same parameter names; `state_dict()` saves
them under those names.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations at run time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from approxdist.comm.codecs import Codec
from approxdist.comm.collectives import AllGather, Calibration
from approxdist.comm.compressors import Compressor, Where, get_compressor, is_compressor
from approxdist.comm.compressors.gathered_together import GatheredTogether
from approxdist.comm.compressors.spec import check_compressor
from approxdist.comm.compressors.together import Member, Together
from approxdist.comm.error_feedback import ErrorFeedback
from approxdist.data_parallel.checks import context_of
from approxdist.data_parallel.codec_rules import CodecRules, param_owners
from approxdist.data_parallel.codec_times import CodecTimes, load_times
from approxdist.data_parallel.compressed import GATHERS, check_shapes, reduce_compressed
from approxdist.data_parallel.threads import GIL_SWITCH_MS, CommPool, CommThread
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, world_group


class HookState:
    """The hook's thread, codecs per parameter and error feedback per bucket layout."""

    def __init__(self, ctx: DistContext, names: Mapping[int, str], algorithm: str = "auto",
                 codec: str = "fp32", link: str | None = None, error_feedback: bool = False,
                 calibration: Calibration | str | Path | None = None,
                 gil_switch_ms: float | None = GIL_SWITCH_MS, group: Group | None = None,
                 codec_rules: list[str] | Mapping[str, str] | None = None,
                 codec_times: CodecTimes | str | Path | None = None,
                 owners: Mapping[int, nn.Module] | None = None, start_step: int = 0,
                 seed: int = 0) -> None:
        """`group`: the ranks of DDP's process group (default the world); `owners`: id(param)
        -> the module registering it, for `type:` rules (`register_hook` passes them);
        `start_step`: steps sent in exact fp32 first; `seed`: the run's seed, which each
        parameter's compressor streams (shared or per-worker) derive from with its name
        (`Where`; torch's `powerSGD_hook` draws a parameter's first Q alike for
        `random_seed=Where(shape, name, seed).shared_seed`)."""
        group = group if group is not None else world_group(ctx)
        self.error_feedback = error_feedback
        self.names = dict(names)  # id(param) -> name
        self.rules = CodecRules.parse(codec_rules, codec, load_times(codec_times, algorithm,
                                                                     group.size))
        self.rules.validate(algorithm)
        self.algorithm = algorithm
        self.start_step, self.seed, self.worker = start_step, seed, group.rank
        #: steps begun (DDP's last bucket of a backward ends one)
        self.step = 0
        self.compressors: dict[str, Compressor] = {}
        owner = owners or {}
        self.codecs = {pid: self.rules.codec_for(name, owner.get(pid, nn.Module()))
                       for pid, name in self.names.items()}
        self.pool = CommPool(ctx, group, link, 1, algorithm, calibration, name="ddp",
                             gil_switch_ms=gil_switch_ms)
        self._feedback: dict[tuple[str, ...], ErrorFeedback] = {}
        self._saved: dict[str, torch.Tensor] = {}  # loaded residuals not yet in a layout
        self._saved_comps: dict[str, Mapping[str, torch.Tensor]] = {}  # not yet built

    def runs(self, numel: int, params: list[torch.Tensor]) -> list[tuple[int, int, str]]:
        """`(start, stop, codec)` of each run of consecutive parameters sharing a codec."""
        out: list[list[Any]] = []
        at = 0
        for p in params:
            spec = self.codecs.get(id(p), self.rules.default)
            if out and out[-1][2] == spec and not is_compressor(spec):
                out[-1][1] = at + p.numel()
            else:
                out.append([at, at + p.numel(), spec])
            at += p.numel()
        if not out:
            out.append([0, numel, self.rules.default])
        if is_compressor(out[-1][2]) and out[-1][1] < numel:
            out.append([out[-1][1], numel, "fp32"])  # a compressor takes its tensor only
        out[-1][1] = numel  # DDP's alignment padding travels with the last run
        return [(a, b, self.rules.resolve(spec, 4 * (b - a))) for a, b, spec in out]

    def reduce(self, flat: torch.Tensor, params: list[torch.Tensor], thread: CommThread,
               exact: bool = False) -> None:
        """Reduce one bucket (`exact`: all of it in fp32, before `start_step`)."""
        if exact:
            thread.reducer("fp32")(flat, op="mean")
            return
        starts = dict(zip(_offsets(params), params))
        runs = self.runs(flat.numel(), params)
        together = self._together(runs, starts, flat.device)
        if together is not None:  # the bucket's compressor and fp32 values at once
            reduce_compressed(together, flat, thread.reducer("fp32"), self._gather(together,
                                                                                  thread), "mean")
        for start, stop, codec in runs:
            if together is not None and _rides(codec, together.spec):
                continue
            part = flat[start:stop]
            if is_compressor(codec):
                comp = self._compressor(codec, starts[start], flat.device)
                reduce_compressed(comp, part, thread.reducer("fp32"), self._gather(comp, thread),
                                  "mean")
                continue
            reducer = thread.reducer(codec)
            if self.error_feedback and not reducer.codec.lossless:
                self._compensate(flat, params, reducer.codec, start, stop)
            reducer(part, op="mean")

    def _together(self, runs: list[tuple[int, int, str]], starts: Mapping[int, torch.Tensor],
                  device: torch.device) -> Together | GatheredTogether | None:
        """The runs of the bucket's first all-reduce compatible compressor (else its first
        all-gather one) and its fp32 runs as one exchange (`comm.compressors.together`,
        `comm.compressors.gathered_together`), or None if it has no compressor."""
        specs = [c for _, _, c in runs if is_compressor(c)]
        spec = next((c for c in specs if check_compressor(c) == "all-reduce"),
                    specs[0] if specs else None)
        if spec is None:
            return None
        members = [Member(self.names[id(starts[a])] if c == spec else f"fp32@{a}", a,
                          torch.Size((b - a,)) if c != spec else starts[a].shape,
                          self._compressor(c, starts[a], device) if c == spec else None)
                   for a, b, c in runs if _rides(c, spec)]
        if check_compressor(spec) == "all-gather":
            return GatheredTogether(members, device)
        return Together(members, device)

    def _gather(self, comp: Compressor, thread: CommThread) -> AllGather | None:
        """The thread's all-gather beside the run's algorithm, for a compressor that needs it."""
        return thread.gatherer(GATHERS[self.algorithm]) if comp.collective == "all-gather" \
            else None

    def _compensate(self, flat: torch.Tensor, params: list[torch.Tensor], codec: Codec,
                    start: int = 0, stop: int | None = None) -> None:
        """Compensate `flat[start:stop]` (all of it by default) against `codec`."""
        if sum(p.numel() for p in params) != flat.numel():
            return  # a bucket padded for alignment: compensate none of it
        part = flat[start:stop]
        self._feedback_for(params, flat.device).compensate(part, start, codec)

    def _feedback_for(self, params: list[torch.Tensor], device: torch.device) -> ErrorFeedback:
        names = tuple(self.names[id(p)] for p in params)
        ef = self._feedback.get(names)
        if ef is None:  # a new layout: carry over what earlier layouts kept for these names
            layout, at = [], 0
            for name, p in zip(names, params):
                layout.append((name, at, p.numel()))
                at += p.numel()
            ef = ErrorFeedback(layout, at, device)
            ef.load_state_dict(self.residuals())
            self._feedback[names] = ef
        return ef

    def _compressor(self, spec: str, param: torch.Tensor, device: torch.device) -> Compressor:
        """The compressor of `param` (by name: DDP may rebuild its buckets), built on first use."""
        name = self.names[id(param)]
        comp = self.compressors.get(name)
        if comp is None:
            comp = get_compressor(spec, Where(tuple(param.shape), name, self.seed, self.worker,
                                              device))
            if name in self._saved_comps:
                comp.load_state_dict(self._saved_comps.pop(name))
            self.compressors[name] = comp
        return comp

    def residuals(self) -> dict[str, torch.Tensor]:
        """The codecs' residuals per parameter name (the latest layout holding a name wins)."""
        out = dict(self._saved)
        for ef in self._feedback.values():
            out.update(ef.state_dict())
        return out

    def state_dict(self) -> dict[str, Any]:
        """The step count, the codecs' residuals and the compressors' states, per parameter
        name; `load_state_dict` continues bit for bit."""
        comps = {k: dict(v) for k, v in self._saved_comps.items()}
        comps.update({k: c.state_dict() for k, c in self.compressors.items()})
        return {"step": self.step, "residuals": self.residuals(), "compressors": comps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step = int(state.get("step", 0))
        self._saved = {k: v.clone().reshape(-1) for k, v in state.get("residuals", {}).items()}
        for ef in self._feedback.values():
            ef.load_state_dict(self._saved)
        self._saved_comps = dict(state.get("compressors", {}))
        for name, comp in self.compressors.items():
            if name in self._saved_comps:
                comp.load_state_dict(self._saved_comps.pop(name))

    def bytes_sent(self) -> int:
        return self.pool.bytes_sent()

    def close(self) -> None:
        self.pool.close()


def comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The hook DDP calls: reduce `bucket.buffer()` on the state's thread, return a Future."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    buf = bucket.buffer()
    params = list(bucket.parameters())
    exact = state.step < state.start_step  # read now: the job runs later, on the thread
    if bucket.is_last():
        state.step += 1

    def job(thread: CommThread) -> None:
        try:
            work = buf if buf.dtype == torch.float32 else buf.float()
            state.reduce(work, params, thread, exact)
            if work is not buf:
                buf.copy_(work)
            fut.set_result(buf)
        except BaseException as exc:  # noqa: BLE001 - delivered to DDP through the Future
            fut.set_exception(exc)  # type: ignore[arg-type]  # torch's stub is wrong

    state.pool.submit(job)
    return fut


Hook = Callable[[HookState, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def ddp_hook(codec: str, model: nn.Module, *, ctx: DistContext | None = None,
             **options: Any) -> tuple[HookState, Hook]:
    """`(state, hook)` for `ddp_model.register_comm_hook(state, hook)`: every bucket sent in
    `codec` (a codec or compressor spec; `codec_rules=` per parameter), through our
    `algorithm=`, `link=`, byte counts and traces (`HookState`'s keywords). `model`: the
    `DistributedDataParallel` or the module it wraps. A parameter a compressor cannot
    take (PowerSGD on a bias) is named here, with the rule that would exclude it."""
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    named = list(module.named_parameters())
    by_name = param_owners(module)
    state = HookState(ctx or context_of(module), {id(p): n for n, p in named}, codec=codec,
                      owners={id(p): by_name[n] for n, p in named}, **options)
    try:
        check_shapes(module, state.rules)
    except BaseException:
        state.close()
        raise
    return state, comm_hook


def register_hook(ddp: nn.parallel.DistributedDataParallel, ctx: DistContext,
                  **options: Any) -> HookState:
    """Build a `HookState` for `ddp`'s module and register `comm_hook` on `ddp`."""
    state, hook = ddp_hook(options.pop("codec", "fp32"), ddp, ctx=ctx, **options)
    ddp.register_comm_hook(state, hook)
    return state


def _rides(codec: str, spec: str) -> bool:
    """Whether a run in `codec` travels in the exchange of the compressor `spec`."""
    return codec in (spec, "fp32")


def _offsets(params: list[torch.Tensor]) -> list[int]:
    out, at = [], 0
    for p in params:
        out.append(at)
        at += p.numel()
    return out
