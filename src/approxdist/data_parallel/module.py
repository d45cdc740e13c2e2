"""`DataParallel`: a DDP-like wrapper whose gradients cross our link layer (seeds 001 and 004).

    dp = DataParallel(model, algorithm="auto", codec="bf16", link="bw=1gbit")
    loss = F.cross_entropy(dp(x), y)
    optimizer.zero_grad(); loss.backward(); optimizer.step()   # grads are averaged

The wrapper averages over `group` (a `launch.group.Group`; the whole world by default),
or sums with `op="sum"` (replicas whose losses already carry their share of the batch: a
hybrid pipeline's stage). Construction checks the members hold the same model
(`checks.py`), broadcasts the first member's weights, plans the gradients into buckets
(`buckets.py`) with a codec each from `codec_rules` (`codec_rules.py`; `fastest` from
`codec_times`, `codec_times.py`) and starts the communication threads (`threads.py`);
backward is `backward.py`'s (overlap, early forward, unused parameters). Error-feedback
residuals and compressor states travel in `state_dict()` as extra state and survive a
codec switch (`set_codecs`, parked while unused: `wire_state.py`). `hold_freed_memory`
and `gil_switch_ms` are process-wide (`launch.malloc`, `threads.shorten_gil_switch`);
docs/data_parallel.md has the whole story.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from approxdist.comm.collectives import Calibration
from approxdist.comm.update_error import Sums, UpdateError, merge
from approxdist.config.dp import check_sizes
from approxdist.data_parallel.backward import BackwardPass, Waits
from approxdist.data_parallel.buckets import ParamInfo, plan_buckets
from approxdist.data_parallel.buffer_stats import average_float_buffers
from approxdist.data_parallel.checks import check_same_model, context_of
from approxdist.data_parallel.codec_rules import CodecRules, param_owners
from approxdist.data_parallel.codec_times import CodecTimes, load_times
from approxdist.data_parallel.early_forward import StepApplier
from approxdist.data_parallel.hooks import ForwardGate
from approxdist.data_parallel.reducer import BucketState
from approxdist.data_parallel.threads import GIL_SWITCH_MS, CommPool
from approxdist.data_parallel.wire_state import Parked, collect, spread
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, world_group
from approxdist.launch.malloc import hold_freed_memory as keep_heap
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
                 seed: int = 0, recorder: Recorder = NULL_RECORDER) -> None:
        """`seed`: the run's seed, which each compressed parameter's random streams derive
        from with its name (docs/compressors.md); the other arguments: docs/data_parallel.md."""
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
        self._waits = Waits(recorder)  # the caller's thread waiting for communication
        self._byte_offset = 0
        self._seed = seed
        self._sizes = (bucket_mb, first_bucket_mb, solo_mb, error_feedback)
        self._buckets = self._make_buckets(*self._sizes)
        self._parked = Parked()  # wire state no bucket uses now (`wire_state.py`)
        self._pool = CommPool(self.ctx, self.group, link, threads, algorithm, calibration,
                              rec=recorder, gil_switch_ms=gil_switch_ms)
        self._find_unused, self._overlap, self._op = find_unused_parameters, overlap, op
        self._chunk_numel = int(chunk_kb * 1024) // 4
        self._applier = StepApplier(optimizer, self._buckets) \
            if early_forward and optimizer is not None else None
        self._pass = self._backward_pass()
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
                            worker=self.group.rank, seed=self._seed) for plan in plans]

    def _backward_pass(self) -> BackwardPass:
        """The backward pass (reducer, usage flags, gradient hooks) of the current buckets."""
        return BackwardPass(self._buckets, self._pool, self._waits, overlap=self._overlap,
                            chunk_numel=self._chunk_numel, op=self._op,
                            find_unused=self._find_unused, applier=self._applier,
                            wait_in_backward=self.wait_in_backward)

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
        self._pass.hooks.remove()
        self.rules = rules
        self._buckets = self._make_buckets(*self._sizes)
        self._pass = self._backward_pass()
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
        # a backward that raised never reached its end callback
        self._pass.hooks.in_backward = False
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for this backward's reductions and put the results in `.grad` (what the end
        of backward does unless `wait_in_backward=False`)."""
        self._pass.finish()

    # -- what DDP users expect ----------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside the block only accumulate local gradients."""
        with self._pass.hooks.disabled():
            yield

    def reduce_gradients(self) -> None:
        """Average the current `.grad`s now, outside backward (e.g. gradients set by hand).

        Also how benchmarks time communication alone. With early forward this applies
        the optimizer step too; `wait()` for it to finish.
        """
        self._pass.reduce_now()

    def wait(self) -> None:
        """Block until every launched reduction (and early-forward update) has finished."""
        self._pass.wait()

    # -- the Trainer's interface (same as plain.PlainAllReduce) -------------------------
    @property
    def comm_seconds(self) -> float:
        """Seconds the training thread waited for communication (early forward included)."""
        return self._waits.seconds + (self._gate.wait_s if self._gate is not None else 0.0)

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
        self._pass.hooks.remove()
        if self._gate is not None:
            self._gate.remove()
        if self._applier is not None:
            self._applier.remove()
        self._pool.close()
