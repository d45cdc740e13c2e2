"""The DDP rows of `bench dp`: torch DDP in fp32, fp16, or with torch's own `powerSGD_hook`.

Without an emulated link each is DDP as its users run it: plain gloo (`fp32`), torch's
`fp16_compress_hook` (`fp16`) or torch's `powerSGD_hook` (`powersgd:<r>`: rank r, error
feedback, warm start, `min_compression_rate` 2, from step 2, torch's earliest; the
bench's warm-up steps cover the first two). With `--link` every row pays the same
emulated link as our engine: `fp32` and `fp16` go through our DDP hook with the `native`
all-reduce (gloo's ring, each rank sleeping until the emulated link would have moved its
bytes, `peers.LinkComm.native_sum`); `powersgd:<r>` runs torch's hook unchanged, and when
a bucket's all-reduces are done, the rank sleeps until the emulated link would have moved
what they carried (the `numel` after compression that the hook counts itself, as one gloo
ring from the hook's call: the wait between P and Q is not charged twice).

One process group per DDP bucket (`BucketLanes`): torch's hook issues a bucket's P and Q
all-reduces from callbacks of its earlier futures, on the thread that completed them,
while backward issues the next bucket's first all-reduce on the training thread; on one
gloo group the ranks can then enqueue them in different orders and gloo fails
("Received data size doesn't match expected size"; pytorch/pytorch#58467 is the hook's
parity test failing on gloo). On a bucket's own group every collective follows the one
before it on that group (first all-reduce, its callback's P, P's callback's Q; the next
step's after DDP waited for them), so the order is the same on every rank, and buckets
still overlap each other and backward as on one group. The hook's code and maths are
torch's, untouched: only `PowerSGDState.process_group` is set per bucket before the call.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations at run time
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from approxdist.comm.compressors.powersgd import parse_rank
from approxdist.comm.link import Link
from approxdist.data_parallel.ddp_hook import register_hook
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, world_group

#: DDP's wires in `bench dp`: fp32, fp16 and torch's PowerSGD hook
DDP_FORMS = ("fp32", "fp16", "powersgd:<r>")


def ddp_label(text: str) -> str:
    """A DDP row's wire, checked: `fp32`, `fp16` or `powersgd:<r>`."""
    spec = text.strip().lower()
    if spec.startswith("powersgd:"):
        return f"powersgd:{parse_rank(spec.partition(':')[2])}"
    if spec not in ("fp32", "fp16"):
        raise ConfigError(f"--ddp-codec {text!r}: DDP runs {', '.join(DDP_FORMS)} (torch's "
                          f"own hooks); e.g. --ddp-codec fp32,fp16,powersgd:2")
    return spec


def ddp_model(ctx: DistContext, model: nn.Module, label: str, link: str | None,
              gil_switch_ms: float | None) -> tuple[nn.Module, Callable[[], None]]:
    """DDP around `model` sending in `label`, and what closes it."""
    ddp = nn.parallel.DistributedDataParallel(model)
    if label.startswith("powersgd:"):
        return ddp, torch_powersgd(ddp, ctx, int(label[9:]), link).close
    if link:
        hook = register_hook(ddp, ctx, algorithm="native", codec=label, link=link,
                             gil_switch_ms=gil_switch_ms)
        return ddp, hook.close
    if label == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

        ddp.register_comm_hook(None, fp16_compress_hook)
    return ddp, _nothing


def _nothing() -> None:
    return None


def torch_powersgd(ddp: nn.parallel.DistributedDataParallel, ctx: DistContext, rank: int,
                   link: str | None = None) -> "BucketLanes":
    """Register torch's `powerSGD_hook` on `ddp` (rank `rank`, error feedback, warm start,
    `min_compression_rate` 2, from step 2), each bucket on its own process group and,
    with `link`, paying the emulated link (module doc); `close()` the result when done."""
    state = powersgd.PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=2)
    lanes = BucketLanes(world_group(ctx), Link(ctx, link) if link else None)
    ddp.register_comm_hook((state, lanes), _shaped_powersgd)
    return lanes


class BucketLanes:
    """One process group (a lane of `group`) per DDP bucket index, forked the first time
    the hook meets that index (DDP hands every rank its buckets in the same order, so
    every rank forks in the same order; module doc), and the emulated `link`, if any."""

    def __init__(self, group: Group, link: Link | None) -> None:
        self.group, self.link = group, link
        self.lanes: list[Group] = []

    def pg(self, bucket: int) -> Any:
        """The process group of bucket `bucket` (None, the default group, for one rank)."""
        if not self.group.distributed:
            return None
        while len(self.lanes) <= bucket:
            self.lanes.append(self.group.fork(f"powersgd-bucket{len(self.lanes)}"))
        return self.lanes[bucket].pg

    def close(self) -> None:
        for lane in self.lanes:
            lane.release()
        self.lanes = []
        if self.link is not None:
            self.link.close()


def _shaped_powersgd(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's `powerSGD_hook` on the bucket's own process group, then a wait for what the
    emulated link adds (module doc)."""
    ps, lanes = state
    link = lanes.link
    ps.process_group = lanes.pg(bucket.index())  # read once, at the hook's entry
    before, start = ps.total_numel_after_compression, time.monotonic()
    fut = powersgd.powerSGD_hook(ps, bucket)
    if link is None or link.group.size < 2:
        return fut
    moved = ps.total_numel_after_compression - before or bucket.buffer().numel()

    def charge(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        n, me = link.group.size, link.group.rank
        right, hops, chunk = (me + 1) % n, 2 * (n - 1), 4 * moved // n
        for _ in range(hops):  # what gloo's ring moved, counted like our own messages
            link.account("send", right, chunk)
            link.account("recv", (me - 1) % n, chunk)
        end = link.book_chain(right, chunk, hops, start)
        if end is not None:
            time.sleep(max(0.0, end - time.monotonic()))
        return done.value()

    return fut.then(charge)
