"""A stage's backward split in two: the input gradient now, the weight gradients later
(zero-bubble pipeline parallelism, Qi et al. ICLR 2024; torch.distributed.pipelining's
`stage_backward_input` / `stage_backward_weight`).

    grad_in, later = input_grad(root, grad, inputs, params)   # I: only d root / d inputs
    later.run()                                               # W: the parameters' .grad

`input_grad` walks the autograd graph once: the *input path* is every node from which the
input's gradient accumulator can be reached; each parameter's branch joins that path at
one or more nodes (its *joints*: the `AddmmBackward` of a linear layer, say). While the
input gradient is computed (`torch.autograd.grad(..., retain_graph=True)`, which runs only
what the input needs), a pre-hook keeps the gradient arriving at every joint. `WeightGrad`
later starts autograd at those joints (`GradientEdge`s) with the kept gradients and asks
for the parameters only, one call per group of parameters sharing joints, so no node of
the input path runs twice. Gradients land in `.grad` through autograd's own accumulation
(post-accumulate-grad hooks fire), as in a whole backward; the sum is the same up to
floating-point order.

A stage whose input gradient needs no graph (the first stage: its inputs are data) has
nothing to do in I: its W is the whole backward. A stage whose backward writes parameter
gradients itself while the input gradient is computed (a custom `autograd.Function` that
accumulates into `.grad`, reentrant checkpointing) cannot be split: `input_grad` raises
`SplitBackwardError` naming the parameter.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node

from approxdist.pipeline.errors import PipelineError


class SplitBackwardError(PipelineError):
    """A stage's backward cannot be split into an input and a weight gradient."""


def grad_node(t: torch.Tensor) -> Node | None:
    """`t`'s node in the backward graph: its `grad_fn`, or for a leaf its accumulator."""
    if t.grad_fn is not None:
        return t.grad_fn
    if not t.requires_grad:
        return None
    viewed = t.view_as(t).grad_fn
    assert viewed is not None, "a leaf that requires grad has an accumulator"
    return viewed.next_functions[0][0]


@dataclass
class _Group:
    """Parameters whose branches join the input path at the same nodes."""

    params: list[torch.Tensor]
    joints: list[Node]
    grads: dict[Node, tuple[torch.Tensor | None, ...]] = field(default_factory=dict)


@dataclass
class WeightGrad:
    """The W half of a split backward: `run()` accumulates the parameters' gradients."""

    groups: list[_Group]
    whole: Callable[[], None] | None = None  # the full backward (a stage with no I)

    def run(self) -> None:
        if self.whole is not None:
            self.whole()
        for g in self.groups:
            edges, grads = [], []
            for node in g.joints:
                for i, grad in enumerate(g.grads.get(node, ())):
                    if grad is not None:
                        edges.append(GradientEdge(node, i))
                        grads.append(grad)
            if edges:
                with _clamped(g):  # the graph is kept: a group may run another's nodes
                    torch.autograd.backward(edges, grads, inputs=g.params, retain_graph=True)
        self.groups = []  # the last references to the graph: its memory goes now
        self.whole = None


class _clamped:  # noqa: N801 - a context manager named like one
    """With several joints in a group, one may lie below another: autograd would send it
    the gradient again through the upper one; a pre-hook replaces what arrives by the
    gradient kept in I (torch's `stage_backward_weight` does the same)."""

    def __init__(self, group: _Group) -> None:
        self.group = group
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> None:
        if len(self.group.joints) > 1:
            for node in self.group.joints:
                kept = self.group.grads.get(node)
                if kept is not None:
                    self.handles.append(node.register_prehook(lambda _g, kept=kept: kept))

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()


def full_backward(root: torch.Tensor, grad: torch.Tensor | None) -> WeightGrad:
    """A W that is the whole backward (no input gradient to split off)."""
    return WeightGrad([], whole=lambda: torch.autograd.backward(root, grad))


def input_grad(root: torch.Tensor, grad: torch.Tensor | None, inputs: torch.Tensor,
               params: Iterable[torch.Tensor]) -> tuple[torch.Tensor | None, WeightGrad]:
    """I: `d root / d inputs` (times `grad`), keeping what W needs; see the module doc."""
    start, source = grad_node(root), grad_node(inputs)
    if start is None or source is None:
        return None, full_backward(root, grad)
    parents = _parents(start)
    path = _reaching(source, parents)
    if start not in path:  # the output does not depend on the input
        return torch.zeros_like(inputs), full_backward(root, grad)
    groups = _groups([p for p in params if p.requires_grad], path, parents)
    before = _grad_state(groups)
    handles = [node.register_prehook(_keep(g, node)) for g in groups for node in g.joints]
    try:
        (dx,) = torch.autograd.grad(root, inputs, grad, retain_graph=True, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    _check_untouched(groups, before)
    return (torch.zeros_like(inputs) if dx is None else dx), WeightGrad(groups)


def _keep(group: _Group, node: Node) -> Callable[..., None]:
    def hook(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        group.grads[node] = tuple(grad_outputs)

    return hook


def _parents(start: Node) -> dict[Node, list[Node]]:
    """node -> the nodes whose backward feeds it (reverse of `next_functions`)."""
    parents: dict[Node, list[Node]] = defaultdict(list)
    seen, todo = {start}, deque([start])
    while todo:
        node = todo.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            parents[child].append(node)
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return parents


def _reaching(target: Node, parents: dict[Node, list[Node]],
              stop: set[Node] | None = None) -> set[Node]:
    """Nodes from which `target` is reached, walking up from it (halting at `stop`'s nodes,
    which are left out)."""
    found, todo = {target}, deque([target])
    while todo:
        for up in parents.get(todo.popleft(), []):
            if up not in found and (stop is None or up not in stop):
                found.add(up)
                todo.append(up)
    return found


def _groups(params: list[torch.Tensor], path: set[Node],
            parents: dict[Node, list[Node]]) -> list[_Group]:
    """Parameters grouped by the input-path nodes where their branches join it."""
    by_joint: dict[Node, _Group] = {}
    for p in params:
        node = grad_node(p)
        if node is None or node not in parents:
            continue  # not used by this micro-batch's graph
        branch = _reaching(node, parents, stop=path)
        joints = {up for n in branch for up in parents.get(n, []) if up in path}
        merged = {id(by_joint[j]): by_joint[j] for j in joints if j in by_joint}
        group = _Group([p], sorted(joints, key=id))
        for other in merged.values():
            group.params += other.params
            group.joints = sorted(set(group.joints) | set(other.joints), key=id)
        for j in group.joints:
            by_joint[j] = group
    unique = {id(g): g for g in by_joint.values()}
    return list(unique.values())


def _grad_state(groups: list[_Group]) -> list[tuple[torch.Tensor, int, int]]:
    return [(p, id(p.grad), p.grad._version if p.grad is not None else -1)
            for g in groups for p in g.params]


def _check_untouched(groups: list[_Group], before: list[tuple[torch.Tensor, int, int]]) -> None:
    for p, ident, version in before:
        now = p.grad._version if p.grad is not None else -1
        if id(p.grad) != ident or now != version:
            raise SplitBackwardError(
                f"the stage's backward wrote the gradient of a parameter of shape "
                f"{tuple(p.shape)} while computing only its input gradient (a custom "
                f"autograd.Function or reentrant checkpoint that accumulates into .grad), so "
                f"it cannot be split into I and W; use a schedule with whole backwards "
                f"(1f1b, gpipe) or torch.utils.checkpoint(use_reentrant=False)")
