"""PipeDream's state space: the antichain DAG of a layer graph (Narayanan et al., SOSP'19).

PipeDream's optimizer (msr-fiddle/pipedream, optimizer_graph_hierarchical.py and
graph/graph.py) does not cut a branched graph at layer indices: a *state* is an antichain
of layers (what is "in flight" at a cut) and stands for everything up to it. A stage is
the difference of two states, one a predecessor of the other in the antichain DAG. Per
state this module keeps what the optimizer reads: cumulative compute, parameter and
activation totals, and the bytes crossing the cut, summed over the *augmented* antichain
(the antichain plus earlier layers whose outputs are still read later), as PipeDream does.

A chain (a `Profile`'s blocks) is the special case where state i is blocks [0, i].
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from approxdist.errors import DataError
from approxdist.planner.pipedream_format import PipeDreamGraph
from approxdist.planner.profile import Profile


@dataclass(frozen=True)
class State:
    """One cut: the layers before it, their totals, and the bytes crossing it."""

    antichain: tuple[str, ...]      # augmented antichain, as PipeDream keeps it
    layers: frozenset[str]          # every layer up to and including the antichain
    compute_s: float                # forward + backward seconds of `layers`
    param_bytes: float
    activation_bytes: float         # summed outputs of `layers` (PipeDream's stash model)
    output_bytes: float             # summed outputs of `antichain`: what the cut carries
    predecessors: frozenset[int]    # indices of every state this one can follow


@dataclass(frozen=True)
class StateSpace:
    """States in a topological order (fewer layers first) and the layers' order."""

    states: tuple[State, ...]
    layer_order: tuple[str, ...]

    def layers_between(self, first: int, end: int) -> tuple[str, ...]:
        """Layers of states [first, end): those of state end-1 not in state first-1."""
        done = self.states[first - 1].layers if first > 0 else frozenset()
        inside = self.states[end - 1].layers - done
        return tuple(layer for layer in self.layer_order if layer in inside)


def chain_states(profile: Profile) -> StateSpace:
    """State i = blocks [0, i]; the cut after block i carries its `out_bytes`, and a
    block's `stash_bytes` stands for PipeDream's per-layer activation size."""
    states, compute, params, stash = [], 0.0, 0.0, 0.0
    names = tuple(b.name for b in profile.blocks)
    for i, block in enumerate(profile.blocks):
        compute += block.compute_s
        params += block.param_bytes
        stash += block.stash_bytes
        states.append(State((block.name,), frozenset(names[:i + 1]), compute, params, stash,
                            float(block.out_bytes), frozenset(range(i))))
    return StateSpace(tuple(states), names)


def graph_states(graph: PipeDreamGraph) -> StateSpace:
    """PipeDream's states of `graph`: Input sources and `__getitem__` sinks dropped (they
    are not the optimizer's to place), then the antichain DAG from the single source."""
    kept = {n.node_id for n in graph.nodes if not _dropped(graph, n.node_id)}
    order = tuple(n for n in graph.topological_order if n in kept)
    succ = {n: tuple(s for s in graph.successors[n] if s in kept) for n in order}
    fed = {s for n in order for s in succ[n]}
    sources = [n for n in order if n not in fed]
    if len(sources) != 1:
        raise DataError(f"{graph.source} has {len(sources)} source layers besides Input "
                        f"({', '.join(sources[:5])}); PipeDream's optimizer needs exactly one")
    dag = _Dag(order, succ)
    antichains, edges = dag.antichain_dag(sources[0])
    by_size = sorted(range(len(antichains)), key=lambda k: (len(dag.prefix(antichains[k])), k))
    rank = {old: new for new, old in enumerate(by_size)}
    before = _reachability(len(antichains), [(rank[a], rank[b]) for a, b in edges])
    nodes = graph.by_id
    states = []
    for new, old in enumerate(by_size):
        augmented = dag.augment(antichains[old])
        layers = dag.prefix(antichains[old])
        inside = [n for n in order if n in layers]
        states.append(State(
            antichain=tuple(n for n in order if n in augmented), layers=layers,
            compute_s=sum((nodes[n].fwd_ms + nodes[n].bwd_ms) / 1000.0 for n in inside),
            param_bytes=sum(nodes[n].param_bytes for n in inside),
            activation_bytes=sum(nodes[n].activation_bytes for n in inside),
            output_bytes=sum(nodes[n].activation_bytes for n in order if n in augmented),
            predecessors=before[new]))
    return StateSpace(tuple(states), order)


def _dropped(graph: PipeDreamGraph, node_id: str) -> bool:
    return node_id in graph.inputs or (graph.by_id[node_id].desc.startswith("__getitem__") and
                                       not graph.successors[node_id])


class _Dag:
    """Ancestors and descendants of a DAG's nodes, and PipeDream's antichain moves."""

    def __init__(self, order: tuple[str, ...], succ: Mapping[str, tuple[str, ...]]) -> None:
        self.succ = succ
        self.below: dict[str, frozenset[str]] = {}   # descendants
        for n in reversed(order):
            self.below[n] = frozenset().union(*({s} | self.below[s] for s in succ[n]))
        self.above: dict[str, frozenset[str]] = {n: frozenset() for n in order}  # ancestors
        for n in order:
            for s in succ[n]:
                self.above[s] = self.above[s] | self.above[n] | {n}

    def prefix(self, antichain: frozenset[str]) -> frozenset[str]:
        return frozenset().union(*(self.above[a] | {a} for a in antichain))

    def augment(self, antichain: frozenset[str]) -> frozenset[str]:
        """Add each ancestor p of an antichain node a that feeds a layer outside a's past."""
        extra = {p for a in antichain for p in self.above[a]
                 if any(o not in self.above[a] and o != a for o in self.succ[p])}
        return antichain | extra

    def next_antichains(self, antichain: frozenset[str]) -> list[frozenset[str]]:
        """Move one node of the augmented antichain to a successor whose descendants are
        all outside it, then drop the nodes that precede another (graph.py's rules)."""
        augmented = self.augment(antichain)
        found = []
        for old in sorted(augmented):
            for new in self.succ[old]:
                if new in antichain or self.below[new] & augmented:
                    continue
                moved = (augmented - {old}) | {new}
                found.append(frozenset(n for n in moved if not self.below[n] & moved))
        return found

    def antichain_dag(self, source: str) -> tuple[list[frozenset[str]], list[tuple[int, int]]]:
        """Breadth-first from {source}: the antichains found and the moves between them."""
        start = frozenset({source})
        index, found, edges = {start: 0}, [start], []
        queue, expanded = deque([start]), set()
        while queue:
            current = queue.popleft()
            if current in expanded:
                continue
            expanded.add(current)
            for nxt in self.next_antichains(current):
                if nxt not in index:
                    index[nxt] = len(found)
                    found.append(nxt)
                edges.append((index[current], index[nxt]))
                queue.append(nxt)
        return found, edges


def _reachability(count: int, edges: list[tuple[int, int]]) -> list[frozenset[int]]:
    """For each node of a DAG numbered in topological order, the nodes that reach it."""
    ins: list[set[int]] = [set() for _ in range(count)]
    for a, b in edges:
        ins[b].add(a)
    before: list[frozenset[int]] = []
    for k in range(count):
        before.append(frozenset().union(*({p} | before[p] for p in ins[k])))
    return before
