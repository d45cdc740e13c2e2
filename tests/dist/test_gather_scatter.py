"""All-gather, reduce-scatter and broadcast on real gloo ranks against torch.distributed.

One spawn per world runs every case: worlds of 2, 3 and 4 ranks, and 4 ranks with the
sub-group (3, 1, 2) while rank 0 stays outside. Oracles, on the same group:
* fp32: all-gather equals `dist.all_gather_single` (= `all_gather_into_tensor`) and
  broadcast `dist.broadcast` exactly; reduce-scatter equals `dist.reduce_scatter_single`
  within our summation bound plus gloo's, and the one-process replay of our order bitwise;
* lossy codecs (bf16, fp8-e5m2, the 4-bit bit-field, table4): all-gather and broadcast
  equal `decode(encode(x))` of each block (the root's tensor) bitwise, reduce-scatter the
  replay of its documented encodes and additions bitwise and, for the codecs with a
  relative error, the exact sum within the bound they give (`tests/helpers/collective_oracles`);
* bytes: the link counts the codec's payload bytes (not fp32's) and traces each message.
Members are named by global ranks in errors; mismatched shapes fail with both values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from approxdist.comm.codecs import get_codec
from approxdist.comm.collectives import AllGather, Broadcast, ReduceScatter
from approxdist.comm.collectives.layout import byte_segments, tree, value_segments
from approxdist.comm.link import Link
from approxdist.errors import LaunchError, SpecError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, new_group, world_group
from approxdist.launch.spawn import run_on_ranks
from approxdist.trace.transfers import TransferEvent
from tests.helpers.collective_oracles import coded, scatter_bound, scatter_replay

CODECS = ("fp32", "bf16", "fp8-e5m2", "bits:s0e2+2m0", "table4")
BOUNDED = ("fp32", "bf16", "fp8-e5m2")  # codecs with a relative error bound
SEGMENT = 4096  # fp32 bytes: the larger cases move in several segments
SUBGROUP = (3, 1, 2)


def _xs(n: int, shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    """Every member's input (each rank makes all of them: the oracles need them)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _ in range(n)]


def _torch_rank_order(group: Group) -> list[int]:
    """Member index of each torch group rank (torch numbers members in sorted order)."""
    return [next(i for i in range(group.size) if group.backend_rank(i) == t)
            for t in range(group.size)]


def _gather(group: Group, link: Link, codec: str, algorithm: str, check: str,
            shape: tuple[int, ...], seed: int) -> str | None:
    n, me = group.size, group.rank
    xs = _xs(n, shape, seed)
    ours = AllGather(link, codec, algorithm=algorithm, check=check,
                     segment_bytes=SEGMENT)(xs[me])
    if codec == "fp32":
        native = torch.empty(ours.shape)
        dist.all_gather_single(native, xs[me], group=group.pg)
        blocks = native.chunk(n) if shape[0] else [native] * n
        by_member = dict(zip(_torch_rank_order(group), blocks))
        expected = torch.cat([by_member[i] for i in range(n)])
    else:
        expected = torch.cat([coded(x, codec, n) for x in xs])
    return None if torch.equal(ours, expected) else "differs from the oracle"


def _scatter(group: Group, link: Link, codec: str, algorithm: str, check: str,
             shape: tuple[int, ...], seed: int) -> str | None:
    n, me = group.size, group.rank
    xs = _xs(n, shape, seed)
    scatter = ReduceScatter(link, codec, algorithm=algorithm, check=check,
                            segment_bytes=SEGMENT)
    ours = scatter(xs[me]).reshape(-1)
    name = scatter.pick(xs[me].numel() * 4)
    if not torch.equal(ours, scatter_replay(xs, codec, name, me, SEGMENT)):
        return "differs from the one-process replay"
    k = ours.numel()
    exact = torch.stack([x.double().reshape(-1) for x in xs]).sum(0)[me * k:(me + 1) * k]
    bound = scatter_bound(xs, codec, name, me) if codec in BOUNDED else None
    if bound is not None and not bool(((ours.double() - exact).abs() <= bound).all()):
        return "outside the bound of the exact sum"
    if codec == "fp32":  # torch's order of n-1 additions: ((1 + u32)^(n-1) - 1) sum |x|
        order = _torch_rank_order(group)
        chunks = xs[me].reshape(n, -1)
        native = torch.empty(k)
        dist.reduce_scatter_single(native, chunks[order].reshape(-1), group=group.pg)
        theirs = scatter_bound(xs, "fp32", "direct", me)
        assert bound is not None
        if not bool(((ours - native).abs().double() <= bound + theirs).all()):
            return "outside the bound of dist.reduce_scatter_tensor"
    return None


def _broadcast(group: Group, link: Link, codec: str, algorithm: str, check: str,
               shape: tuple[int, ...], seed: int) -> str | None:
    n, me = group.size, group.rank
    xs = _xs(n, shape, seed)
    ours = xs[me].clone()
    root = seed % n
    Broadcast(link, codec, algorithm=algorithm, check=check, segment_bytes=SEGMENT)(ours, root)
    if codec == "fp32":
        expected = xs[me].clone()
        dist.broadcast(expected, src=group.global_rank(root), group=group.pg)
    else:
        expected = coded(xs[root], codec, n)
    return None if torch.equal(ours, expected) else "differs from the oracle"


def _bytes(group: Group, ctx: DistContext) -> dict[str, Any]:
    """Bytes each call hands the link (unchecked: the data alone) against the codec's payload
    sizes, and the trace events of the same messages."""
    events: list[TransferEvent] = []
    link = Link(ctx, group=group, hook=events.append)
    n, me = group.size, group.rank
    codec = get_codec("bf16")
    out: dict[str, Any] = {}
    x = torch.randn(3 * n, 1000)
    k = x.numel() // n

    def sent(call: Callable[[], object]) -> int:
        before = link.stats.bytes_sent
        call()
        return link.stats.bytes_sent - before

    for algorithm in ("ring", "direct"):
        out[f"allgather-{algorithm}"] = (
            sent(lambda a=algorithm: AllGather(link, "bf16", algorithm=a, check=False,
                                               segment_bytes=SEGMENT)(x[:3])),
            (n - 1) * codec.payload_nbytes(x[:3].numel()))
        scatter_bytes = sum(codec.payload_nbytes(b - a) for a, b in value_segments(k, SEGMENT)) \
            if algorithm == "ring" else codec.payload_nbytes(k)
        out[f"reducescatter-{algorithm}"] = (
            sent(lambda a=algorithm: ReduceScatter(link, "bf16", algorithm=a, check=False,
                                                   segment_bytes=SEGMENT)(x)),
            (n - 1) * scatter_bytes)
    kids = {"tree": len(tree(me, 0, n)[1]), "direct": (n - 1) * (me == 0)}
    for algorithm, copies in kids.items():
        out[f"broadcast-{algorithm}"] = (
            sent(lambda a=algorithm: Broadcast(link, "bf16", algorithm=a, check=False,
                                               segment_bytes=SEGMENT)(x.clone(), 0)),
            copies * codec.payload_nbytes(x.numel()))
    assert len(byte_segments(codec.payload_nbytes(x.numel()), x.numel(), SEGMENT)) > 1
    traced = (sum(e.nbytes for e in events if e.direction == "send"), link.stats.bytes_sent)
    link.close()
    return {"sent": out, "traced": traced, "peers": sorted({e.peer for e in events})}


def _cases(n: int) -> list[tuple[Any, ...]]:
    """(op, codec, algorithm, check, shape, seed) of every case for a group of n."""
    cases: list[tuple[Any, ...]] = []
    i = 0
    for codec in CODECS:
        for algorithm in ("ring", "direct", "auto"):
            for shape in [(0, 3), (1,), (5, 3), (1100, 2)]:
                cases.append(("allgather", codec, algorithm, ("head", "handshake")[i % 2],
                              shape, i))
                i += 1
            for shape in [(n, 3), (3 * n, 5), (700 * n, 2)]:
                cases.append(("reducescatter", codec, algorithm, ("head", "handshake")[i % 2],
                              shape, i))
                i += 1
            for shape in [(0,), (7, 2), (3000,)]:  # from root i % n
                cases.append(("broadcast", codec, {"ring": "tree"}.get(algorithm, algorithm),
                              ("head", "handshake")[i % 2], shape, i))
                i += 1
    return cases


def _run_cases(ctx: DistContext, ranks: tuple[int, ...] | None) -> dict[str, Any]:
    group = world_group(ctx) if ranks is None else new_group(ctx, ranks, "three")
    if group is None:
        return {}  # rank 0 is outside the sub-group
    link = Link(ctx, group=group)
    failures = {}
    for op, codec, arg, check, shape, seed in _cases(group.size):
        if op == "allgather":
            why = _gather(group, link, codec, arg, check, shape, seed)
        elif op == "reducescatter":
            why = _scatter(group, link, codec, arg, check, shape, seed)
        else:
            why = _broadcast(group, link, codec, arg, check, shape, seed)
        if why is not None:
            failures[f"{op} {codec} {arg} {check} {shape}"] = why
    errors = []
    for bad in (lambda: ReduceScatter(link)(torch.ones(group.size + 1, 2)),
                lambda: Broadcast(link)(torch.ones(3), root=group.size)):
        try:
            bad()
        except SpecError as exc:
            errors.append(str(exc))
    link.close()
    return {"failures": failures, "cases": len(_cases(group.size)), "errors": errors,
            "bytes": _bytes(group, ctx)}


@pytest.mark.parametrize(("world", "ranks"), [(2, None), (3, None), (4, None), (4, SUBGROUP)])
def test_collectives_match_torch_distributed(world: int, ranks: tuple[int, ...] | None) -> None:
    results = run_on_ranks(_run_cases, world, ranks, timeout_s=300)
    members = [r for g, r in enumerate(results) if ranks is None or g in ranks]
    assert results[0] == {} or ranks is None
    for r in members:
        assert r["failures"] == {}, r["failures"]
        assert r["cases"] > 100
        for name, (got, want) in r["bytes"]["sent"].items():
            assert got == want, f"{name}: {got} bytes sent, the codec's payloads are {want}"
        assert r["bytes"]["traced"][0] == r["bytes"]["traced"][1]
        assert set(r["bytes"]["peers"]) <= set(ranks or range(world))  # global ranks
    if ranks is not None:
        n = len(ranks)
        names = ", ".join(map(str, ranks))
        assert members[0]["errors"] == [
            f"reduce-scatter cuts dim 0 into one chunk per member of the {n} members (global "
            f"ranks {names}), but x has shape ({n + 1}, 2): dim 0 ({n + 1}) is not divisible "
            f"by {n}; pad dim 0 to {2 * n}",
            f"broadcast root {n} is not a member index of the {n} members (global ranks "
            f"{names}): pass 0..{n - 1} (member i is the i-th of the group's ranks)"]


def _mismatch(ctx: DistContext, shapes: list[tuple[int, ...]], check: str) -> None:
    AllGather(Link(ctx), check=check)(torch.ones(shapes[ctx.rank]))


@pytest.mark.parametrize("check", ["head", "handshake"])
def test_mismatched_shapes_name_the_ranks_and_values(check: str) -> None:
    shapes = [(4, 3), (4, 3), (3, 4)]
    with pytest.raises(LaunchError, match=r"CommError: rank \d: all-gather arguments differ "
                                          r"across ranks \(shape: (\(4, 3\) on rank \d; \(3, 4\) "
                                          r"on rank 2|\(3, 4\) on rank 2; \(4, 3\))"):
        run_on_ranks(_mismatch, 3, shapes, check, comm_timeout_s=10, timeout_s=60)

