"""The compressor contract: one tensor's gradient -> the messages a collective combines -> the average.

A compressor (Vogels et al. 2019's "all-reduce compatible" distinction; GRACE, Xu et al.
2021) belongs to one tensor of one worker and keeps that tensor's state (error-feedback
residual, warm-start factors, random stream). Its `exchange(grad, world)` is a generator
that yields each message this worker sends and receives what the collective made of all
workers' messages:

* `Summed` (all-reduce compatible): yields fp32 tensors, receives their sum over workers,
  possibly in several rounds (PowerSGD's P, then Q); returns the workers' average.
* `Gathered` (needs all-gather): yields one `Payload` of real bytes, receives every
  worker's payload in worker order; returns their aggregate (the mean of the decoded
  tensors, or a vote).

The core is pure: no torch.distributed here. Whoever owns a collective drives the
generator (`run_alone` is the world of one); tests drive N of them in lockstep.

A compressor of one round can also travel where no collective runs (a parameter server's
pushes): `message` is a worker's one message as bytes, its state updated as by an
exchange, and a receiver's copy `unpack`s each worker's message and `aggregate`s them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Mapping
from typing import Any, ClassVar, Literal

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.errors import ConfigError

Collective = Literal["all-reduce", "all-gather"]
SumExchange = Generator[torch.Tensor, torch.Tensor, torch.Tensor]
GatherExchange = Generator[Payload, list[Payload], torch.Tensor]


class Compressor(ABC):
    """One tensor's compressor on one worker, with the state that must survive a resume."""

    collective: ClassVar[Collective]
    #: whether the residual of what was dropped is added to the next step's gradient
    feedback: ClassVar[bool] = False
    #: messages a worker sends per step (PowerSGD: P, then Q)
    rounds: ClassVar[int] = 1
    #: whether a receiver's `unpack` draws from the sender's random stream (random-k's
    #: indices), so that a receiver keeps one copy per sender
    per_sender: ClassVar[bool] = False

    def __init__(self, spec: str, shape: torch.Size | tuple[int, ...],
                 device: torch.device | None = None) -> None:
        self.spec = spec
        self.shape = torch.Size(shape)
        self.numel = self.shape.numel()
        self.device = device or torch.device("cpu")
        #: every tensor saved by `state_dict`, bit for bit
        self.state: dict[str, torch.Tensor] = {}
        if self.feedback:
            self.state["residual"] = torch.zeros(self.numel, device=self.device)
        self.generator: torch.Generator | None = None
        #: gradient plus residual of the step under way (error feedback), reused every step
        self._sum: torch.Tensor | None = None

    @abstractmethod
    def wire_bytes(self) -> int:
        """Bytes this worker contributes per step (every round's message together)."""

    @abstractmethod
    def exchange(self, grad: torch.Tensor, world: int, out: torch.Tensor | None = None,
                 sent: torch.Tensor | None = None) -> Generator[Any, Any, torch.Tensor]:
        """Yield this worker's messages, receive what the collective made of them (a sum, or
        every worker's payload); return what every worker applies: in `out` (a contiguous
        fp32 tensor of `numel` values on the compressor's device, written once every message
        is sent, so it may be `grad` itself) viewed as `grad`'s shape, or a new tensor.
        `sent` (flat fp32, `numel`; AdaPrec's measurement, `comm.update_error`): where given,
        this worker's contribution is written there before its last message goes: the
        values whose mean over the workers is the result (a vote's are its signs), error
        feedback's old residual included (top-k, sign+ef, random-k: gradient plus old
        residual minus new residual, as `comm.error_feedback` counts a codec's)."""

    def bytes_per_value(self) -> float:
        return self.wire_bytes() / max(self.numel, 1)

    def message(self, grad: torch.Tensor) -> torch.Tensor:
        """This worker's one message of a step as 1-D uint8 bytes (`wire_bytes()` of them),
        its residual and streams updated as by `exchange`: for a sender that does not take
        part in the aggregation (a parameter-server push). One-round compressors only."""
        assert self.rounds == 1, f"{self.spec} sends {self.rounds} messages a step"
        exchange = self.exchange(grad, 1)
        first = next(exchange)
        exchange.close()  # what is left of the exchange is the aggregation
        data = first.data if isinstance(first, Payload) else first.contiguous().view(torch.uint8)
        return data.reshape(-1)

    def unpack(self, data: torch.Tensor) -> torch.Tensor:
        """The flat fp32 tensor one worker's `message` stands for (a receiver's copy)."""
        raise NotImplementedError(f"{self.spec} has no single message to unpack")

    def aggregate(self, decoded: list[torch.Tensor]) -> torch.Tensor:
        """The workers' aggregate of their decoded tensors, summed in worker order."""
        return self.finish(in_order(decoded), len(decoded))

    def finish(self, total: torch.Tensor, count: int) -> torch.Tensor:
        """The aggregate of `count` workers from their sum: the mean (votes override this;
        a sum of one is its own mean)."""
        return total.div_(count) if count > 1 else total

    def _flat(self, grad: torch.Tensor) -> torch.Tensor:
        """`grad` as flat fp32 (a copy plus the residual where error feedback is on)."""
        if grad.numel() != self.numel:
            raise ConfigError(f"{self.spec} was built for a tensor of shape {tuple(self.shape)} "
                              f"but got one of shape {tuple(grad.shape)}; build one compressor "
                              f"per tensor")
        x = grad.detach().reshape(-1).to(device=self.device, dtype=torch.float32)
        if not self.feedback:
            return x  # encoders never write to x
        if self._sum is None:
            self._sum = torch.empty(self.numel, device=self.device)
        return torch.add(x, self.state["residual"], out=self._sum)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of the residual, factors and random stream (bitwise resume)."""
        out = {k: v.clone() for k, v in self.state.items()}
        if self.generator is not None:
            out["rng"] = self.generator.get_state()
        return out

    def load_state_dict(self, saved: Mapping[str, torch.Tensor]) -> None:
        want = set(self.state) | ({"rng"} if self.generator is not None else set())
        if set(saved) != want:
            raise ConfigError(f"{self.spec} state has entries {sorted(saved)} but this compressor "
                              f"keeps {sorted(want)}; was it saved with another compressor?")
        for key, value in saved.items():
            if key == "rng":
                assert self.generator is not None
                self.generator.set_state(value)
                continue
            if value.shape != self.state[key].shape:
                raise ConfigError(f"{self.spec} state {key!r} has shape {tuple(value.shape)}, "
                                  f"expected {tuple(self.state[key].shape)}; was it saved for "
                                  f"another tensor?")
            self.state[key].copy_(value)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sum": None}  # a work buffer: not worth a copy

    def __repr__(self) -> str:
        return f"<compressor {self.spec} {tuple(self.shape)}>"


class Summed(Compressor):
    """All-reduce compatible: messages are fp32 tensors whose sum over workers is meaningful."""

    collective = "all-reduce"

    @abstractmethod
    def exchange(self, grad: torch.Tensor, world: int, out: torch.Tensor | None = None,
                 sent: torch.Tensor | None = None) -> SumExchange:
        """Yield each round's message, receive its sum over `world` workers; return the average
        (in `out` where given)."""


class Gathered(Compressor):
    """Needs all-gather: one payload of bytes a worker; every worker decodes all of them."""

    collective = "all-gather"

    @abstractmethod
    def encode(self, x: torch.Tensor) -> Payload:
        """The payload of the flat fp32 `x` (residual already added)."""

    @abstractmethod
    def decode(self, payload: Payload) -> torch.Tensor:
        """The flat fp32 tensor a payload stands for."""

    def decode_add(self, payload: Payload, dest: torch.Tensor) -> None:
        """`dest += decode(payload)` (flat fp32 `dest`; fused where a subclass can)."""
        dest.add_(self.decode(payload))

    def decode_into(self, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        """`decode(payload)`, written into the contiguous fp32 `out` where one is given."""
        decoded = self.decode(payload)
        return decoded if out is None else out.view(-1).copy_(decoded)

    def encode_feedback(self, x: torch.Tensor) -> Payload:
        """`encode(x)`, and with error feedback the residual `x - decode(payload)`."""
        payload = self.encode(x)
        if self.feedback:
            torch.sub(x, self.decode(payload), out=self.state["residual"])
        return payload

    def unpack(self, data: torch.Tensor) -> torch.Tensor:
        return self.decode(Payload(data, self.shape))

    def combine(self, payloads: list[Payload], out: torch.Tensor | None = None) -> torch.Tensor:
        """The aggregate of every worker's payload (in `out` where given): the first decoded,
        the others added in worker order (the sums `aggregate` of their decoded tensors makes)."""
        total = self.decode_into(payloads[0], out)
        for payload in payloads[1:]:
            self.decode_add(payload, total)
        return self.finish(total, len(payloads))

    def exchange(self, grad: torch.Tensor, world: int, out: torch.Tensor | None = None,
                 sent: torch.Tensor | None = None) -> GatherExchange:
        payload = self.outgoing(grad, sent)
        gathered = yield payload
        if len(gathered) != world:
            raise ConfigError(f"{self.spec}: gathered {len(gathered)} payloads for a world of "
                              f"{world}")
        return self.combine(gathered, out).view(self.shape)

    def outgoing(self, grad: torch.Tensor, sent: torch.Tensor | None = None) -> Payload:
        """This worker's payload of `grad` (with error feedback: plus the residual, which is
        updated); `sent` as in `exchange`."""
        x = self._flat(grad)
        payload = self.encode_feedback(x)
        if sent is not None:  # with feedback x - (x - Q(x)), as `comm.update_error` counts it
            sent.copy_(x - self.state["residual"] if self.feedback else self.decode(payload))
        return payload


def in_order(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The sum of `tensors` added in list order (the same bits on every worker)."""
    total = tensors[0].clone()
    for t in tensors[1:]:
        total.add_(t)
    return total


def seeded(seed: int) -> torch.Generator:
    """A CPU generator for one compressor's random stream."""
    return torch.Generator().manual_seed(seed)


def start_alone(compressor: Compressor, grad: torch.Tensor, out: torch.Tensor | None = None,
                ) -> tuple[Generator[Any, Any, torch.Tensor], Any]:
    """Begin one exchange in a world of one (its result into `out` where given): (the
    exchange, its first message)."""
    exchange = compressor.exchange(grad, 1, out)
    return exchange, next(exchange)


def finish_alone(exchange: Generator[Any, Any, torch.Tensor], message: Any) -> torch.Tensor:
    """Run a world-of-one exchange to its end, handing back what its collective would: each
    message itself (a sum over one worker) or a list of its one payload."""
    while True:
        try:
            message = exchange.send([message] if isinstance(message, Payload) else message)
        except StopIteration as stop:
            result: torch.Tensor = stop.value
            return result


def run_alone(compressor: Compressor, grad: torch.Tensor) -> torch.Tensor:
    """One exchange in a world of one (what a single worker would apply)."""
    return finish_alone(*start_alone(compressor, grad))
