"""A small real traced run for the trace tests: two-stage GPipe over an emulated link.

Two gloo ranks on this machine each hold one stage (two Linear layers) and run GPipe
(seeds 000 and 002): stage 0 runs the M forwards and sends the activations, stage 1
receives them, computes the loss and sends the gradients back, both step their
optimiser. Every transfer goes through `comm.link.Link` (bandwidth emulation, bytes in
the trace) and every phase is recorded with the library API, exactly as an engine
would. (Users trace real runs with `approxdist train --trace`; docs/tracing.md.)
"""

from __future__ import annotations

from pathlib import Path

import torch

from approxdist.comm.link import Link, RecvHandle, SendHandle
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.trace import phases as ph
from approxdist.trace.recorder import Recorder
from approxdist.trace.session import finish_trace, open_recorder


def _stage0(rec: Recorder, link: Link, net: torch.nn.Module, xs: list[torch.Tensor]
            ) -> list[SendHandle]:
    outs, sends, grads = [], [], []
    for m, x in enumerate(xs):
        with rec.span(ph.RUN_FOR, mb=m):
            outs.append(net(x))
        with rec.span(ph.SEND_FOR, mb=m):
            sends.append(link.isend(outs[-1], 1))
    for m in range(len(xs)):
        with rec.span(ph.RECEIVE_BACK, mb=m):
            grads.append(link.irecv(1))
    for m, (y, g) in enumerate(zip(outs, grads)):
        with rec.span(ph.RECEIVE_BACK, mb=m), rec.span(ph.WAIT):
            grad = g.wait()
        with rec.span(ph.RUN_BACK, mb=m):
            y.backward(grad)
    return sends


def _stage1(rec: Recorder, link: Link, net: torch.nn.Module, labels: list[torch.Tensor]
            ) -> list[SendHandle]:
    handles: list[RecvHandle[torch.Tensor]] = []
    for m in range(len(labels)):
        with rec.span(ph.RECEIVE_FOR, mb=m):
            handles.append(link.irecv(0))
    inputs, losses, sends = [], [], []
    for m, (h, y) in enumerate(zip(handles, labels)):
        with rec.span(ph.RECEIVE_FOR, mb=m), rec.span(ph.WAIT):
            inputs.append(h.wait().requires_grad_())
        with rec.span(ph.RUN_FOR, mb=m):
            losses.append(torch.nn.functional.cross_entropy(net(inputs[-1]), y) / len(labels))
    for m, (x, loss) in enumerate(zip(inputs, losses)):
        with rec.span(ph.RUN_BACK, mb=m):
            loss.backward()
        with rec.span(ph.SEND_BACK, mb=m):
            assert x.grad is not None
            sends.append(link.isend(x.grad, 0))
    return sends


def demo_rank(ctx: DistContext, run_dir: str, microbatches: int, steps: int, link_spec: str,
              width: int) -> dict[str, int]:
    """One rank of the demo (module level: `run_on_ranks` pickles it); returns link bytes."""
    rec = open_recorder(ctx, enabled=True, label=f"stage {ctx.rank}")
    rec.meta["pipeline"] = {"stages": 2, "microbatches": microbatches, "schedule": "gpipe"}
    link = Link(ctx, link_spec or None, hook=rec.transfer_hook())
    torch.manual_seed(ctx.rank)
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                              torch.nn.Linear(width, width))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    batch = [torch.randn(32, width) for _ in range(microbatches)]
    labels = [torch.randint(0, width, (32,)) for _ in range(microbatches)]
    try:
        for step in range(steps):
            with rec.span(ph.STEP, step=step):
                stage = _stage0 if ctx.rank == 0 else _stage1
                sends = stage(rec, link, net, batch if ctx.rank == 0 else labels)
                with rec.span(ph.SEND_FOR if ctx.rank == 0 else ph.SEND_BACK), rec.span(ph.WAIT):
                    for s in sends:
                        s.wait()
                with rec.span(ph.OPTIMIZER):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
    finally:
        link.close()
    finish_trace(rec, ctx, run_dir)
    return link.stats.as_dict(ctx.rank)


def run_demo(run_dir: str | Path, microbatches: int = 4, steps: int = 3,
             link_spec: str = "bw=50mbit", width: int = 512) -> list[dict[str, int]]:
    """Run the demo on two local ranks; `run_dir/trace.json` is written; bytes per rank."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    return run_on_ranks(demo_rank, 2, str(run_dir), microbatches, steps, link_spec, width)
