"""Compressors on DataParallel's gradient wire, 2 ranks, against one process.

The oracle computes both ranks' gradients in one process, compresses each compressed
parameter's with the same compressors driven in lockstep (messages summed, as the ring
all-reduce does, or payloads handed to every worker, as the all-gather does) and averages
the others exactly; 3 SGD steps of the engine must land on the same parameters, bit for
bit. The last step's bytes are each compressed parameter's `wire_bytes()` plus the exact
ones' fp32 values (2 ranks: every byte crosses once). A resumed engine continues exactly
like the uninterrupted one (residuals and random streams in its state). The run's seed
is SEED: the engine, the DDP hook and the oracle each take every parameter's streams from it
and the parameter's name by `Where`'s rule.
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD  # noqa: N812
from torch.nn import functional as F  # noqa: N812

import approxdist
from approxdist.comm.compressors import Where, get_compressor
from approxdist.data_parallel import DataParallel
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from tests.helpers.lockstep import lockstep
from tests.helpers.tiny_mlp import batch, net, sgd_steps

#: name -> (codec, rules, all-reduce algorithm); auto's all-gather of small payloads is direct
CASES = {"powersgd": ("powersgd:2", ["*.bias=fp32"], "ring"),
         "randomk": ("randomk:0.25", [], "ring"),
         "topk": ("topk:0.25", ["*.bias=fp32"], "ring"),
         "qsgd": ("qsgd:4", [], "auto"),
         "terngrad": ("terngrad", [], "ring"),
         "sign+ef": ("sign+ef", ["2.*=fp32"], "auto"),
         "signsgd": ("signsgd", [], "ring")}
STEPS = 3
#: the run's seed (`DataParallel(seed=)`, the hook's `seed=`)
SEED = 3


def _run(ctx: DistContext, codec: str, rules: list[str], algorithm: str) -> dict[str, Any]:
    kw: dict[str, Any] = {"codec": codec, "codec_rules": rules, "algorithm": algorithm,
                          "seed": SEED}
    a = net()
    dp_a = DataParallel(a, ctx=ctx, **kw)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    sgd_steps(dp_a, opt_a, ctx.rank, range(2))
    saved, weights = dp_a.state_dict(), {k: v.clone() for k, v in a.state_dict().items()}
    before = dp_a.bytes_sent
    sgd_steps(dp_a, opt_a, ctx.rank, range(2, STEPS))
    last_step_bytes = dp_a.bytes_sent - before
    b = net()
    dp_b = DataParallel(b, ctx=ctx, broadcast=False, **kw)
    dp_b.load_state_dict(saved)
    b.load_state_dict(weights)
    sgd_steps(dp_b, torch.optim.SGD(b.parameters(), lr=0.1), ctx.rank, range(2, STEPS))
    out = {"params": a.state_dict(), "resumed": b.state_dict(), "bytes": last_step_bytes}
    dp_a.close()
    dp_b.close()
    return out


#: DDP hook cases that also save and resume (a residual; a random stream)
RESUMED = ("topk", "qsgd")
#: torch's powerSGD_hook against ours: PowerSGD from this step on, both
HOOK_START = 2
#: 0.weight (32 x 10) is compressed by both hooks; torch's min_compression_rate=2 leaves
#: 2.weight (4 x 32: 72 x 2 >= 128 values) uncompressed, which our rule says too
TORCH_LIKE = ["*.bias=fp32", "2.weight=fp32"]
COMPRESSED_BY_BOTH = "0.weight"


def _ddp(ctx: DistContext, codec: str, rules: list[str], algorithm: str,
         **options: Any) -> tuple[nn.Module, nn.Module, Any]:
    m = net()
    ddp = nn.parallel.DistributedDataParallel(m)
    state, hook = approxdist.ddp_hook(codec, ddp, ctx=ctx, codec_rules=rules,
                                      algorithm=algorithm, seed=SEED, **options)
    ddp.register_comm_hook(state, hook)
    return m, ddp, state


def _hook(ctx: DistContext, name: str, codec: str, rules: list[str],
          algorithm: str) -> dict[str, Any]:
    m, ddp, state = _ddp(ctx, codec, rules, algorithm)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sgd_steps(ddp, opt, ctx.rank, range(2))
    saved, weights = state.state_dict(), {k: v.clone() for k, v in m.state_dict().items()}
    sgd_steps(ddp, opt, ctx.rank, range(2, STEPS))
    out: dict[str, Any] = {"params": m.state_dict()}
    state.close()
    if name in RESUMED:
        b, ddp_b, state_b = _ddp(ctx, codec, rules, algorithm)
        b.load_state_dict(weights)
        state_b.load_state_dict(saved)
        sgd_steps(ddp_b, torch.optim.SGD(b.parameters(), lr=0.1), ctx.rank, range(2, STEPS))
        out["resumed"] = b.state_dict()
        state_b.close()
    return out


def _torch_powersgd(ctx: DistContext) -> dict[str, Any]:
    """DDP with torch's powerSGD_hook and DDP with ours, both rank 2, error feedback and warm
    start, exact fp32 before step HOOK_START; torch's `random_seed` is the one our rule
    (`Where`) gives the matrix both compress, so both draw its first Q alike."""
    ours, ddp, state = _ddp(ctx, "powersgd:2", TORCH_LIKE, "ring", start_step=HOOK_START)
    sgd_steps(ddp, torch.optim.SGD(ours.parameters(), lr=0.1), ctx.rank, range(HOOK_START + 3))
    state.close()
    theirs = net()
    matrix = dict(theirs.named_parameters())[COMPRESSED_BY_BOTH]
    ddp_t = nn.parallel.DistributedDataParallel(theirs)
    hook_state = powerSGD.PowerSGDState(
        None, matrix_approximation_rank=2, start_powerSGD_iter=HOOK_START,
        min_compression_rate=2, use_error_feedback=True, warm_start=True,
        random_seed=Where(tuple(matrix.shape), COMPRESSED_BY_BOTH, SEED).shared_seed)
    ddp_t.register_comm_hook(hook_state, powerSGD.powerSGD_hook)
    sgd_steps(ddp_t, torch.optim.SGD(theirs.parameters(), lr=0.1), ctx.rank,
              range(HOOK_START + 3))
    return {"ours": ours.state_dict(), "torch": theirs.state_dict(),
            "torch stats": hook_state.compression_stats()}


def _all(ctx: DistContext) -> dict[str, Any]:
    out: dict[str, Any] = {name: _run(ctx, *case) for name, case in CASES.items()}
    out["hook"] = {name: _hook(ctx, name, *case) for name, case in CASES.items()}
    out["torch powersgd"] = _torch_powersgd(ctx)
    try:
        DataParallel(net(), ctx=ctx, codec="powersgd:2").close()
    except ConfigError as err:
        out["vector"] = str(err)
    try:
        approxdist.ddp_hook("powersgd:2", net(), ctx=ctx)
    except ConfigError as err:
        out["hook vector"] = str(err)
    return out


def _compressed(model: nn.Module, rules: list[str]) -> list[str]:
    """The parameters the case's codec compresses (its rules send the others in fp32)."""
    exact = [r.partition("=")[0] for r in rules]
    return [n for n, _ in model.named_parameters() if not any(fnmatch(n, g) for g in exact)]


def oracle(codec: str, rules: list[str], algorithm: str) -> dict[str, torch.Tensor]:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    compressed = _compressed(model, rules)
    comps = {n: [get_compressor(codec, Where(tuple(p.shape), n, SEED, w)) for w in range(2)]
             for n, p in named if n in compressed}
    for s in range(STEPS):
        grads = []
        for rank in range(2):
            model.zero_grad()
            x, y = batch(rank, s)
            F.cross_entropy(model(x), y).backward()
            grads.append({n: p.grad.clone() for n, p in named if p.grad is not None})
        for n, p in named:
            pair = [grads[0][n], grads[1][n]]
            p.grad = lockstep(comps[n], pair)[0] if n in comps else (pair[0] + pair[1]) / 2
        opt.step()
    return model.state_dict()


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_on_ranks(_all, 2)


@pytest.mark.parametrize("name", list(CASES))
def test_engine_equals_one_process_compressing_each_ranks_gradient(
        two_ranks: list[dict[str, Any]], name: str) -> None:
    expected = oracle(*CASES[name])
    for rank, out in enumerate(two_ranks):
        for key, value in expected.items():
            assert torch.equal(out[name]["params"][key], value), (rank, key)


@pytest.mark.parametrize("name", list(CASES))
def test_a_step_sends_each_compressors_wire_bytes(two_ranks: list[dict[str, Any]],
                                                  name: str) -> None:
    codec, rules, _ = CASES[name]
    model = net()
    compressed = _compressed(model, rules)
    expected = sum(get_compressor(codec, Where(tuple(p.shape), n)).wire_bytes()
                   if n in compressed else 4 * p.numel() for n, p in model.named_parameters())
    assert [out[name]["bytes"] for out in two_ranks] == [expected, expected]


@pytest.mark.parametrize("name", list(CASES))
def test_a_resumed_engine_continues_bit_for_bit(two_ranks: list[dict[str, Any]],
                                                name: str) -> None:
    for out in two_ranks:
        for key, value in out[name]["params"].items():
            assert torch.equal(out[name]["resumed"][key], value), key


def test_powersgd_on_a_bias_names_it_and_the_rule(two_ranks: list[dict[str, Any]]) -> None:
    for key in ("vector", "hook vector"):  # the first in model order (one bucket holds all)
        assert "'0.bias' of shape (32,)" in two_ranks[0][key]
    for key in ("vector", "hook vector"):
        assert "--codec-rule '*.bias=fp32'" in two_ranks[0][key]


@pytest.mark.parametrize("name", list(CASES))
def test_ddp_with_our_hook_equals_one_process_compressing_each_ranks_gradient(
        two_ranks: list[dict[str, Any]], name: str) -> None:
    expected = oracle(*CASES[name])
    for rank, out in enumerate(two_ranks):
        for key, value in expected.items():
            assert torch.equal(out["hook"][name]["params"][key], value), (rank, key)
            if name in RESUMED:
                assert torch.equal(out["hook"][name]["resumed"][key], value), (rank, key)


def test_ddp_with_our_powersgd_equals_ddp_with_torchs_powersgd_hook(
        two_ranks: list[dict[str, Any]]) -> None:
    """The same operations in the same order but for the orthogonalisation (torch's divides
    by the norm plus epsilon 0, in its own kernel) and the matmuls' summation order. A value
    of P or Q sums at most 32 products (fp32: relative error <= 32 eps = 4e-6 of the sum of
    magnitudes), the gradients of this MLP are below 1, and 3 compressed SGD steps of lr 0.1
    add at most 3 x 0.1 x 4e-6 x a few such terms: 1e-5 bounds a parameter's difference."""
    for out in two_ranks:
        ours, theirs = out["torch powersgd"]["ours"], out["torch powersgd"]["torch"]
        for key, value in theirs.items():
            torch.testing.assert_close(ours[key], value, rtol=0, atol=1e-5, msg=key)
    # torch's hook compressed 0.weight alone, 3 steps: (32 + 10) x 2 values for its 32 x 10,
    # the other 164 values as they are
    _, before, after = two_ranks[0]["torch powersgd"]["torch stats"]
    assert (before, after) == (3 * (320 + 164), 3 * (84 + 164))
