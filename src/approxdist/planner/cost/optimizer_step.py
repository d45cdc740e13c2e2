"""The optimizer's step after a flush: seconds per parameter byte and per parameter tensor; pure.

`torch.optim.SGD` on CPU loops over a model's tensors in Python, a few small operations
each (weight decay, momentum, the update), so its step costs per tensor as well as per
byte: both are measured on this machine (`planner.profiler.optimizer_s_per_byte` on one
large tensor, `optimizer_s_per_tensor` on many small ones) and priced here.
"""

from __future__ import annotations

from approxdist.planner.cost.pipeline import Stage
from approxdist.planner.profile import Profile


def optimizer_step_s(profile: Profile, stages: tuple[Stage, ...], s_per_byte: float,
                     s_per_tensor: float = 0.0) -> float:
    """The optimizer's step after the flush: every stage steps its own parameters at once,
    so the slowest stage's is on the step's path, each priced

        seconds per byte x its parameter bytes + seconds per tensor x its parameter tensors

    (`param_tensors`: SGD on CPU loops over the tensors, `planner.profiler`)."""
    return max(s_per_byte * sum(b.param_bytes for b in profile.blocks[st.first:st.end])
               + s_per_tensor * param_tensors(profile, st) for st in stages)


def param_tensors(profile: Profile, stage: Stage) -> int:
    """The parameter tensors of the stage's blocks: each block's `param_sizes`, or one per
    block that holds parameters where the profile does not list them (PipeDream's)."""
    return sum(len(b.param_sizes) if b.param_sizes else int(b.param_bytes > 0)
               for b in profile.blocks[stage.first:stage.end])
