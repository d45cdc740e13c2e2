"""The pipeline executor against the single-process oracle (GPipe, 1F1B, ZB-H1, ZB-H2, ZB-V;
2-4 stages; 1-8 micro-batches; exact and lossy wires).

Zero-bubble cases split every backward into I and W (fused layers defer their weight GEMMs
to W, several Ws in a row as one GEMM; one case unfused); the byte check proves W sends
nothing. Each `run_on_ranks` call runs many cases in one set of processes (one case = a
fresh runtime, a training step, a forward-only evaluation, and the same training step
again, which reuses every transfer buffer and must accumulate exactly twice the gradient).
The oracle accumulates `weight_m * loss_m` over the same micro-batches in one process, with
lossy wires encoding and decoding each micro-batch's values at every cut and their
gradients on the way back with the same codecs; the loss and every parameter gradient must
agree within 1e-5. The same runs check the byte accounting: each link carries exactly the
codec's payload for every micro-batch. With seed 000's approximate channel (bit flips on
the unprotected bits of every code) the oracle flips the same bits: each cut's channels
seeded as the transport seeds them (stage s sends forward on 2 s and backward on 2 s + 1,
the run's seed 0), drawn in the order the stage sends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.comm.channel import Channel, get_channel, guard_nonfinite
from approxdist.comm.codecs import get_codec
from approxdist.comm.codecs.base import Codec
from approxdist.comm.transfer import SHAPE_WORDS
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.wire import Wire
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.models.mlp import mlp
from approxdist.pipeline.microbatch import microbatch_sizes, split_microbatches
from approxdist.pipeline.partition import Partition, stage_module
from approxdist.pipeline.runtime import build_runtime

FEATURES, CLASSES, HIDDEN = 12, 5, 16


@dataclass(frozen=True)
class Case:
    stages: int
    microbatches: int
    schedule: str
    batch: int = 16
    recompute: bool = False
    fwd_codec: str = "fp32"
    bwd_codec: str = "fp32"
    fuse: str = "all"  # fused weight-gradient accumulation on every layer (this MLP is small)
    threads: str = "inline"  # seed 002's communication-thread strategy
    depth: int = 4  # the MLP's hidden layers: depth + 1 blocks (ZB-V cuts 2 per rank)
    channel: str = ""  # both wires' channel (seed 000's bit errors)

    def config(self) -> PipelineConfig:
        return PipelineConfig(stages=self.stages, microbatches=self.microbatches,
                              schedule=self.schedule, recompute=self.recompute,
                              fuse_accumulation=self.fuse, comm_threads=self.threads)


def _model(depth: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    return mlp((FEATURES,), CLASSES, hidden=HIDDEN, depth=depth)  # depth + 1 blocks, no norm


def _data(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, FEATURES, generator=gen), torch.randint(0, CLASSES, (n,), generator=gen)


def _run_cases(ctx: DistContext, cases: list[Case]) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        x, y = _data(case.batch)
        rt = build_runtime(case.config(), _model(case.depth), ctx, x[:2],
                           fwd=Wire(codec=case.fwd_codec, channel=case.channel),
                           bwd=Wire(codec=case.bwd_codec, channel=case.channel))
        first, last = rt.executor.is_first, rt.executor.is_last
        res = rt.executor.train_step(x if first else None, y if last else None, case.batch)
        grads = {n: p.grad.clone() for n, p in rt.module.named_parameters()}
        sent_train = dict(rt.link.stats.sent)
        xt, yt = _data(7, seed=2)
        rt.compute.reset_step()
        rt.executor.eval_batch(xt if first else None, yt if last else None, 7)
        ev = (float(rt.compute.loss_sum), int(rt.compute.correct))
        again = rt.executor.train_step(x if first else None, y if last else None, case.batch)
        twice = {n: p.grad.clone() for n, p in rt.module.named_parameters()}
        out.append({"last": last, "loss": res.loss, "correct": res.correct, "grads": grads, "eval": ev,
                    "sent": sent_train, "loss2": again.loss, "twice": twice,
                    "codec_s": rt.transport.codec_seconds, "partition": rt.partition})
        rt.close()
    return out


def _cross(x: torch.Tensor, codec: Codec, channel: Channel | None) -> torch.Tensor:
    """What the receiver holds of `x` sent with `codec` over `channel` (None: no bit
    errors): encoded, its payload corrupted, decoded, non-finite values set to 0."""
    x = x.detach().contiguous()
    if channel is None:
        return codec.roundtrip(x).view(x.shape)
    out = codec.decode(channel.corrupt(codec.encode(x.reshape(-1)), codec))
    return guard_nonfinite(out)[0].view(x.shape)


class _Cut(torch.autograd.Function):
    """A stage boundary with its wires: forward values as `fwd` decodes them, their
    gradients as `bwd` decodes them (what the next stage receives, what this one gets back),
    each through its channel."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd: Codec, bwd: Codec, fwd_channel: Channel | None,
                bwd_channel: Channel | None) -> torch.Tensor:
        ctx.bwd, ctx.bwd_channel = bwd, bwd_channel
        return _cross(x, fwd, fwd_channel)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        return _cross(grad, ctx.bwd, ctx.bwd_channel), None, None, None, None


#: per cut: the channel of its forward values and of their gradients (None: none)
Channels = list[tuple[Channel | None, Channel | None]]


def _channels(case: Case) -> Channels:
    """Each cut's channels as the transport seeds them: the sender's stage s draws its
    forward flips from seed 2 s, its backward ones from 2 s + 1 (the run's seed 0)."""
    def one(seed: int) -> Channel | None:
        channel = get_channel(case.channel, seed)
        return None if channel.is_identity else channel

    return [(one(2 * s), one(2 * (s + 1) + 1)) for s in range(case.stages - 1)]


def _forward(case: Case, model: nn.Sequential, partition: Partition | None,
             x: torch.Tensor, channels: Channels) -> torch.Tensor:
    """The model's output, each micro-batch's values crossing the case's wires at every cut
    of `partition` (the whole model at once when the wires are exact fp32)."""
    if partition is None or ((case.fwd_codec, case.bwd_codec) == ("fp32", "fp32")
                             and not case.channel):
        return model(x)
    fwd, bwd = get_codec(case.fwd_codec), get_codec(case.bwd_codec)
    for s in range(partition.num_stages):
        x = stage_module(model, partition, s)(x)
        if s < partition.num_stages - 1:
            x = _Cut.apply(x, fwd, bwd, *channels[s])
    return x


def _oracle(case: Case, partition: Partition | None = None
            ) -> tuple[float, int, dict[str, torch.Tensor], tuple[float, int]]:
    """The first step's loss, hits and gradients, then the evaluation (micro-batches in
    order: each channel draws its flips in the order its stage sends them)."""
    model, (x, y) = _model(case.depth), _data(case.batch)
    channels = _channels(case)
    loss_total, correct = 0.0, 0
    for mb in split_microbatches(x, y, case.microbatches):
        out = _forward(case, model, partition, mb.inputs, channels)
        loss = F.cross_entropy(out, mb.labels) * mb.weight
        loss.backward()
        loss_total += float(loss.detach())
        correct += int((out.argmax(1) == mb.labels).sum())
    xt, yt = _data(7, seed=2)
    with torch.no_grad():
        out = _forward(case, model, partition, xt, channels)
        ev = (float(F.cross_entropy(out, yt, reduction="sum")), int((out.argmax(1) == yt).sum()))
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss_total, correct, grads, ev


def _boundary_width(case: Case) -> int:
    return HIDDEN  # every boundary of this MLP carries `HIDDEN` features per sample


def _check(case: Case, ranks: list[dict[str, Any]]) -> None:
    loss, correct, grads, ev = _oracle(case, ranks[0]["partition"])
    (last,) = [r for r in ranks if r["last"]]  # ZB-V: rank 0 holds the last chunk
    assert last["loss"] == pytest.approx(loss, abs=1e-5), case
    assert last["correct"] == correct, case
    assert last["eval"][0] == pytest.approx(ev[0], abs=1e-4) and last["eval"][1] == ev[1], case
    seen: set[str] = set()
    assert last["loss2"] == pytest.approx(loss, abs=1e-5), case  # reused buffers, same step
    for r in ranks:
        for name, g in r["grads"].items():
            torch.testing.assert_close(g, grads[name], atol=1e-5, rtol=0, msg=f"{case} {name}")
            torch.testing.assert_close(r["twice"][name], 2 * grads[name], atol=2e-5, rtol=0)
            seen.add(name)
    assert seen == set(grads), f"{case}: parameters without a stage: {set(grads) - seen}"
    _check_bytes(case, ranks)


def _check_bytes(case: Case, ranks: list[dict[str, Any]]) -> None:
    """Each boundary carries exactly the codec's payload per micro-batch, both ways (plus the
    one shape header stage s sends stage s+1 at start-up); exact fp32 travels raw, the
    values' own 4 bytes each with no codec header."""
    sizes = microbatch_sizes(case.batch, case.microbatches)
    width = _boundary_width(case)
    if case.schedule == "zbv":  # each pair of ranks: one chunk boundary down, one back up
        one = sum(_wire_nbytes(case.fwd_codec, n * width) for n in sizes)
        for s in range(case.stages - 1):
            assert ranks[s]["sent"].get(s + 1) == ranks[s + 1]["sent"].get(s) == \
                SHAPE_WORDS * 8 + 2 * one
        return
    for s in range(case.stages - 1):
        assert ranks[s]["sent"].get(s + 1) == SHAPE_WORDS * 8 + sum(
            _wire_nbytes(case.fwd_codec, n * width) for n in sizes)
        assert ranks[s + 1]["sent"].get(s) == sum(_wire_nbytes(case.bwd_codec, n * width)
                                                  for n in sizes)


def _wire_nbytes(spec: str, numel: int) -> int:
    return 4 * numel if spec == "fp32" else get_codec(spec).payload_nbytes(numel)


ORACLE_CASES = {
    2: [Case(2, m, s) for s in ("gpipe", "1f1b") for m in (1, 2, 3, 5, 8)]
       + [Case(2, 4, "1f1b", batch=10), Case(2, 8, "gpipe", recompute=True),
          Case(2, 3, "1f1b", batch=10, recompute=True), Case(2, 5, "1f1b", fuse="off"),
          Case(2, 3, "gpipe", recompute=True, fuse="off")]
       + [Case(2, m, "zbh1") for m in (1, 3, 4)] + [Case(2, 4, "zbh1", fuse="off")]
       + [Case(2, 3, "zbh2"), Case(2, 4, "zbh1", recompute=True),
          Case(2, 5, "zbh2", batch=10, recompute=True)]
       + [Case(2, 4, "zbv"), Case(2, 3, "zbv", recompute=True), Case(2, 5, "zbv", fuse="off")],
    3: [Case(3, m, s) for s in ("gpipe", "1f1b") for m in (1, 4, 7)]
       + [Case(3, 6, "1f1b", recompute=True), Case(3, 7, "1f1b", threads="sra")]
       + [Case(3, 4, "zbh1"), Case(3, 5, "zbh2"), Case(3, 3, "zbh1", recompute=True),
          Case(3, 6, "zbh2", recompute=True), Case(3, 6, "zbh1", threads="sra")]
       # lossy wires at both cuts, the forward values recomputed in the backward
       + [Case(3, 4, "1f1b", recompute=True, fwd_codec="bf16", bwd_codec="bits:s1e8m3")],
    # every thread strategy on the longest 1F1B: one thread per peer for both directions
    # (sra) deadlocks here unless both ends follow the agreed message order
    4: [Case(4, m, s) for s in ("gpipe", "1f1b") for m in (2, 3, 8)]
       + [Case(4, 5, "gpipe", batch=10, recompute=True)]
       + [Case(4, 8, "1f1b", threads=t) for t in ("per-message", "sa", "sra")]
       + [Case(4, 8, "gpipe", threads="sra")]
       + [Case(4, 8, "zbh1"), Case(4, 7, "zbh2"), Case(4, 5, "zbh1", recompute=True),
          Case(4, 8, "zbh2", recompute=True)]
       + [Case(4, 8, "zbv", depth=7), Case(4, 7, "zbv", depth=7, recompute=True)],
}


@pytest.mark.parametrize("stages", sorted(ORACLE_CASES))
def test_loss_and_every_gradient_match_single_process(stages: int) -> None:
    cases = ORACLE_CASES[stages]
    ranks = run_on_ranks(_run_cases, stages, cases, timeout_s=120)
    for i, case in enumerate(cases):
        _check(case, [r[i] for r in ranks])


def test_lossy_wires_equal_one_process_applying_the_codecs_at_the_cut() -> None:
    """Seed 000's 4-bit activations and bf16 gradients: the loss, the hits, the evaluation
    and every gradient equal one process that encodes and decodes each micro-batch's values
    at the cut (forward) and their gradients (backward) with the same codecs (1e-5: only
    the order of fp32 sums differs; the encoded values are the same bits), and the codecs
    did change the numbers; exact payload sizes, fewer bytes."""
    lossy = Case(2, 4, "gpipe", batch=128, fwd_codec="bits:s0e2+2m0", bwd_codec="bf16")
    exact = Case(2, 4, "gpipe", batch=128)
    split = Case(2, 4, "zbh1", batch=128, fwd_codec="bits:s0e2+2m0", bwd_codec="bf16")
    ranks = run_on_ranks(_run_cases, 2, [exact, lossy, split], timeout_s=120)
    for i, case in enumerate((exact, lossy, split)):  # loss, grads, eval, bytes
        _check(case, [r[i] for r in ranks])
    # a split backward sends the same gradients (its I's), bit for bit those of GPipe's B's
    assert ranks[1][2]["loss"] == ranks[1][1]["loss"]
    assert all(r[0]["codec_s"] == 0 for r in ranks)  # raw fp32: nothing encoded or decoded
    assert all(r[1]["codec_s"] > 0 for r in ranks)
    assert ranks[0][1]["sent"][1] * 6 < ranks[0][0]["sent"][1]  # 4 vs 32 bits + headers
    assert ranks[1][1]["sent"][0] * 1.9 < ranks[1][0]["sent"][0]
    _, _, exact_grads, _ = _oracle(exact)
    _, _, lossy_grads, _ = _oracle(lossy, ranks[0][1]["partition"])
    assert all(not torch.allclose(lossy_grads[n], g, atol=1e-3) for n, g in exact_grads.items()
               if n.startswith("0.")), "the codecs changed no gradient of stage 0"


def test_a_noisy_channel_equals_one_process_flipping_the_same_bits() -> None:
    """Bit flips at 5 % on the mantissa bits of bf16 values (`ber:0.05@9`) on both wires of
    2 stages, GPipe and 1F1B: the first step's loss, hits and every gradient equal one
    process that corrupts each micro-batch's payload with the same seeded channels, in
    the order each stage sends (1e-5: the same bits; only fp32 sums differ), and the flips
    did change the gradients (the evaluation and the second step draw other flips)."""
    cases = [Case(2, 4, schedule, batch=32, fwd_codec="bf16", bwd_codec="bf16",
                  channel="ber:0.05@9") for schedule in ("gpipe", "1f1b")]
    ranks = run_on_ranks(_run_cases, 2, cases, timeout_s=120)
    _, _, quiet, _ = _oracle(dataclasses.replace(cases[0], channel=""),
                             ranks[0][0]["partition"])
    for i, case in enumerate(cases):
        loss, correct, grads, _ = _oracle(case, ranks[0][i]["partition"])
        (last,) = [r[i] for r in ranks if r[i]["last"]]
        assert last["loss"] == pytest.approx(loss, abs=1e-5) and last["correct"] == correct
        for r in ranks:
            for name, g in r[i]["grads"].items():
                torch.testing.assert_close(g, grads[name], atol=1e-5, rtol=0,
                                           msg=f"{case} {name}")
        assert any(not torch.allclose(grads[n], g, atol=1e-3) for n, g in quiet.items()), \
            f"{case}: the channel flipped nothing that mattered"
