"""PipeDream's `graph.txt` layer profiles (msr-fiddle/pipedream): reader and conversion to `Profile`.

A graph.txt holds one line per layer and one tab-indented line per edge:

    node2 -- Conv2d(3, 64, ...) -- forward_compute_time=22.316, backward_compute_time=6.405,
        activation_size=198246400.000, parameter_size=93184.000          (one line in the file)
    <tab>node1 -- node2

Times are milliseconds per minibatch, sizes bytes (`activation_size` may be a list
`[a; b]`, summed as PipeDream does; a trailing ` -- stage_id=N` is accepted). The
graph is kept as read (`PipeDreamGraph`) for PipeDream's optimizer, which works on its
antichains (`planner.antichains`), and linearised into a `Profile` (`to_profile`).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from approxdist.errors import DataError
from approxdist.planner.profile import BlockProfile, Profile, looks_like_pipedream, read_profile
from approxdist.text import read_text

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_NODE = re.compile(
    rf"(?P<id>\S+) -- (?P<desc>.+) -- forward_compute_time=(?P<fwd>{_NUM}), "
    rf"backward_compute_time=(?P<bwd>{_NUM}), "
    rf"activation_size=(?P<act>{_NUM}|\[{_NUM}(?:; {_NUM})*\]), "
    rf"parameter_size=(?P<par>{_NUM})(?: -- stage_id=\d+)?")
_EDGE = re.compile(r"(?P<a>\S+) -- (?P<b>\S+)")
_EXPECTED = ("expected 'nodeN -- <layer> -- forward_compute_time=<ms>, backward_compute_time=<ms>, "
             "activation_size=<bytes>, parameter_size=<bytes>' or a tab then 'nodeA -- nodeB'")
FP32_BYTES = 4


@dataclass(frozen=True)
class PipeDreamNode:
    """One layer as PipeDream profiled it: milliseconds and bytes per minibatch."""

    node_id: str
    desc: str
    fwd_ms: float
    bwd_ms: float
    activation_bytes: float
    param_bytes: float

    @property
    def is_input(self) -> bool:
        return self.desc.startswith("Input")


@dataclass(frozen=True)
class PipeDreamGraph:
    """Layers (file order) and edges (producer, consumer) of one graph.txt; a DAG."""

    nodes: tuple[PipeDreamNode, ...]
    edges: tuple[tuple[str, str], ...]
    source: str = "graph"

    @cached_property
    def by_id(self) -> Mapping[str, PipeDreamNode]:
        return {n.node_id: n for n in self.nodes}

    @cached_property
    def successors(self) -> Mapping[str, tuple[str, ...]]:
        return self._adjacent(self.edges)

    @cached_property
    def predecessors(self) -> Mapping[str, tuple[str, ...]]:
        return self._adjacent((b, a) for a, b in self.edges)

    def _adjacent(self, edges: Iterable[tuple[str, str]]) -> Mapping[str, tuple[str, ...]]:
        """Each node's far ends of `edges` (from, to), in edge order."""
        out: dict[str, list[str]] = {n.node_id: [] for n in self.nodes}
        for a, b in edges:
            out[a].append(b)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def inputs(self) -> frozenset[str]:
        """The model's inputs: source nodes PipeDream describes as `Input`; not layers."""
        return frozenset(n.node_id for n in self.nodes if n.is_input and not self.predecessors[n.node_id])

    @cached_property
    def topological_order(self) -> tuple[str, ...]:
        """Node ids so that every edge points forward; among ready nodes the lowest id
        (node2 before node10) goes first, which is PipeDream's execution order."""
        waiting = {k: len(v) for k, v in self.predecessors.items()}
        ready = [_natural(k) for k, v in waiting.items() if v == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            node = heapq.heappop(ready)[-1]
            order.append(node)
            for nxt in self.successors[node]:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    heapq.heappush(ready, _natural(nxt))
        if len(order) < len(self.nodes):
            stuck = sorted(k for k, v in waiting.items() if v > 0)
            raise DataError(f"{self.source} has a cycle through {', '.join(stuck[:5])}; a "
                            "PipeDream graph must be acyclic")
        return tuple(order)


def parse_graph(text: str, source: str = "graph") -> PipeDreamGraph:
    """The graph in `text`; `DataError` naming `source`, the line number and what was expected."""
    nodes: list[PipeDreamNode] = []
    edges: list[tuple[str, str]] = []
    edge_lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        if line[0].isspace():  # PipeDream writes edges after a tab, layers at the margin
            edge = _EDGE.fullmatch(line.strip())
            if not edge:
                raise DataError(f"{where}: expected an edge, a tab then 'nodeA -- nodeB'; got "
                                f"{line[:120]!r}")
            edges.append((edge["a"], edge["b"]))
            edge_lines.append(number)
        else:
            nodes.append(_node(line.strip(), where))
    ids = [n.node_id for n in nodes]
    declared = set(ids)
    if not nodes:
        raise DataError(f"{source} holds no layer lines; {_EXPECTED}")
    if len(declared) < len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise DataError(f"{source} declares {', '.join(twice)} more than once; give each node once")
    for (a, b), number in zip(edges, edge_lines):
        for end in (a, b):
            if end not in declared:
                raise DataError(f"{source} line {number}: edge {a} -- {b} names {end}, which no "
                                "layer line declares; declare it or drop the edge")
    graph = PipeDreamGraph(tuple(nodes), tuple(edges), source)
    _ = graph.topological_order  # rejects cycles here, at reading time
    return graph


def read_graph(path: str | Path) -> PipeDreamGraph:
    """The graph in the PipeDream graph.txt file `path`."""
    text = read_text(path, "PipeDream graph", "pass a graph.txt from PipeDream's profiler")
    return parse_graph(text, source=str(path))


def to_profile(graph: PipeDreamGraph, model: str, input_shape: tuple[int, ...] = (3, 224, 224),
               micro_batch_size: int | None = None) -> Profile:
    """The graph's layers in topological order as a `Profile` (ms -> s).

    Input nodes are not blocks; their size gives the micro-batch size (`micro_batch_size`
    = Input bytes / (4 * prod(input_shape)), fp32), or checks the one given. Per block:
    `out_bytes` is what a stage boundary right after it carries (its own output plus any
    earlier output a later layer still reads, as PipeDream's augmented antichain counts);
    `stash_bytes`, which graph.txt does not record, is taken as the block's input (the
    outputs of the layers it reads), which most layers keep for their backward pass.
    """
    order = graph.topological_order
    position = {node: i for i, node in enumerate(order)}
    nodes = graph.by_id
    blocks = []
    for i, node_id in enumerate(order):
        node = nodes[node_id]
        if node_id in graph.inputs:
            continue
        live = [u for u in order[:i + 1] if u == node_id or
                any(position[s] > i for s in graph.successors[u])]
        blocks.append(BlockProfile(
            name=f"{node_id} {node.desc}", fwd_s=_seconds(node.fwd_ms), bwd_s=_seconds(node.bwd_ms),
            out_bytes=_bytes(sum(nodes[u].activation_bytes for u in live)),
            param_bytes=_bytes(node.param_bytes),
            stash_bytes=_bytes(sum(nodes[p].activation_bytes for p in graph.predecessors[node_id]))))
    batch = _micro_batch(graph, input_shape, micro_batch_size)
    return Profile(model=model, input_shape=tuple(input_shape), micro_batch_size=batch, threads=None,
                   torch_version="unknown (PipeDream graph.txt)",
                   machine=f"unknown (PipeDream profile {Path(graph.source).name})", blocks=tuple(blocks))


def read_pipedream_profile(path: str | Path, model: str | None = None,
                           input_shape: tuple[int, ...] = (3, 224, 224),
                           micro_batch_size: int | None = None) -> Profile:
    """`to_profile(read_graph(path))`; the model name defaults to the file's name
    (`alexnet.txt` -> alexnet, `alexnet/graph.txt` -> alexnet)."""
    p = Path(path)
    name = model or (p.parent.name if p.stem == "graph" and p.parent.name else p.stem)
    return to_profile(read_graph(p), name, input_shape, micro_batch_size)


def _node(line: str, where: str) -> PipeDreamNode:
    match = _NODE.fullmatch(line)
    if not match:
        raise DataError(f"{where}: {_EXPECTED}; got {line[:120]!r}")
    act = match["act"]
    values = {"forward_compute_time": float(match["fwd"]), "backward_compute_time": float(match["bwd"]),
              "activation_size": sum(float(x) for x in act.strip("[]").split("; ")),
              "parameter_size": float(match["par"])}
    for key, value in values.items():
        if not math.isfinite(value) or value < 0:
            raise DataError(f"{where}: {key}={value!r} must be a finite number >= 0")
    return PipeDreamNode(match["id"], match["desc"], values["forward_compute_time"],
                         values["backward_compute_time"], values["activation_size"],
                         values["parameter_size"])


def _micro_batch(graph: PipeDreamGraph, shape: tuple[int, ...], given: int | None) -> int:
    inputs = [graph.by_id[n] for n in sorted(graph.inputs)]
    if not inputs:
        if given is None:
            raise DataError(f"{graph.source} has no Input node to infer the micro-batch size "
                            "from; pass micro_batch_size")
        return given
    sample = FP32_BYTES * math.prod(shape)
    total = sum(n.activation_bytes for n in inputs)
    inferred = round(total / sample)
    if inferred < 1 or inferred * sample != total:
        raise DataError(f"{graph.source}: Input size {total:.0f} bytes is not a whole number of "
                        f"fp32 samples of shape {tuple(shape)}; pass the right input_shape")
    if given is not None and given != inferred:
        raise DataError(f"{graph.source}: micro_batch_size = {given} but the Input node holds "
                        f"{inferred} samples of shape {tuple(shape)}; pass {inferred} or the "
                        "right input_shape")
    return inferred


def _seconds(ms: float) -> float:
    """ms -> s, rounded to 1e-12 s so that 0.813 ms reads 0.000813, not 0.0008129999999999999."""
    return round(ms / 1000.0, 12)


def _bytes(value: float) -> int:
    return int(round(value))


def _natural(node_id: str) -> tuple[str, int, str]:
    """Sort key: 'node2' < 'node10' (text prefix, then the trailing number)."""
    match = re.fullmatch(r"(.*?)(\d+)", node_id)
    return (match[1], int(match[2]), node_id) if match else (node_id, -1, node_id)


def read_any_profile(path: str | Path) -> Profile:
    """Our profile file, or a PipeDream graph.txt recognised by its first line (converted by
    `read_pipedream_profile`); one `DataError` line if it is neither."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return read_profile(path)  # its one-line error names the file and why
    return read_pipedream_profile(path) if looks_like_pipedream(text) else read_profile(path)
