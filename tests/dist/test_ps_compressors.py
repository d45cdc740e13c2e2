"""Compressors on parameter-server pushes, 3 gloo ranks, against one process.

Sync, one server and two workers: the server's updates equal one process that compresses
each worker's gradient with the same compressors, combines them as the data-parallel
collective would (`tests/helpers/lockstep.py`: summed messages, or every payload decoded
and averaged, or signSGD's vote) and steps SGD, bit for bit over 3 steps. Async, two
servers and one worker: each push is applied alone (signSGD: the worker's own signs;
random-k: the server's copy of the shared index stream follows the worker's pushes across
both shards). Each push holds the version word and exactly the compressors' `wire_bytes()`,
and a run resumed from `state_dict()` (the workers' residuals and streams, the server's
copies of random-k's streams) continues bit for bit. The run's seed is SEED, and the
oracle's compressors take their streams from it by `Where`'s rule, as the workers' and the
server's do. One set of processes runs every case.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.nn import functional as F  # noqa: N812

import approxdist
from approxdist.comm.compressors import Where, get_compressor
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from tests.helpers.lockstep import lockstep
from tests.helpers.tiny_mlp import batch, net

#: name -> (push codec, mode, servers); ranks 0.. serve, the rest are workers
CASES = {"topk": ("topk:0.25", "sync", 1),
         "randomk": ("randomk:0.25", "sync", 1),
         "qsgd": ("qsgd:4", "sync", 1),
         "terngrad": ("terngrad", "sync", 1),
         "sign+ef": ("sign+ef", "sync", 1),
         "signsgd": ("signsgd", "sync", 1),
         "randomk async": ("randomk:0.25", "async", 2),
         "signsgd async": ("signsgd", "async", 2)}
STEPS, SAVED_AT, RANKS = 3, 2, 3
#: the run's seed: every compressor's streams derive from it and the parameter's name
SEED = 7


def _ps(codec: str, mode: str, servers: int) -> approxdist.ParameterServer:
    return approxdist.ParameterServer(net(), servers=servers, mode=mode, steps=1,
                                      push_codec=codec, seed=SEED,
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.1))


def _rounds(ps: approxdist.ParameterServer, steps: range) -> None:
    for s in steps:
        if ps.is_server:
            ps.serve()
        else:
            ps.step(*batch(ps.index, s))


def _case(codec: str, mode: str, servers: int) -> dict[str, Any]:
    ps = _ps(codec, mode, servers)
    _rounds(ps, range(SAVED_AT))
    saved = ps.state_dict()
    before = _sent(ps)
    _rounds(ps, range(SAVED_AT, STEPS))
    out: dict[str, Any] = {"server": ps.is_server, "params": ps.module.state_dict(),
                           "bytes": _sent(ps) - before}
    ps.close()
    resumed = _ps(codec, mode, servers)
    resumed.load_state_dict(saved)
    _rounds(resumed, range(SAVED_AT, STEPS))
    out["resumed"] = resumed.module.state_dict()
    resumed.close()
    return out


def _sent(ps: approxdist.ParameterServer) -> int:
    """Bytes this rank has sent (its links out)."""
    return sum(n for link, n in ps.link_bytes().items()
               if link.startswith(f"{ps.link.me}->"))


def _all(ctx: DistContext) -> dict[str, Any]:
    return {name: _case(*case) for name, case in CASES.items()}


def oracle(codec: str, workers: int) -> dict[str, torch.Tensor]:
    """One process: each worker's gradient compressed, combined as data parallelism's
    collective combines them, one SGD step a round."""
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    comps = {n: [get_compressor(codec, Where(tuple(p.shape), n, SEED, w))
                 for w in range(workers)] for n, p in named}
    for s in range(STEPS):
        grads = []
        for w in range(workers):
            model.zero_grad()
            F.cross_entropy(model(batch(w, s)[0]), batch(w, s)[1]).backward()
            grads.append({n: p.grad.clone() for n, p in named if p.grad is not None})
        for n, p in named:
            p.grad = lockstep(comps[n], [g[n] for g in grads])[0]
        opt.step()
    return model.state_dict()


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_on_ranks(_all, RANKS)


@pytest.mark.parametrize("name", list(CASES))
def test_the_servers_updates_equal_one_process_compressing_each_workers_gradient(
        ranks: list[dict[str, Any]], name: str) -> None:
    codec, _, servers = CASES[name]
    expected = oracle(codec, RANKS - servers)
    for rank, out in enumerate(ranks):
        if out[name]["server"]:
            continue
        for key, value in expected.items():
            assert torch.equal(out[name]["params"][key], value), (rank, key)


@pytest.mark.parametrize("name", list(CASES))
def test_a_push_is_the_version_word_and_the_compressors_wire_bytes(
        ranks: list[dict[str, Any]], name: str) -> None:
    codec, _, servers = CASES[name]
    expected = servers * 8 + sum(get_compressor(codec, Where(tuple(p.shape), n)).wire_bytes()
                                 for n, p in net().named_parameters())
    sent = [out[name]["bytes"] for out in ranks if not out[name]["server"]]
    assert sent == [expected] * (RANKS - servers)


@pytest.mark.parametrize("name", list(CASES))
def test_a_resumed_run_continues_bit_for_bit(ranks: list[dict[str, Any]], name: str) -> None:
    for out in ranks:
        for key, value in out[name]["params"].items():
            assert torch.equal(out[name]["resumed"][key], value), key
