"""Memory per stage of a plan: parameters, gradients, optimizer state, activations in flight.

Per stage of blocks [first, end), from the profile's per-block bytes:

- parameters P = sum of `param_bytes`; gradients G = P (fp32, one per parameter);
- optimizer state = k P with k the state copies the optimizer keeps per parameter:
  `sgd` 0, `momentum` 1 (SGD's momentum buffer, what `train.optim` builds), `adam` 2
  (first and second moments; Kingma and Ba 2015);
- activations = (peak micro-batches in flight) x sum of `stash_bytes` (what the blocks keep
  for backward, per micro-batch). The peak is read off the schedule the ranks run
  (`peak_in_flight`: forwards run and backwards not yet, the most at any point of a rank's
  list), the largest over a stage's replicas: M on every GPipe stage, min(P - s, M) on
  stage s of 1F1B (PipeDream-Flush), fewer on a replicated stage that deals micro-batches
  round robin.

Buffers of messages in transit, the framework's workspace and the data are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.errors import ConfigError
from approxdist.pipeline.schedule import peak_in_flight
from approxdist.planner.cost.pipeline import PipelinePlan
from approxdist.planner.profile import Profile

#: optimizer state copies per parameter
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2}


@dataclass(frozen=True)
class StageMemory:
    """Bytes one rank of a stage holds."""

    stage: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    in_flight: int  # micro-batches whose activations are kept at the peak
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes


def stage_memory(profile: Profile, plan: PipelinePlan,
                 optimizer: str = "momentum") -> tuple[StageMemory, ...]:
    """Memory of one rank of each stage of `plan` (data parallel: one stage, r replicas)."""
    if optimizer not in OPTIMIZER_STATES:
        raise ConfigError(f"optimizer {optimizer!r} has no known state size; valid: "
                          f"{', '.join(OPTIMIZER_STATES)}")
    plan.check_covers(profile)
    order, _ = plan.order()
    peaks = peak_in_flight(order)
    out = []
    for s, st in enumerate(plan.stages):
        blocks = profile.blocks[st.first:st.end]
        params = sum(b.param_bytes for b in blocks)
        stash = sum(b.stash_bytes for b in blocks)
        in_flight = max(peaks.get(slot, 0) for slot in plan.slots(s))
        out.append(StageMemory(s, params, params, OPTIMIZER_STATES[optimizer] * params,
                               in_flight, in_flight * stash))
    return tuple(out)

