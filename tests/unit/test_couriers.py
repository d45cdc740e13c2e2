"""Communication-thread strategies on a fake link: who posts what, in which order."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest
import torch

from approxdist.comm.link import Link
from approxdist.errors import ConfigError
from approxdist.pipeline.couriers import Courier, Plan, make_courier


class _Handle:
    def __init__(self, link: _FakeLink, what: str) -> None:
        self.link, self.what = link, what

    def wait(self) -> str:
        self.link.done.append(self.what)
        return self.what


class _FakeLink:
    """Records the order in which sends and receives are posted, and by which thread."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.posted: list[tuple[str, str]] = []
        self.done: list[str] = []

    def global_rank(self, peer: int) -> int:
        return peer

    def isend_bytes(self, data: torch.Tensor, peer: int) -> _Handle:
        return self._post(f"send{int(data[0])}->{peer}")

    def irecv_bytes(self, peer: int, into: torch.Tensor) -> _Handle:
        return self._post(f"recv{int(into[0])}<-{peer}")

    def _post(self, what: str) -> _Handle:
        self.posted.append((what, threading.current_thread().name))
        return _Handle(self, what)


def _courier(link: _FakeLink, strategy: str, plan: Plan | None = None) -> Courier:
    return make_courier(cast(Link, link), strategy, plan=plan)


def _t(i: int) -> torch.Tensor:
    return torch.tensor([i], dtype=torch.uint8)


def test_sra_posts_in_the_agreed_order_whatever_the_submission_order() -> None:
    link = _FakeLink()
    plan = {1: ["send", "send", "recv", "send", "recv"]}
    courier = _courier(link, "sra", plan=lambda m, train: plan)
    courier.begin(4, train=True)
    # the executor pre-posts receives before it has the sends ready
    futures = [courier.recv(1, _t(0)), courier.recv(1, _t(1)), courier.send(1, _t(0)),
               courier.send(1, _t(1)), courier.send(1, _t(2))]
    assert [f.wait() for f in futures] == ["recv0<-1", "recv1<-1", "send0->1", "send1->1",
                                           "send2->1"]
    assert [w for w, _ in link.posted] == ["send0->1", "send1->1", "recv0<-1", "send2->1",
                                           "recv1<-1"]
    assert {t for _, t in link.posted} == {"approxdist-comm both rank 1"}
    assert courier.threads == 1
    courier.close()


def test_sa_and_per_message_use_a_thread_per_peer_and_direction() -> None:
    for strategy in ("sa", "per-message"):
        link = _FakeLink()
        courier = _courier(link, strategy)
        courier.begin(2, train=True)  # no agreed order needed
        futures = [courier.recv(1, _t(0)), courier.send(1, _t(0)), courier.send(2, _t(1))]
        assert [f.wait() for f in futures] == ["recv0<-1", "send0->1", "send1->2"]
        assert sorted(t for _, t in link.posted) == [
            "approxdist-comm recv rank 1", "approxdist-comm send rank 1",
            "approxdist-comm send rank 2"]
        courier.close()


def test_errors_reach_the_waiter_and_bad_strategies_are_refused() -> None:
    link = _FakeLink()

    def broken(data: torch.Tensor, peer: int) -> Any:
        raise RuntimeError("peer 1 closed the connection")

    link.isend_bytes = broken  # type: ignore[method-assign]
    courier = _courier(link, "sa")
    with pytest.raises(RuntimeError, match="peer 1 closed"):
        courier.send(1, _t(0)).wait()
    courier.close()
    with pytest.raises(ConfigError, match="'two' is not one of: inline, per-message, sa, sra"):
        _courier(link, "two")
    with pytest.raises(ConfigError, match="sra needs the schedule's message order"):
        _courier(link, "sra")
