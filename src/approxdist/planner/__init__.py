"""The planner: from a model's profile to a partition plan (docs/planner.md).

From a model's profile to a plan file (docs/planner.md); no module touches
torch.distributed. Validation against measured runs is not built yet.

- `profile`: the profile file (`Profile`, `BlockProfile`), validated, JSON round trip.
- `pipedream_format`: reader of PipeDream's graph.txt profiles, conversion to `Profile`.
- `antichains`: PipeDream's state space (antichain DAG of a layer graph, or a chain).
- `pipedream_optimizer`: PipeDream's hierarchical partition optimizer, reproduced.
- `cost/`: our cost model (link levels, codec costs, all-reduce times and their
  calibration, data-parallel / pipeline / hybrid step times, memory per stage).
- `profiler`: a model measured into a profile (imports torch, models and data sets).
- `objective`, `solver`: the closed-form objective and the DP over block ranges x workers.
- `search`: the solver's best plans re-ranked by event simulation; PipeDream's choice.
- `cluster`, `plan_file`: the cluster a plan is for; the plan file.
- `scaling`: seed 001's speed-up s(N,b) at scale with labelled inputs and a band.
"""

from approxdist.planner.antichains import State, StateSpace, chain_states, graph_states
from approxdist.planner.pipedream_format import (
    PipeDreamGraph,
    PipeDreamNode,
    parse_graph,
    read_graph,
    read_pipedream_profile,
    to_profile,
)
from approxdist.planner.pipedream_optimizer import (
    Level,
    PipeDreamPlan,
    PipeDreamSettings,
    PlannedStage,
    optimize,
)
from approxdist.planner.profile import (
    BlockProfile,
    Profile,
    from_json,
    read_profile,
    to_json,
    write_profile,
)

__all__ = [
    "BlockProfile", "Level", "PipeDreamGraph", "PipeDreamNode", "PipeDreamPlan",
    "PipeDreamSettings", "PlannedStage", "Profile", "State", "StateSpace", "chain_states",
    "from_json", "graph_states", "optimize", "parse_graph", "read_graph",
    "read_pipedream_profile", "read_profile", "to_json", "to_profile", "write_profile",
]
