"""PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019): rank-r power iteration with warm start.

Each step, for the gradient viewed as an n x m matrix M (its first dimension by the
rest, as torch's `powerSGD_hook` does) plus the error-feedback residual:
    Q <- orthogonalise(Q)      (warm start: last step's averaged Q; first step: seeded normal)
    P <- M Q;                  all-reduce P (sum)
    P <- orthogonalise(P)      (Gram-Schmidt on the columns)
    Q <- M^T P;                all-reduce Q, divide by the world size
    out <- P Q^T;              residual <- M - out
P and Q are the messages: (n + m) * r fp32 values instead of n * m. The steps follow
torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py (torch 2.x, `powerSGD_hook`:
residual added at l.425, Q re-orthogonalised at l.544 or drawn at l.552-561, P = MQ at
l.565, P orthogonalised at l.595, Q = M^T P at l.599, Q / world at l.615, PQ^T at l.618,
residual at l.637); the first Q is drawn as the hook draws it for the same `seed`.
"""

from __future__ import annotations

import numpy as np
import torch

from approxdist.comm.compressors.base import SumExchange, Summed
from approxdist.errors import ConfigError, SpecError


def orthogonalise(matrix: torch.Tensor) -> None:
    """Gram-Schmidt on the columns of the 2-D `matrix`, in place; a zero column stays zero."""
    for i in range(matrix.shape[1]):
        col = matrix[:, i:i + 1]
        norm = torch.linalg.vector_norm(col)
        if norm > 0:
            col.div_(norm)
        else:
            col.zero_()
        if i + 1 < matrix.shape[1]:
            rest = matrix[:, i + 1:]
            rest.sub_(torch.sum(col * rest, dim=0, keepdim=True) * col)


def hook_seed(seed: int) -> int:
    """The torch seed `powerSGD_hook` draws its first Q with for `random_seed=seed` (l.552)."""
    return int(np.random.RandomState(seed).randint(1_000_000_000))


class PowerSGD(Summed):
    """Rank-r PowerSGD of one tensor of two or more dimensions, with error feedback."""

    feedback = True
    rounds = 2

    def __init__(self, rank: int, shape: torch.Size | tuple[int, ...], *, seed: int = 0,
                 name: str = "", device: torch.device | None = None) -> None:
        spec = f"powersgd:{rank}"
        if len(shape) < 2:
            what = f"{name!r} of shape {tuple(shape)}" if name else f"a tensor of shape {tuple(shape)}"
            raise ConfigError(f"{spec} cannot compress {what}: PowerSGD needs a matrix (2 or more "
                              f"dimensions); send 1-D tensors with another codec by a rule before "
                              f"the default, e.g. --codec-rule '*.bias=fp32' (wire.grad.rules)")
        super().__init__(spec, shape, device)
        self.rows = int(shape[0])
        self.cols = self.numel // self.rows
        self.rank = min(rank, self.rows, self.cols)
        gen = torch.Generator().manual_seed(hook_seed(seed))
        q = torch.randn(1, self.cols, self.rank, generator=gen)[0]
        self.state["q"] = q.to(self.device)

    def wire_bytes(self) -> int:
        return 4 * (self.rows + self.cols) * self.rank

    def exchange(self, grad: torch.Tensor, world: int, out: torch.Tensor | None = None,
                 sent: torch.Tensor | None = None) -> SumExchange:
        m = self._flat(grad).view(self.rows, self.cols)
        q = self.state["q"]
        orthogonalise(q)
        p = yield m @ q
        p = p.clone()
        orthogonalise(p)
        q_own = m.t() @ p
        if sent is not None:  # this worker's share of P Q^T: M projected on the shared P
            torch.mm(p, q_own.t(), out=sent.view(self.rows, self.cols))
        q_sum = yield q_own
        q.copy_(q_sum).div_(world)
        approx = p @ q.t()
        torch.sub(m.view(-1), approx.view(-1), out=self.state["residual"])
        if out is not None:
            return out.view(-1).copy_(approx.view(-1)).view(self.shape)
        return approx.view(self.shape)


def parse_rank(text: str | None) -> int:
    """`powersgd:<r>` -> r, a positive integer."""
    if text is None or not text.isdigit() or int(text) < 1:
        raise SpecError(f"powersgd rank {text!r} must be a positive integer (the rank of the "
                          f"approximation, usually 1 to 4); e.g. powersgd:2")
    return int(text)
