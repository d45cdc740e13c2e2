"""PipeDream graph.txt: reading the three published profiles, linearising, converting to `Profile`."""

from __future__ import annotations

from pathlib import Path

import pytest

from approxdist.errors import DataError
from approxdist.planner.pipedream_format import (
    parse_graph,
    read_graph,
    read_pipedream_profile,
    to_profile,
)
from approxdist.planner.profile import from_json, to_json
from tests.helpers.pipedream import PROFILES, needs_profiles

MODELS = ("alexnet", "vgg16", "resnet50")


def _line(node: str, desc: str, fwd: float, bwd: float, act: float, par: float) -> str:
    return (f"{node} -- {desc} -- forward_compute_time={fwd:.3f}, backward_compute_time={bwd:.3f}, "
            f"activation_size={act:.3f}, parameter_size={par:.3f}")


# Input -> a -> {b, c} -> d: a branch, as in a residual block; ids out of file order.
DIAMOND = "\n".join([
    _line("node4", "Add(inplace)", 0.5, 0.5, 64.0, 0.0),
    _line("node1", "Input", 9.0, 0.0, 4 * 2 * 3 * 2 * 2, 0.0),
    _line("node2", "Conv2d(3, 4)", 2.0, 4.0, 64.0, 400.0),
    _line("node3", "BatchNorm2d(4)", 1.0, 1.0, 64.0, 32.0),
    _line("node10", "Conv2d(4, 4, kernel_size=(1, 1))", 1.5, 2.5, 32.0, 100.0),
    "\tnode2 -- node3", "\tnode1 -- node2", "\tnode3 -- node4", "\tnode2 -- node10",
    "\tnode10 -- node4",
])


def _naive_totals(path: Path) -> tuple[float, float, int]:
    """Sum of fwd+bwd ms and of parameter bytes over non-Input lines, and their count."""
    ms = params = 0.0
    count = 0
    for line in path.read_text().splitlines():
        if line.startswith("\t") or " -- Input -- " in line:
            continue
        fields = dict(kv.split("=") for kv in line.split(" -- ")[2].split(", "))
        ms += float(fields["forward_compute_time"]) + float(fields["backward_compute_time"])
        params += float(fields["parameter_size"])
        count += 1
    return ms, params, count


@needs_profiles
@pytest.mark.parametrize("model", MODELS)
def test_published_profiles_convert_with_every_layer(model: str) -> None:
    path = PROFILES / f"{model}.txt"
    graph = read_graph(path)
    profile = read_pipedream_profile(path)
    ms, params, count = _naive_totals(path)
    assert profile.model == model and len(profile.blocks) == count == len(graph.nodes) - 1
    assert profile.total_compute_s == pytest.approx(ms / 1000.0, rel=1e-12)
    assert profile.total_param_bytes == round(params)
    order = graph.topological_order
    position = {node: i for i, node in enumerate(order)}
    assert all(position[a] < position[b] for a, b in graph.edges)
    assert [b.name.split()[0] for b in profile.blocks] == [n for n in order if n != "node1"]
    assert from_json(to_json(profile)) == profile


@needs_profiles
def test_alexnet_matches_the_readme_and_the_input_sets_the_batch() -> None:
    profile = read_pipedream_profile(PROFILES / "alexnet.txt")
    assert len(profile.blocks) == 22                                  # "22 states"
    assert profile.total_compute_s * 1000 == pytest.approx(85.3, abs=0.05)  # "85.3 ms"
    assert profile.total_param_bytes / 1e6 == pytest.approx(244, abs=0.5)   # "244 MB"
    graph = read_graph(PROFILES / "alexnet.txt")
    inputs = graph.by_id["node1"].activation_bytes
    assert profile.micro_batch_size * 4 * 3 * 224 * 224 == inputs
    assert profile.blocks[0].stash_bytes == inputs                    # the first block reads the input
    assert profile.threads is None and "PipeDream" in profile.machine
    for model in ("vgg16", "resnet50"):
        other = read_pipedream_profile(PROFILES / f"{model}.txt")
        assert other.micro_batch_size * 4 * 3 * 224 * 224 == read_graph(
            PROFILES / f"{model}.txt").by_id["node1"].activation_bytes


@needs_profiles
def test_a_cut_after_a_branching_layer_carries_every_live_output() -> None:
    """alexnet: node14 feeds node15 (Size) and node16 (View); a cut after node15 must
    carry both outputs, as PipeDream's augmented antichain [node14, node15] does."""
    graph = read_graph(PROFILES / "alexnet.txt")
    profile = to_profile(graph, "alexnet")
    act = {n.node_id: n.activation_bytes for n in graph.nodes}
    blocks = {b.name.split()[0]: b for b in profile.blocks}
    assert blocks["node15"].out_bytes == act["node14"] + act["node15"]
    assert blocks["node16"].stash_bytes == act["node14"] + act["node15"]
    assert blocks["node14"].out_bytes == act["node14"]


def test_diamond_is_linearised_by_node_number_with_cut_sizes() -> None:
    graph = parse_graph(DIAMOND, "diamond.txt")
    assert graph.topological_order == ("node1", "node2", "node3", "node10", "node4")
    profile = to_profile(graph, "diamond", input_shape=(3, 2, 2))
    assert profile.micro_batch_size == 2
    names = [b.name for b in profile.blocks]
    assert names == ["node2 Conv2d(3, 4)", "node3 BatchNorm2d(4)",
                     "node10 Conv2d(4, 4, kernel_size=(1, 1))", "node4 Add(inplace)"]
    # after node3, node2's output is still needed by node10: 64 + 64 bytes cross the cut
    assert [b.out_bytes for b in profile.blocks] == [64, 128, 96, 64]
    assert [b.stash_bytes for b in profile.blocks] == [96, 64, 64, 96]  # Input, node2, node2, node3 + node10
    assert [b.fwd_s for b in profile.blocks] == pytest.approx([0.002, 0.001, 0.0015, 0.0005])
    assert [b.param_bytes for b in profile.blocks] == [400, 32, 100, 0]


def test_optional_pipedream_forms_are_read() -> None:
    text = "\n".join([
        "node1 -- Input -- forward_compute_time=1.000, backward_compute_time=0.000, "
        "activation_size=[8.000; 16.000], parameter_size=0.000",
        "",
        "node2 -- Linear -- forward_compute_time=1e-1, backward_compute_time=.5, "
        "activation_size=8.000, parameter_size=4.000 -- stage_id=0",
        "\tnode1 -- node2", ""])
    graph = parse_graph(text)
    assert graph.by_id["node1"].activation_bytes == 24.0
    assert graph.by_id["node2"].fwd_ms == pytest.approx(0.1)
    assert to_profile(graph, "m", input_shape=(6,)).micro_batch_size == 1


@pytest.mark.parametrize("text, message", [
    ("node2 -- Conv2d -- forward_compute_time=1.0", r"^g\.txt line 1: expected 'nodeN -- <layer> -- "
     r"forward_compute_time=<ms>.*got 'node2 -- Conv2d -- forward_compute_time=1\.0'"),
    (_line("node1", "Input", 1, 0, 8, 0) + "\n\tnode1 node2",
     r"^g\.txt line 2: expected an edge, a tab then 'nodeA -- nodeB'; got '\\tnode1 node2'"),
    (_line("node1", "Input", 1, 0, 8, 0) + "\n\n\tnode1 -- node9",
     r"^g\.txt line 3: edge node1 -- node9 names node9, which no layer line declares"),
    (_line("node1", "Input", 1, 0, 8, 0).replace("=1.000", "=-1.000"),
     r"^g\.txt line 1: forward_compute_time=-1\.0 must be a finite number >= 0"),
    (_line("node1", "Input", 1, 0, 8, 0) + "\n" + _line("node1", "ReLU", 1, 0, 8, 0),
     r"g\.txt declares node1 more than once"),
    ("\n\n", r"g\.txt holds no layer lines"),
    (_line("node1", "A", 1, 1, 8, 0) + "\n" + _line("node2", "B", 1, 1, 8, 0) +
     "\n\tnode1 -- node2\n\tnode2 -- node1", r"g\.txt has a cycle through node1, node2"),
])
def test_malformed_graphs_name_file_line_and_expectation(text: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        parse_graph(text, "g.txt")


def test_batch_size_is_checked_or_asked_for() -> None:
    graph = parse_graph(DIAMOND)
    with pytest.raises(DataError, match=r"micro_batch_size = 3 but the Input node holds 2 samples "
                                        r"of shape \(3, 2, 2\); pass 2"):
        to_profile(graph, "d", input_shape=(3, 2, 2), micro_batch_size=3)
    with pytest.raises(DataError, match=r"Input size 96 bytes is not a whole number of fp32 samples "
                                        r"of shape \(3, 224, 224\); pass the right input_shape"):
        to_profile(graph, "d")
    no_input = parse_graph(_line("node2", "Linear", 1, 1, 8, 4))
    with pytest.raises(DataError, match=r"no Input node to infer the micro-batch size from; pass "
                                        r"micro_batch_size"):
        to_profile(no_input, "d")
    assert to_profile(no_input, "d", micro_batch_size=5).micro_batch_size == 5


def test_model_name_comes_from_the_file(tmp_path: Path) -> None:
    (tmp_path / "resnet9").mkdir()
    for path in (tmp_path / "resnet9" / "graph.txt", tmp_path / "resnet9.txt"):
        path.write_text(DIAMOND)
        assert read_pipedream_profile(path, input_shape=(3, 2, 2)).model == "resnet9"
    assert read_pipedream_profile(tmp_path / "resnet9.txt", model="r9",
                                  input_shape=(3, 2, 2)).model == "r9"
    with pytest.raises(DataError, match=r"PipeDream graph '.*absent\.txt' does not exist; pass a "
                                        r"graph\.txt"):
        read_graph(tmp_path / "absent.txt")
