"""What the benchmarks feed a model: synthetic inputs and labels of its kind, and its loss.

Image and vector models take Gaussian inputs of the bench's shape and one class label per
sample (cross-entropy over `classes`); the GPT models (`gpt-tiny`, ...) take byte tokens
of `seq_len` positions and one next-token label per position, the vocabulary of
`stdlib-text` (cross-entropy over every position), so `bench dp`, `bench pipeline` and
`bench hybrid` time a transformer as `train --dataset stdlib-text` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F  # noqa: N812

from approxdist.data.text import VOCAB
from approxdist.models.gpt import SIZES as GPT_SIZES

SEQ_LEN = 64


@dataclass(frozen=True)
class BenchInput:
    """One sample's shape, the classes (or vocabulary), and whether samples are tokens."""

    shape: tuple[int, ...]
    classes: int = 10
    tokens: bool = False

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """`n` inputs and their labels, drawn from `gen`."""
        if self.tokens:
            ids = torch.randint(0, self.classes, (n, self.shape[0] + 1), generator=gen)
            return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        x = torch.randn((n, *self.shape), generator=gen)
        return x, torch.randint(0, self.classes, (n,), generator=gen)

    def loss(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the samples (and positions)."""
        if self.tokens:
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))
        return F.cross_entropy(out, labels)


def bench_input(model: str, image_shape: tuple[int, ...], classes: int = 10) -> BenchInput:
    """Tokens for a GPT model, else `image_shape` with `classes` classes."""
    if model in GPT_SIZES:
        return BenchInput((SEQ_LEN,), VOCAB, tokens=True)
    return BenchInput(image_shape, classes)
