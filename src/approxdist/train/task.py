"""What a data set's outputs and labels mean: the loss, the correct predictions, their count.

A data set names its task (`TensorDataset.task`) and every engine scores through it, so
a new kind of target changes this file only:
- `classify`: one class index per sample; logits (N, C); cross-entropy; `argmax(1)` hits.
- `next-token`: one class index per position; logits (N, T, V) over a vocabulary of V;
  cross-entropy averaged over every position, hits where `argmax(-1)` is the next token.

Losses are means over the batch's predictions (samples x positions); summed figures
count predictions (`Task.predictions`), so a test loss and an accuracy are per token
for text and per sample for images. A `Task` is also a pipeline loss function that
carries its own `hits` (`pipeline.stage.Criterion`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F  # noqa: N812

from approxdist.errors import DataError
from approxdist.registry import Registry

Score = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Task:
    """A mean loss and a hit count of (outputs, labels); callable as the loss."""

    name: str
    mean_loss: Score
    count_hits: Score

    def __call__(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.mean_loss(out, labels)

    def hits(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The number of correct predictions (an int64 scalar tensor)."""
        return self.count_hits(out, labels)

    def summed_loss(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss summed over the batch's predictions."""
        return self.mean_loss(out, labels) * labels.numel()

    @staticmethod
    def predictions(labels: torch.Tensor) -> int:
        """Predictions the labels ask for: one per sample, or one per position."""
        return labels.numel()

    @staticmethod
    def per_sample(labels: torch.Tensor) -> int:
        """Predictions per sample (1 for a class label, T for a sequence of T tokens)."""
        return labels[0].numel() if labels.dim() else 1


def _class_hits(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (out.argmax(1) == labels).sum()


def _token_loss(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))


def _token_hits(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (out.argmax(-1) == labels).sum()


TASKS: Registry[Task] = Registry("task", DataError)
TASKS.add("classify", Task("classify", F.cross_entropy, _class_hits))
TASKS.add("next-token", Task("next-token", _token_loss, _token_hits))


def task_named(name: str) -> Task:
    return TASKS.get(name)
