"""SGD with momentum and weight decay, and per-step learning-rate rules.

Rules (all per iteration, like Caffe in seed 001):
- `constant`: the peak rate throughout;
- `step`: peak * gamma ** (step // step_size)  (Caffe's "step" policy: base_lr, stepsize, gamma);
- `cosine`: peak * (1 + cos(pi * t)) / 2 over the whole run after warm-up;
- `grow` (Smith et al. 2018, "don't decay the learning rate, increase the batch size"):
  the peak rate throughout, while the global batch grows by 1/gamma every
  `grow_every_epochs` epochs (`BatchGrowth`); once the batch would pass `max_batch` it
  stays and the rate decays by gamma at those epochs instead.
The peak is `lr`, or `lr * global_batch / base_batch` with `scale_lr` (linear scaling,
Goyal et al. 2017). Warm-up (Goyal et al.'s gradual warm-up) ramps linearly over
`warmup_epochs` from `lr` (the unscaled rate) to the peak when scaling, or from
`peak / 10` otherwise, then the rule applies.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from approxdist.config.schema import OptimConfig


def make_sgd(model: nn.Module, cfg: OptimConfig) -> torch.optim.SGD:
    return sgd_over(model.parameters(), cfg)


def sgd_over(params: Iterable[nn.Parameter], cfg: OptimConfig) -> torch.optim.SGD:
    """`[optim]`'s SGD over `params` (a stage's, a server's shard)."""
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay, nesterov=cfg.nesterov)


class LRRule:
    """Learning rate as a pure function of the global step."""

    def __init__(self, cfg: OptimConfig, global_batch: int, steps_per_epoch: int,
                 epochs: int) -> None:
        self.cfg = cfg
        factor = global_batch / cfg.base_batch if cfg.scale_lr else 1.0
        self.peak = cfg.lr * factor
        self.start = cfg.lr if cfg.scale_lr else self.peak / 10
        self.warmup = int(round(cfg.warmup_epochs * steps_per_epoch))
        self.total = max(1, epochs * steps_per_epoch)

    def __call__(self, step: int) -> float:
        cfg = self.cfg
        if step < self.warmup:
            return self.start + (self.peak - self.start) * step / self.warmup
        if cfg.schedule in ("constant", "grow"):  # grow: BatchGrowth.lr_factor decays it
            return self.peak
        if cfg.schedule == "step":
            return self.peak * cfg.gamma ** (step // cfg.step_size)
        t = (step - self.warmup) / max(1, self.total - self.warmup)
        return self.peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


class BatchGrowth:
    """The global batch of each epoch under schedule `grow`, and the rate's factor once the
    batch is capped: epoch e has had n = e // grow_every_epochs growth points; the batch is
    B * k^j with k = round(1 / gamma) and j the points it could take without passing the
    cap (rounded down to a multiple of `multiple`), the rate peak * gamma^(n - j)."""

    def __init__(self, cfg: OptimConfig, batch: int, train_size: int, multiple: int = 1) -> None:
        self.cfg, self.batch, self.multiple = cfg, batch, max(1, multiple)
        self.factor = max(2, round(1 / cfg.gamma)) if cfg.gamma < 1 else 1
        self.cap = min(cfg.max_batch or train_size, train_size)

    @property
    def active(self) -> bool:
        return self.cfg.schedule == "grow"

    def _points(self, epoch: int) -> tuple[int, int]:
        n = epoch // self.cfg.grow_every_epochs if self.active else 0
        j = 0
        while j < n and self.batch * self.factor ** (j + 1) <= self.cap:
            j += 1
        return n, j

    def batch_at(self, epoch: int) -> int:
        """The global batch of epoch `epoch` (0-based)."""
        _, j = self._points(epoch)
        grown = self.batch * self.factor ** j
        return max(self.multiple, grown // self.multiple * self.multiple)

    def lr_factor(self, epoch: int) -> float:
        """The factor on the rate in epoch `epoch`: gamma per growth point past the cap."""
        n, j = self._points(epoch)
        return self.cfg.gamma ** (n - j)


def noise_scale(lr: float, momentum: float, train_size: int, batch: int) -> float:
    """The SGD noise scale g = lr / (1 - m) * (N / B - 1) (Smith and Le 2018; seed 003): the
    scale of the gradient noise SGD with momentum m injects at learning rate lr, training
    set size N and global batch B. Raising B lowers it as lowering lr does, the basis of
    growing the batch instead of decaying the learning rate (Smith et al. 2018)."""
    return lr / (1.0 - momentum) * (train_size / batch - 1.0)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
