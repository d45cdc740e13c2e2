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

from approxdist.data.base import TensorDataset
from approxdist.errors import DataError, ModelError
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

    def evaluate(self, out: torch.Tensor, labels: torch.Tensor) -> tuple[float, int, int]:
        """(summed loss, correct, predictions) of one batch's outputs."""
        return (float(self.summed_loss(out, labels).item()), int(self.hits(out, labels).item()),
                self.predictions(labels))

    def score(self, out: torch.Tensor, labels: torch.Tensor) -> tuple[float, int, int]:
        """(the true class's probability summed, correct, predictions) of one batch's
        outputs (AdaPrec's signal)."""
        return (float(self.soft_sum(out, labels)), int(self.hits(out, labels).item()),
                self.predictions(labels))

    @staticmethod
    def soft_sum(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The probability of the true class summed over the batch's predictions (AdaPrec's
        soft signal; the class axis is the last one of a token model's logits, 1 of a
        classifier's)."""
        axis = 1 if out.dim() == 2 else -1
        probs = F.softmax(out.float(), dim=axis)
        return probs.gather(axis, labels.unsqueeze(axis)).sum().double()

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


@torch.no_grad()
def check_fits(model: torch.nn.Module, data: TensorDataset, name: str) -> None:
    """Run `model` on two training samples: `ModelError` unless it gives one score per class
    (per token) for each label, i.e. an output of shape (*labels.shape, classes)."""
    x, y = data.train_x[:2], data.train_y[:2]
    was_training = model.training
    model.eval()
    try:
        out = model(x)
    except Exception as exc:  # noqa: BLE001 - a model that cannot eat the data: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"model {name!r} fails on data set {data.name!r} (inputs "
                         f"{list(x.shape[1:])} {x.dtype}): {first}; {_hint(data)}") from None
    finally:
        model.train(was_training)
    want = (*y.shape, data.num_classes)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(f"model {name!r} gives {got} for 2 samples of {data.name!r}; its "
                         f"{data.task!r} task needs {list(want)} (one score per class"
                         f"{' per token' if y.dim() > 1 else ''}); {_hint(data)}")


def _hint(data: TensorDataset) -> str:
    if data.task == "next-token":
        return "use a language model such as --model gpt-tiny"
    return "use a classifier such as --model mlp, or end yours in one score per class"
