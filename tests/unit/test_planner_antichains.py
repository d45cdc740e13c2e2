"""PipeDream's state space: antichains of a branched graph, the chain of a Profile, and their agreement."""

from __future__ import annotations

import pytest

from approxdist.errors import DataError
from approxdist.planner.antichains import chain_states, graph_states
from approxdist.planner.pipedream_format import parse_graph, read_graph, read_pipedream_profile
from approxdist.planner.profile import BlockProfile, Profile
from tests.helpers.pipedream import PROFILES, needs_profiles


def _line(node: str, desc: str, ms: float, act: float, par: float) -> str:
    return (f"{node} -- {desc} -- forward_compute_time={ms}, backward_compute_time={ms}, "
            f"activation_size={act}, parameter_size={par}")


# Input -> a -> {b, c} -> d, with per-layer sizes that tell the sums apart.
DIAMOND = "\n".join([
    _line("node1", "Input", 5.0, 1.0, 0.0), _line("node2", "a", 1.0, 100.0, 1.0),
    _line("node3", "b", 2.0, 20.0, 2.0), _line("node10", "c", 3.0, 3.0, 4.0),
    _line("node4", "d", 4.0, 7.0, 8.0),
    "\tnode1 -- node2", "\tnode2 -- node3", "\tnode2 -- node10", "\tnode3 -- node4",
    "\tnode10 -- node4"])


def test_diamond_states_follow_pipedreams_antichain_rules() -> None:
    space = graph_states(parse_graph(DIAMOND))
    assert space.layer_order == ("node2", "node3", "node10", "node4")
    got = [(s.antichain, sorted(s.layers), s.output_bytes, sorted(s.predecessors))
           for s in space.states]
    assert got == [
        (("node2",), ["node2"], 100.0, []),
        # cutting after b still has to carry a's output to c: augmented antichain [a, b]
        (("node2", "node3"), ["node2", "node3"], 120.0, [0]),
        (("node2", "node10"), ["node10", "node2"], 103.0, [0]),
        # PipeDream keeps a in the augmented antichain here too (a feeds c, outside b's past)
        (("node2", "node3", "node10"), ["node10", "node2", "node3"], 123.0, [0, 1, 2]),
        (("node4",), ["node10", "node2", "node3", "node4"], 7.0, [0, 1, 2, 3]),
    ]
    assert [s.compute_s for s in space.states] == pytest.approx([0.002, 0.006, 0.008, 0.012, 0.020])
    assert [s.param_bytes for s in space.states] == [1.0, 3.0, 5.0, 7.0, 15.0]
    assert [s.activation_bytes for s in space.states] == [100.0, 120.0, 103.0, 123.0, 130.0]
    assert space.layers_between(1, 5) == ("node3", "node10", "node4")
    # a stage [first, end) holds what state end-1 adds to state first-1, here {a, c}
    assert space.layers_between(3, 5) == ("node3", "node4")
    assert space.layers_between(4, 5) == ("node4",)


def test_chain_states_are_prefixes_of_the_blocks() -> None:
    blocks = tuple(BlockProfile(f"b{i}", 0.001 * i, 0.002, 10 * i, 100 + i, 7 * i) for i in range(4))
    profile = Profile("m", (4,), 2, 1, "2.5", "cpu", blocks)
    space = chain_states(profile)
    assert [s.layers for s in space.states] == [frozenset(f"b{k}" for k in range(i + 1)) for i in range(4)]
    assert [s.output_bytes for s in space.states] == [0.0, 10.0, 20.0, 30.0]
    assert [s.compute_s for s in space.states] == pytest.approx([0.002, 0.005, 0.009, 0.014])
    assert [s.activation_bytes for s in space.states] == [0.0, 7.0, 21.0, 42.0]  # summed stash_bytes
    assert [sorted(s.predecessors) for s in space.states] == [[], [0], [0, 1], [0, 1, 2]]
    assert space.layers_between(1, 3) == ("b1", "b2")


@needs_profiles
def test_alexnet_graph_and_its_profile_give_the_same_states() -> None:
    """alexnet's antichain DAG is a chain of 22 states (the README's count) that agrees with
    the converted Profile's blocks in compute, parameters and the bytes at each cut."""
    path = PROFILES / "alexnet.txt"
    graph, chain = graph_states(read_graph(path)), chain_states(read_pipedream_profile(path))
    assert len(graph.states) == len(chain.states) == 22
    for g, c in zip(graph.states, chain.states):
        assert g.compute_s == pytest.approx(c.compute_s, rel=1e-12)
        assert (g.param_bytes, g.output_bytes) == (c.param_bytes, c.output_bytes)
        assert g.predecessors == c.predecessors
        assert {name.split()[0] for name in c.layers} == g.layers


@needs_profiles
def test_resnet50_states_cover_the_graph() -> None:
    graph = read_graph(PROFILES / "resnet50.txt")
    space = graph_states(graph)
    last = space.states[-1]
    assert last.layers == {n.node_id for n in graph.nodes if not n.is_input}
    assert last.predecessors == frozenset(range(len(space.states) - 1))
    sizes = [len(s.layers) for s in space.states]
    assert sizes == sorted(sizes)  # numbered in a topological order: fewer layers first
    for k, state in enumerate(space.states):
        assert all(space.states[p].layers < state.layers for p in state.predecessors), k


def test_graphs_pipedream_cannot_plan_are_refused() -> None:
    two_sources = "\n".join([_line("node1", "Embedding", 1, 4, 4), _line("node2", "Linear", 1, 4, 4),
                             _line("node3", "Add", 1, 4, 0), "\tnode1 -- node3", "\tnode2 -- node3"])
    with pytest.raises(DataError, match=r"g\.txt has 2 source layers besides Input \(node1, node2\); "
                                        r"PipeDream's optimizer needs exactly one"):
        graph_states(parse_graph(two_sources, "g.txt"))


def test_getitem_sinks_are_dropped_like_pipedream_does() -> None:
    text = DIAMOND + "\n" + _line("node5", "__getitem__(0)", 9.0, 1.0, 0.0) + "\n\tnode4 -- node5"
    with_sink, without = graph_states(parse_graph(text)), graph_states(parse_graph(DIAMOND))
    assert [s.layers for s in with_sink.states] == [s.layers for s in without.states]
