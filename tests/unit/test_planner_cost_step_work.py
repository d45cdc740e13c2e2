"""The step's work a profile does not time: the optimizer per parameter tensor and the loss
per output value (`cost.optimizer_step`, `RuntimeOverhead.loss_value_s`), priced by hand,
kept in the calibration file, and bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from approxdist.errors import ConfigError, DataError
from approxdist.planner.cost import LinkLevel, Network, PipelinePlan, Stage
from approxdist.planner.cost.calibration_file import CostCalibration, from_json
from approxdist.planner.cost.optimizer_step import optimizer_step_s, param_tensors
from approxdist.planner.cost.overhead import RuntimeOverhead
from approxdist.planner.cost.pipeline import pipeline_time, stage_durations
from approxdist.planner.objective import SolverSettings, estimate
from approxdist.planner.profile import BlockProfile, Profile
from approxdist.planner.profiler import loss_s_per_value, optimizer_s_per_tensor
from approxdist.planner.search import data_parallel, optimizer_s, simulated
from approxdist.train.task import task_named

KB = 1024
#: the model's output: 8 samples x 10 classes of fp32
OUT = 8 * 10 * 4


def profile(sizes: list[tuple[int, ...]], listed: bool = True) -> Profile:
    """Blocks of 1 ms forward, 2 ms backward holding parameter tensors of `sizes` bytes
    (`listed=False`: a profile without `param_sizes`, as PipeDream's)."""
    blocks = tuple(BlockProfile(f"b{i}", 1e-3, 2e-3, 16 * KB if i < len(sizes) - 1 else OUT,
                                sum(s), KB, param_sizes=s if listed else ())
                   for i, s in enumerate(sizes))
    return Profile("toy", (4,), 8, 1, "test", "test", blocks)


def free_network(ranks: int = 2) -> Network:
    return Network(LinkLevel("loopback", 0.0, 0.0, 0.0, cores=ranks))


def test_the_optimizer_is_priced_per_byte_and_per_tensor() -> None:
    # stage 0: 3 tensors, 6 KB; stage 1: 1 tensor, 20 KB
    p = profile([(4 * KB, 1 * KB), (1 * KB,), (20 * KB,)])
    stages = (Stage(0, 2), Stage(2, 3))
    assert [param_tensors(p, st) for st in stages] == [3, 1]
    # per byte only, the 20 KB stage is the slower; per tensor, the 3-tensor stage
    assert optimizer_step_s(p, stages, 1e-9) == pytest.approx(20 * KB * 1e-9)
    assert optimizer_step_s(p, stages, 1e-9, 1e-5) == pytest.approx(6 * KB * 1e-9 + 3e-5)
    # a profile that does not list its tensors: one per block that holds parameters
    assert param_tensors(profile([(4 * KB, 1 * KB), (0,), (KB,)], listed=False),
                         Stage(0, 3)) == 2
    settings = SolverSettings(2, free_network(), optimizer_s_per_byte=1e-9,
                              optimizer_s_per_tensor=1e-5)
    assert optimizer_s(p, settings, stages) == pytest.approx(6 * KB * 1e-9 + 3e-5)
    # data parallelism steps the whole model: 4 tensors, 26 KB
    zero = data_parallel(p, replace(settings, optimizer_s_per_byte=0.0,
                                    optimizer_s_per_tensor=0.0))
    got = data_parallel(p, settings)
    assert zero is not None and got is not None
    assert got.step_s - zero.step_s == pytest.approx(26 * KB * 1e-9 + 4e-5)
    with pytest.raises(ConfigError, match="optimizer_s_per_tensor = -1 must be a finite"):
        SolverSettings(2, free_network(), optimizer_s_per_tensor=-1)


def test_the_loss_is_priced_per_output_value_on_the_last_stage() -> None:
    p = profile([(KB,), (KB,), (KB,), (KB,)])
    loss = RuntimeOverhead(loss_value_s=1e-6)
    assert loss.loss_s(OUT) == pytest.approx(80e-6)  # 80 values
    plan = PipelinePlan((Stage(0, 2), Stage(2, 4)), "gpipe", 4)
    without = stage_durations(p, plan, free_network())
    with_loss = stage_durations(p, plan, free_network(), overhead=loss)
    # every forward of the last stage, nothing else
    assert with_loss.stages[1].forward - without.stages[1].forward == pytest.approx(80e-6)
    assert with_loss.stages[0] == without.stages[0]
    assert with_loss.stages[1].backward == without.stages[1].backward
    # GPipe, 2 stages, 4 micro-batches, free links: the last stage's 4 forwards are on
    # the critical path (its forwards follow the first stage's one by one)
    grown = pipeline_time(p, plan, free_network(), overhead=loss).step_s \
        - pipeline_time(p, plan, free_network()).step_s
    assert grown == pytest.approx(4 * 80e-6)
    # data parallelism: one micro-batch's loss per step; the closed form: per micro-batch
    settings = SolverSettings(2, free_network(), schedule="gpipe", microbatches=4)
    priced = replace(settings, overhead=loss)
    dp0, dp1 = data_parallel(p, settings), data_parallel(p, priced)
    assert dp0 is not None and dp1 is not None
    assert dp1.step_s - dp0.step_s == pytest.approx(80e-6)
    e0, e1 = estimate(p, plan.stages, settings), estimate(p, plan.stages, priced)
    assert e0 is not None and e1 is not None
    assert e1.step_s - e0.step_s == pytest.approx(4 * 80e-6)
    assert simulated(p, priced, plan.stages).step_s == pytest.approx(
        pipeline_time(p, plan, free_network(), overhead=loss).step_s)


def test_the_calibration_file_keeps_the_per_tensor_cost(tmp_path: Path) -> None:
    cal = CostCalibration.of(levels=(LinkLevel("loopback", 1e-4, 1e-9, 0.0, cores=2),),
                             optimizers={"momentum": 4e-10},
                             optimizer_tensors={"momentum": 1.1e-5},
                             overhead=RuntimeOverhead(loss_value_s=5e-9))
    back = CostCalibration.load(cal.save(tmp_path / "cost.json"))
    assert back.optimizer_s_per_tensor("momentum") == 1.1e-5
    assert back.optimizer_s_per_tensor("adam") == 0.0  # not measured: not priced
    assert back.overhead.loss_value_s == 5e-9
    data = json.loads((tmp_path / "cost.json").read_text())
    del data["optimizer_tensors"]  # files written before it: not priced
    assert from_json(data).optimizer_s_per_tensor("momentum") == 0.0
    data["optimizer_tensors"] = {"momentum": -1}
    with pytest.raises(DataError, match=r"optimizer_tensors\['momentum'\] = -1 must be a "
                                        r"finite number of seconds per tensor >= 0"):
        from_json(data, "cost.json")


def test_bad_measurement_settings_name_the_value() -> None:
    with pytest.raises(ConfigError, match="few = 8 and many = 8 must satisfy 1 <= few < many"):
        optimizer_s_per_tensor("momentum", few=8, many=8)
    with pytest.raises(ConfigError, match="optimizer 'lion' is not one of"):
        optimizer_s_per_tensor("lion")
    with pytest.raises(ConfigError, match=r"rows = \(64, 32\) must be two increasing counts"):
        loss_s_per_value(task_named("classify"), rows=(64, 32))
