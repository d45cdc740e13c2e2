"""Deterministic figures quoted in the docs equal what the code computes now.

A figure that does not depend on the machine (a solver's plan on a fixed profile) is read
from the page itself and recomputed, so the page and the code cannot drift apart: the
planner's PipeDream figures (docs/planner.md, "The published figures"), its table, the
commented output of its example and the VGG-16 / ResNet-50 table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from approxdist.planner.antichains import graph_states
from approxdist.planner.pipedream_format import read_graph
from approxdist.planner.pipedream_optimizer import Level, PipeDreamPlan, PipeDreamSettings, optimize
from tests.helpers.pipedream import PROFILES, needs_profiles

PAGE = Path(__file__).resolve().parents[2] / "docs" / "planner.md"
#: the page's settings, in the order of its table's rows and columns
SETTINGS: list[dict[str, Any]] = [
    {}, {"activation_compression_ratio": 1.0},
    {"activation_compression_ratio": 1.0, "straight_pipeline": True}]


def _section() -> str:
    return PAGE.read_text().split("### The published figures", 1)[1].split("\n### ", 1)[0]


def _table(title_cell: str) -> list[list[str]]:
    """The rows (cells stripped) of the section's table whose header starts with `title_cell`."""
    lines = _section().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {title_cell} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _plan(model: str, options: dict[str, Any]) -> PipeDreamPlan:
    space = graph_states(read_graph(PROFILES / f"{model}.txt"))
    return optimize(space, PipeDreamSettings((Level(4, 1e9),), **options))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _stages(plan: PipeDreamPlan) -> str:
    """The table's spelling: `(0,6)x2, (6,9)x1` or, all on one worker, `(0,6), (6,13), x1 each`."""
    if all(s.replicas == 1 for s in plan.stages) and len(plan.stages) > 2:
        return ", ".join(f"({s.first},{s.end})" for s in plan.stages) + ", x1 each"
    return ", ".join(f"({s.first},{s.end})x{s.replicas}" for s in plan.stages)


def test_the_sections_tables_are_found() -> None:
    assert len(_table("PipeDream setting")) == 3 and len(_table("model")) == 2


@needs_profiles
def test_alexnet_table_gives_our_plans_and_bottlenecks() -> None:
    for row, options in zip(_table("PipeDream setting"), SETTINGS):
        plan = _plan("alexnet", options)
        assert row[3:5] == [_stages(plan), _ms(plan.bottleneck_s)], row[0]


@needs_profiles
def test_the_examples_commented_output_is_what_it_prints() -> None:
    printed = re.findall(r"^# (\d+\.\d\d ms \[.*\])$", _section(), re.MULTILINE)
    expected = []
    for options in SETTINGS:
        plan = _plan("alexnet", options)
        stages = [(s.first, s.end, s.replicas) for s in plan.stages]
        expected.append(f"{_ms(plan.bottleneck_s)} {stages}")
    assert printed == expected


@needs_profiles
@pytest.mark.parametrize("name, model", [("VGG-16", "vgg16"), ("ResNet-50", "resnet50")])
def test_vgg16_and_resnet50_table_gives_each_settings_bottleneck(name: str, model: str) -> None:
    row = next(r for r in _table("model") if r[0] == name)
    plans = [_plan(model, options) for options in SETTINGS]
    assert row[1:] == [*(_ms(p.bottleneck_s) for p in plans), _ms(plans[0].single_worker_s)]
