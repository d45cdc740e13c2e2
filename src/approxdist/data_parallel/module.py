"""`DataParallel`: a DDP-like wrapper whose gradients cross our link layer (seeds 001 and 004).

    dp = DataParallel(model, algorithm="auto", codec="bf16", link="bw=1gbit")
    loss = F.cross_entropy(dp(x), y)
    optimizer.zero_grad(); loss.backward(); optimizer.step()   # grads are averaged

The engine averages over `group` (a `launch.group.Group`; the whole world by default), so
several engines can train independent replicas side by side on sub-groups, or a
hybrid run can average each pipeline stage over its own replicas.

What happens (docs/data_parallel.md has the whole story):
* `op="sum"` sums instead of averaging (for replicas whose losses are already weighted by
  their share of the whole batch: a hybrid pipeline's stage); `wait_in_backward=False`
  lets backward return as soon as every bucket is launched and `finish()` waits for
  them and writes the result into `.grad` (a pipeline stage sends its input gradient
  upstream meanwhile);
* construction: the members check they hold the same model (`checks.py`), the group's
  first rank's weights are broadcast, gradients are planned into buckets (`buckets.py`), each bucket's codec
  comes from `codec_rules` (`codec_rules.py`, seed 004's per-layer precision and named
  policies such as `policy:seed004`); a bucket whose codec is `fastest` gets the fastest
  codec for its size in `codec_times` (`codec_times.py`, seed 004's Fastest);
* backward: each parameter's hook copies its gradient into its bucket; full buckets go
  to the communication threads in order, fragmented (`reducer.py`, `threads.py`), while
  backward continues (seed 001's overlap); `loss.backward()` returns once every mean has
  been written back into `.grad` — unless `early_forward`, where each bucket's optimizer
  step runs on the thread that finished it and the next forward of each layer waits
  only for its own bucket (`early_forward.py`, `hooks.ForwardGate`);
* lossy codecs may keep error-feedback residuals (`comm.error_feedback`), which travel
  in `state_dict()` as extra state; so do the states of compressors (`codec="powersgd:2"`,
  `"topk:0.01"`, docs/compressors.md), per parameter; a codec switch keeps
  them all, parked while unused (`wire_state.py`);
* `recorder=` (docs/tracing.md): the threads record `sync` spans, the links their
  transfers, and the caller's thread a `wait` span wherever it blocks on them;
* `hold_freed_memory` (default True) keeps freed heap memory in the process
  (`launch.malloc`; process-wide): the engine frees autograd's gradient tensors into its
  buckets during backward, after which glibc trimmed the heap every step and each
  forward page-faulted its activations back in (~4 % of a ResNet-56 step);
* `gil_switch_ms` (default 0.5) lowers the interpreter's GIL switch interval so that the
  comm threads' Python never holds the training thread up for Python's default 5 ms
  (`threads.shorten_gil_switch`; process-wide; None leaves it).
Unused parameters: a parameter with no gradient on a rank contributes zeros (or its
existing `.grad`); with `find_unused_parameters=True` one small exact all-reduce per step
finds parameters no rank used, whose `.grad` then stays None (no weight decay, no
momentum step), exactly as single-process training. Frozen parameters
(`requires_grad=False` at construction) are never reduced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from approxdist.comm.collectives import Calibration
from approxdist.comm.update_error import Sums, UpdateError, merge
from approxdist.config.dp import check_sizes
from approxdist.data_parallel.buckets import ParamInfo, plan_buckets
from approxdist.data_parallel.buffer_stats import average_float_buffers
from approxdist.data_parallel.checks import check_same_model, context_of
from approxdist.data_parallel.codec_rules import CodecRules, param_owners
from approxdist.data_parallel.codec_times import CodecTimes, load_times
from approxdist.data_parallel.early_forward import StepApplier
from approxdist.data_parallel.hooks import BackwardHooks, ForwardGate
from approxdist.data_parallel.reducer import BucketState, Reducer
from approxdist.data_parallel.threads import GIL_SWITCH_MS, CommPool, CommThread
from approxdist.data_parallel.usage import UsageFlags
from approxdist.data_parallel.wire_state import Parked, collect, spread
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, world_group
from approxdist.launch.malloc import hold_freed_memory as keep_heap
from approxdist.trace.phases import OPTIMIZER, WAIT
from approxdist.trace.recorder import NULL_RECORDER, Recorder

MB = 1 << 20


class DataParallel(nn.Module):
    """Wraps `module`; gradients are averaged over `group` through approxdist's link layer."""

    def __init__(self, module: nn.Module, *, ctx: DistContext | None = None,
                 group: Group | None = None, algorithm: str = "auto", codec: str = "fp32",
                 codec_rules: Sequence[str] | Mapping[str, str] | None = None,
                 codec_times: CodecTimes | str | Path | None = None,
                 error_feedback: bool = False, link: str | None = None,
                 bucket_mb: float = 1.0, first_bucket_mb: float = 0.25, solo_mb: float = 1.0,
                 threads: int = 2,
                 chunk_kb: float = 0.0, overlap: bool = True, early_forward: bool = False,
                 optimizer: torch.optim.Optimizer | None = None,
                 find_unused_parameters: bool = False, broadcast: bool = True,
                 calibration: Calibration | str | Path | None = None,
                 gil_switch_ms: float | None = GIL_SWITCH_MS,
                 hold_freed_memory: bool = True, op: str = "mean", wait_in_backward: bool = True,
                 recorder: Recorder = NULL_RECORDER) -> None:
        super().__init__()
        check_sizes(bucket_mb, first_bucket_mb, chunk_kb, threads)
        if op not in ("mean", "sum"):
            raise ConfigError(f"DataParallel(op={op!r}): use 'mean' (average the replicas' "
                              f"gradients) or 'sum'")
        if early_forward and optimizer is None:
            raise ConfigError("early_forward=True needs the optimizer: DataParallel(model, "
                              "optimizer=opt, early_forward=True) applies its step per bucket")
        self.module = module
        self.ctx = ctx or context_of(module)
        self.group = group if group is not None else world_group(self.ctx)
        if hold_freed_memory:
            keep_heap()
        self.rules = CodecRules.parse(codec_rules, codec,
                                      load_times(codec_times, algorithm, self.group.size))
        self.rules.validate(algorithm)
        self._algorithm = algorithm
        check_same_model(module, self.group)
        self.early_forward = early_forward
        self.wait_in_backward = wait_in_backward
        self.recorder = recorder
        self._waited = 0.0  # time the caller's thread waited for communication (hooks, wait())
        self._byte_offset = 0
        self._sizes = (bucket_mb, first_bucket_mb, solo_mb, error_feedback)
        self._buckets = self._make_buckets(*self._sizes)
        self._parked = Parked()  # wire state no bucket uses now (`wire_state.py`)
        self._pool = CommPool(self.ctx, self.group, link, threads, algorithm, calibration,
                              rec=recorder, gil_switch_ms=gil_switch_ms)
        self._find_unused, self._overlap, self._op = find_unused_parameters, overlap, op
        self._chunk_numel = int(chunk_kb * 1024) // 4
        self._applier = StepApplier(optimizer, self._buckets) \
            if early_forward and optimizer is not None else None
        self._wire_buckets()
        self._gate = ForwardGate(module, self._buckets, recorder) if early_forward else None
        if broadcast:
            self.broadcast_parameters()

    def _make_buckets(self, bucket_mb: float, first_mb: float, solo_mb: float,
                      ef: bool) -> list[BucketState]:
        owners = param_owners(self.module)
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        infos = [ParamInfo(n, p.numel(), self.rules.codec_for(n, owners[n]), i)
                 for i, (n, p) in enumerate(named)]
        plans = [dataclasses.replace(p, codec=self.rules.resolve(p.codec, 4 * p.numel))
                 for p in plan_buckets(infos, int(bucket_mb * MB), int(first_mb * MB),
                                       int(solo_mb * MB))]
        return [BucketState(plan, [named[i][1] for i in plan.positions], self.ctx.device, ef,
                            worker=self.group.rank) for plan in plans]

    def _wire_buckets(self) -> None:
        """The reducer, usage flags and gradient hooks of the current buckets."""
        self._usage = UsageFlags(self._buckets, self._pool) if self._find_unused else None
        self._reducer = Reducer(self._buckets, self._pool, overlap=self._overlap,
                                chunk_numel=self._chunk_numel, on_reduced=self._on_reduced,
                                op=self._op)
        slots = [(p, b.plan.index, s) for b in self._buckets for s, p in enumerate(b.params)]
        self._hooks = BackwardHooks(slots, self._on_start, self._on_grad, self._on_end)

    def set_codecs(self, codec_rules: Sequence[str] | Mapping[str, str] | None = None,
                   codec: str = "fp32") -> None:
        """Switch the wire formats between steps (AdaPrec, docs/adaprec.md): new rules over
        the same `codec_times`, the buckets re-planned for them, the communication threads
        kept. Every member must switch to the same rules before its next backward; the
        error-feedback residuals and compressor states follow their parameters into the
        new buckets, or are parked until a switch back (`wire_state.py`)."""
        if self.early_forward:
            raise ConfigError("DataParallel.set_codecs: early forward applies the optimizer "
                              "step per bucket and cannot re-plan its buckets; drop "
                              "early_forward to switch codecs during training")
        rules = CodecRules.parse(codec_rules, codec, self.rules.times)
        rules.validate(self._algorithm)
        residuals = self.get_extra_state()  # also waits for every pending reduction
        self._hooks.remove()
        self.rules = rules
        self._buckets = self._make_buckets(*self._sizes)
        self._wire_buckets()
        self.set_extra_state(residuals)

    def update_error(self, measure: bool) -> Sums:
        """What the codecs did to this member's gradients while watched (AdaPrec's signal,
        `comm.update_error`): per parameter (||sent - exact||^2, ||exact||^2, size) summed
        over the steps (a compressor's: what this member contributed). `measure`: go on watching (from
        now, if not watching); False stops and forgets. A codec switch ends the watch."""
        self.wait()
        out = merge([b.probe.sums() for b in self._buckets if b.probe is not None])
        for b in self._buckets:
            if not measure:
                b.probe = None
            elif b.probe is None:
                b.probe = UpdateError(list(zip(b.plan.names, b.plan.offsets, b.plan.numels)),
                                      b.plan.numel, self.ctx.device)
        return out

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._hooks.in_backward = False  # a backward that raised never reached its end callback
        return self.module(*args, **kwargs)

    # -- the hooks ----------------------------------------------------------------------
    def _blocked(self, wait: Callable[[], None]) -> None:
        """Run `wait` on the caller's thread as a `wait` span, counted in `comm_seconds`."""
        t0 = time.perf_counter()
        with self.recorder.span(WAIT):
            wait()
        self._waited += time.perf_counter() - t0

    def _on_start(self) -> None:
        self._blocked(self._reducer.start)  # waits for the previous step's buckets
        if self._applier is not None:
            self._applier.snapshot()
        if self._usage is not None:
            self._usage.reset()

    def _on_grad(self, bucket: int, slot: int, param: nn.Parameter) -> None:
        assert param.grad is not None
        held = self._reducer.add(bucket, slot, param.grad)
        if self.early_forward:
            param.grad = None  # the engine owns the gradient; the update uses the bucket
        elif held.dtype == param.dtype:
            param.grad = held  # the mean lands in .grad in place: nothing to copy back

    def _on_end(self) -> None:
        used = self._reducer.finish()
        if self._usage is not None:
            self._usage.reduce(used, [[p.grad is not None for p in b.params]
                                      for b in self._buckets])
        if self.early_forward or not self.wait_in_backward:
            return
        self.finish()

    def finish(self) -> None:
        """Wait for this backward's reductions and put the results in `.grad` (what the end
        of backward does unless `wait_in_backward=False`)."""
        self._blocked(self._reducer.wait_all)
        for b in self._buckets:
            self._write_back(b)

    def _on_reduced(self, bucket: BucketState, thread: CommThread) -> None:
        used = self._usage.wait(bucket) if self._usage is not None else None
        if self._applier is not None:
            with self.recorder.span(OPTIMIZER, bucket=bucket.plan.index):
                self._applier.apply(bucket, used)

    def _write_back(self, b: BucketState) -> None:
        used = self._usage.wait(b) if self._usage is not None else None
        for slot, (p, view) in enumerate(zip(b.params, b.views)):
            if used is not None and not used[slot]:
                continue
            if p.grad is not None and p.grad.data_ptr() == view.data_ptr():
                continue  # .grad is the bucket's view or the reduced tensor itself
            if p.grad is None:
                p.grad = view.to(p.dtype, copy=True)
            else:
                p.grad.copy_(view)

    # -- what DDP users expect ----------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside the block only accumulate local gradients."""
        with self._hooks.disabled():
            yield

    def reduce_gradients(self) -> None:
        """Average the current `.grad`s now, outside backward (e.g. gradients set by hand).

        Also how benchmarks time communication alone. With early forward this applies
        the optimizer step too; `wait()` for it to finish.
        """
        self._on_start()
        for b in self._buckets:
            for slot, p in enumerate(b.params):
                if p.grad is not None:
                    self._on_grad(b.plan.index, slot, p)
        self._on_end()

    def wait(self) -> None:
        """Block until every launched reduction (and early-forward update) has finished."""
        self._blocked(self._reducer.wait_all)

    # -- the Trainer's interface (same as plain.PlainAllReduce) -------------------------
    @property
    def comm_seconds(self) -> float:
        """Seconds the training thread waited for communication (early forward included)."""
        return self._waited + (self._gate.wait_s if self._gate is not None else 0.0)

    @property
    def owns_step(self) -> bool:
        """True when the engine applies the optimizer step (early forward)."""
        return self.early_forward

    def broadcast_parameters(self) -> None:
        """Copy the group's first rank's parameters and buffers to every member (seed 001:
        weights broadcast)."""
        self.wait()
        if not self.group.distributed:
            return
        with torch.no_grad():
            for t in list(self.module.parameters()) + list(self.module.buffers()):
                self.group.broadcast(t.data)

    def sync_gradients(self) -> None:
        """Nothing to do: the gradient hooks reduced them during backward."""

    def sync_buffers(self) -> None:
        """Finish pending updates; average float buffers (batch-norm statistics) exactly."""
        self.wait()
        if self.group.size > 1:
            average_float_buffers(self.module, self._buffer_mean, torch.float32)

    def _buffer_mean(self, flat: torch.Tensor) -> torch.Tensor:
        self._pool.control_reducer(flat, op="mean")
        return flat

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank handed to torch.distributed for gradients and buffers."""
        return self._byte_offset + self._pool.bytes_sent()

    @bytes_sent.setter
    def bytes_sent(self, value: int) -> None:
        self._byte_offset = value - self._pool.bytes_sent()

    def link_bytes(self) -> dict[str, int]:
        """This rank's bytes sent per directed link: `{"0->1": n, "0->2": m}` (global ranks)."""
        return self._pool.link_bytes()

    def group_link_bytes(self) -> dict[str, int]:
        """Every member's `link_bytes()` merged (a collective over the group)."""
        return {k: v for d in self.group.all_gather_object(self.link_bytes())
                for k, v in sorted(d.items())}

    @property
    def busy_seconds(self) -> float:
        """Seconds the communication threads spent on jobs (mostly hidden behind backward)."""
        return self._pool.busy_seconds()

    @property
    def buckets(self) -> list[BucketState]:
        return list(self._buckets)

    # -- error-feedback state -----------------------------------------------------------
    def get_extra_state(self) -> dict[str, Any]:
        """Every residual and compressor state, in use or parked (`wire_state.collect`)."""
        self.wait()
        return collect(self._buckets, self._parked)

    def set_extra_state(self, state: Any) -> None:
        self.wait()
        self._parked = spread(self._buckets, state)

    def local_state(self) -> dict[str, Any]:
        """This member's residuals without collectives (`ReplicaReducer`)."""
        return self.get_extra_state()

    def load_local_state(self, state: Mapping[str, Any]) -> None:
        self.set_extra_state(state)

    def checkpoint_state(self) -> dict[str, Any]:
        """Every member's extra state, in member order (a collective over the group), for
        a checkpoint written by one member."""
        return {"ranks": self.group.all_gather_object(self.get_extra_state())}

    def load_checkpoint_state(self, state: Mapping[str, Any]) -> None:
        ranks = state.get("ranks", [])
        if self.group.rank < len(ranks):
            self.set_extra_state(ranks[self.group.rank])

    def close(self) -> None:
        """Finish, remove every hook and stop the communication threads."""
        self.wait()
        self._hooks.remove()
        if self._gate is not None:
            self._gate.remove()
        if self._applier is not None:
            self._applier.remove()
        self._pool.close()
