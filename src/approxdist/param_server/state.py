"""A `PSNode`'s state: saved and restored over its group (checkpoints), or snapshot on one
rank without collectives (AdaPrec's speculation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from approxdist.errors import ConfigError
from approxdist.param_server.node import PSNode


def gather_state(node: PSNode) -> dict[str, Any]:
    """Every server's shard and optimiser state and every (surviving) worker's
    error-feedback residuals, gathered on every rank (a collective over the node's group);
    the floating-point buffers (equal on every worker after a round)."""
    mine: dict[str, Any] = {"steps": node.steps_run}
    server, worker = node.server, node.worker
    if server is not None:
        mine["server"] = {"params": [p.detach().cpu().clone() for p in server.params],
                          "optimizer": server.optimizer.state_dict()}
        if server.decoders is not None:
            mine["server"]["decoders"] = server.decoders.state_dict()
    elif worker is not None and worker.keeps_state:
        mine["feedback"] = (worker.index, worker.state_dict())
    gathered = node.group.all_gather_object(mine)
    return {"servers": [g["server"] for g in gathered if "server" in g],
            "feedback": {str(w): f for w, f in (g["feedback"] for g in gathered
                                                 if "feedback" in g)},
            "buffers": {k: b.detach().cpu().clone() for k, b in node.module.named_buffers()},
            "steps": max(g["steps"] for g in gathered)}


def load_state(node: PSNode, state: Mapping[str, Any]) -> None:
    """Put `state` (`gather_state`'s) back on this rank; a collective: the workers then pull
    the loaded parameters."""
    servers = state["servers"]
    if len(servers) != node.roles.servers:
        raise ConfigError(f"the state holds {len(servers)} server shard(s) but this run "
                          f"has {node.roles.servers} server(s); load it with "
                          f"--servers {len(servers)} (servers={len(servers)})")
    server, worker = node.server, node.worker
    if server is not None:
        saved = servers[server.index]
        with torch.no_grad():
            for p, v in zip(server.params, saved["params"]):
                p.copy_(v)
        server.optimizer.load_state_dict(saved["optimizer"])
        if server.decoders is not None:
            server.decoders.load_state_dict(saved.get("decoders", {}))
    if worker is not None and worker.keeps_state:
        # a worker lost before the state was saved has none: it starts from zero
        worker.load_state_dict(state.get("feedback", {}).get(str(worker.index), {}))
    buffers = dict(node.module.named_buffers())
    with torch.no_grad():
        for name, value in state.get("buffers", {}).items():
            buffers[name].copy_(value)
    node.steps_run = int(state.get("steps", 0))
    node.start()  # every worker starts again from the servers' parameters
    if server is not None:
        server.settle()  # the replies are out before the server goes on (or closes)


def local_state(node: PSNode) -> dict[str, Any]:
    """This rank's state without collectives, as references (an in-process snapshot copies
    it): the model (a server's shard is its parameters), a server's optimiser state and
    bookkeeping, a worker's residuals and versions, the round's counters. Only between steps
    of a sync run, where nothing is in flight."""
    if node.mode.kind != "sync":
        raise ConfigError(f"mode {node.mode.spec!r} keeps pushes in flight across "
                          f"steps: a rank's state at a step is not its own; snapshots "
                          f"need mode 'sync'")
    server, worker = node.server, node.worker
    out: dict[str, Any] = {"module": node.module.state_dict(),
                           "counters": (node.done, node.steps_run, node.skipped)}
    if server is not None:
        out["server"] = {"optimizer": server.optimizer.state_dict(), "rules": server.rules,
                         "histogram": server.histogram,
                         "decoders": server.decoders.state_dict()
                         if server.decoders is not None else {}}
    if worker is not None:
        out["worker"] = {"versions": worker.versions, "base": worker.base,
                         "feedback": worker.state_dict()}
    return out


def load_local_state(node: PSNode, state: Mapping[str, Any]) -> None:
    """Put a `local_state` back on this rank (no collectives)."""
    server, worker = node.server, node.worker
    node.module.load_state_dict(state["module"])
    node.done, node.steps_run, node.skipped = state["counters"]
    if server is not None:
        server.optimizer.load_state_dict(state["server"]["optimizer"])
        server.rules, server.histogram = state["server"]["rules"], state["server"]["histogram"]
        if server.decoders is not None:
            server.decoders.load_state_dict(state["server"]["decoders"])
    if worker is not None:
        worker.versions = list(state["worker"]["versions"])
        worker.base = list(state["worker"]["base"])
        worker.load_state_dict(state["worker"]["feedback"])
