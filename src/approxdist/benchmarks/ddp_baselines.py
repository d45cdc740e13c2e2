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
        state = powersgd.PowerSGDState(None, matrix_approximation_rank=int(label[9:]),
                                       start_powerSGD_iter=2)
        shaped = Link(ctx, link) if link else None
        ddp.register_comm_hook((state, shaped), _shaped_powersgd)
        return ddp, (shaped.close if shaped is not None else _nothing)
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


def _shaped_powersgd(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's `powerSGD_hook`, then a wait for what the emulated link adds (module doc)."""
    ps, link = state
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
