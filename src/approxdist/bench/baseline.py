"""Whether a torch baseline computed what ours did: its losses within fp32 rounding of ours.

A benchmark times torch against us only on the same model and batches; the losses of the
first steps tell (the same sums, accumulated in another order, differ by fp32 rounding).
"""

from __future__ import annotations

from approxdist.errors import ApproxDistError

#: torch's and our losses of the same step may differ by this much, relative
LOSS_RTOL = 1e-5


class BaselineMismatch(ApproxDistError):
    """Torch and ours computed different losses on the same step: the times would not compare."""


def beyond_rounding(ours: float, theirs: float) -> bool:
    """Whether two losses of the same step differ by more than fp32 rounding (`LOSS_RTOL`)."""
    return abs(ours - theirs) > LOSS_RTOL * max(1.0, abs(theirs))
