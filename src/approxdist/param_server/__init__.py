"""Parameter server (seed 003): parameters sharded over servers, workers push gradients and
pull parameters through the link layer; sync, async, stale-synchronous and N+b modes.

* `sharding` — which server holds which parameter, balanced by bytes (pure);
* `modes` — the `--ps-mode` string: sync, async, ssp:<s>, backup:<b> (pure);
* `rules` — what a server does with each arriving gradient under a mode (pure);
* `roles` — which global rank is which server or worker (pure);
* `steplog` — what a server step did, push by push: its step record and push order (pure);
* `server`, `worker` — the two ends, talking only through a `comm.link.Link`;
* `node` — this rank's end (server or worker) of a run, and its rounds;
* `steps` — one server step and one worker step of a node, traced and timed;
* `state` — a node's state saved and restored (checkpoints) or snapshot (AdaPrec).
"""

from approxdist.param_server.modes import PSMode, parse_mode
from approxdist.param_server.roles import Roles
from approxdist.param_server.rules import ServerRules, Verdict
from approxdist.param_server.sharding import shard_by_bytes

__all__ = ["PSMode", "Roles", "ServerRules", "Verdict", "parse_mode", "shard_by_bytes"]
