"""One replica's forward and backward under the recorder's phases (seed 002's vocabulary)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from approxdist.trace.phases import OPTIMIZER, RUN_BACK, RUN_FOR
from approxdist.trace.recorder import Recorder


def traced_backward(rec: Recorder, forward: Callable[[Any], Any],
                    loss_fn: Callable[[Any, Any], torch.Tensor], inputs: Any, targets: Any,
                    zero_grad: Callable[[], None]) -> tuple[Any, torch.Tensor]:
    """`run_for` (forward and loss), `optimizer` (the old gradients dropped), `run_back`
    (backward); the output and the loss."""
    with rec.span(RUN_FOR):
        out = forward(inputs)
        loss = loss_fn(out, targets)
    with rec.span(OPTIMIZER):
        zero_grad()
    with rec.span(RUN_BACK):
        loss.backward()
    return out, loss
