"""`approxdist train --device cuda` against float64 and against the same run on CPU.

**The first step, against float64** (one GPU). `tests/helpers/first_step.py` takes the first
step of `approxdist train --parallel single` the way `train` does (the CLI's config, the
engine `train` builds, its `train_step` on the first mini-batch) on the GPU and on the CPU:
the same model, batch and initial weights (checked bitwise). Every gradient must lie
within `step_oracle.step_reference`'s bounds of the float64 gradient of that step, element
by element and in the Frobenius norm: Higham's gamma_n = n u / (1 - n u) of each matmul's
and sum's length n times the magnitudes (|A||B|, computed in float64 alongside), layer by
layer, at fp32's u = 2^-24; the CPU's fp32 step passes them too (as in CI,
`tests/unit/test_step_oracle.py`, which also shows what fails them: twice the bound, the
weights rounded to bf16 or TF32, a changed label, a left-out sample). And each operation of
that step (each layer's forward, its input and weight gradients, the loss gradient; hooks
record them, `tests/helpers/op_oracle.py`) must lie within its own rounding bound of
float64 on the GPU's own inputs: nothing compounds there, the CPU's fp32 step uses at most
a third of it (mostly a few per cent), and a matmul on TF32 operands misses it by 6 to 200
times. The step runs with TF32 off (`torch.backends.cuda.matmul.allow_tf32 = False`,
`torch.backends.cudnn.allow_tf32 = False`): TF32 keeps 10 mantissa bits, not fp32's 23.

**An epoch in every mode, against the CPU** (the NCCL modes need 2 GPUs, the hybrid 4).
No bound on the difference follows from the format over a whole epoch: training
amplifies any difference in the weights. So the scale is measured in the same test: the
twin is the CPU run from weights one ulp away (`tests.helpers.user_models:nudged_mlp`, the
same MLP with every weight moved by `nextafter`), and D = |twin's epoch mean loss - the CPU
run's| is what the epoch makes of a one-ulp difference in the weights before step 1 (at
least u |loss|, the finest difference an fp32 loss shows). The GPU run's weights differ
from the CPU run's by what each of the S steps rounds otherwise: after the first step by
R ulps of the twin's (R measured above: the largest |GPU - CPU| weight after one step over
the largest |twin - CPU| one, at least 1), and a step's gradient difference goes on moving
the weights through the momentum buffer, 1 / (1 - momentum) times in all; one entering
later has fewer steps to grow. To first order the GPU's epoch mean loss is within S R D /
(1 - momentum) of the CPU's. A GPU path that trained on wrong values (a stale copy, a
tensor left on another device, a corrupted transfer) moves the loss by orders of magnitude
more, and the steps and the link's bytes must be equal too. (On the CPU D is about 1.5 u
|loss| in the fp32 modes and 1e-5 relative with the pipeline's bf16 wires, whose roundings
the twin's ulp flips as a GPU's do.) These runs keep the product's defaults: TF32 off for
matmuls (PyTorch's default), and an MLP has no convolution for cuDNN's TF32.

Skipped without a GPU (the NCCL runs with fewer than 2); `scripts/gpu_check.sh` runs it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from approxdist.cli.main import main
from approxdist.config.schema import OptimConfig
from approxdist.models.mlp import mlp, tp_plan
from tests.helpers.collective_oracles import U32
from tests.helpers.first_step import MLP, first_step
from tests.helpers.op_oracle import op_excess, op_outside
from tests.helpers.step_oracle import excess, outside, step_reference

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(GPUS < 1, reason="no CUDA GPU visible")]
TWO_GPUS = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs (NCCL: one rank per GPU), "
                                                f"{GPUS} visible")
FOUR_GPUS = pytest.mark.skipif(GPUS < 4, reason=f"needs 4 CUDA GPUs, {GPUS} visible")

TWIN = "tests.helpers.user_models:nudged_mlp"


@pytest.fixture
def no_tf32() -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def step_ratio() -> float:
    """R / (1 - momentum): the largest weight difference GPU - CPU after the first step over
    twin - CPU (R >= 1), through the momentum buffer's every later step."""
    cpu, gpu = first_step("cpu"), first_step("cuda")
    twin = first_step("cpu", "--model", TWIN)
    ratio = _largest_difference(gpu.after, cpu.after) / _largest_difference(twin.after, cpu.after)
    return max(1.0, ratio) / (1 - OptimConfig().momentum)


def test_the_first_step_on_the_gpu_is_within_the_fp32_bound_of_float64(no_tf32: None) -> None:
    torch.cuda.reset_peak_memory_stats()
    gpu = first_step("cuda")
    assert gpu.device.type == "cuda" and torch.cuda.max_memory_allocated() > 0
    cpu = first_step("cpu")
    assert torch.equal(gpu.x, cpu.x) and torch.equal(gpu.y, cpu.y)
    start, same = gpu.model.state_dict(), cpu.model.state_dict()
    assert all(torch.equal(start[k], same[k]) for k in start)
    ref = step_reference(gpu.model, gpu.x, gpu.y)
    assert outside(cpu.grads, ref) == {} and op_outside(cpu) == {}
    assert outside(gpu.grads, ref) == {}, f"|GPU - float64| / bound: {excess(gpu.grads, ref)}"
    assert op_outside(gpu) == {}, f"|GPU - float64| / bound per operation: {op_excess(gpu)}"


def _train(tmp_path: Path, name: str, args: list[str]) -> dict[str, float]:
    out = tmp_path / name
    assert main(["train", *MLP, *args, "--out", str(out)]) == 0
    return dict(json.loads((out / "summary.json").read_text()))


def _twin_flags(args: list[str]) -> list[str]:
    """The twin's model; its tensor-parallel plan is the MLP's (a factory has none)."""
    flags = ["--model", TWIN]
    if "tensor" in args:
        plan = tp_plan(mlp((1, 8, 8), 10))
        flags += ["--tp-plan", ",".join(f"{k}={v}" for k, v in plan.items())]
    return flags


def _same_run(tmp_path: Path, args: list[str], ratio: float
              ) -> tuple[dict[str, float], dict[str, float]]:
    cpu = _train(tmp_path, "cpu", [*args, "--device", "cpu"])
    twin = _train(tmp_path, "twin", [*args, *_twin_flags(args), "--device", "cpu"])
    gpu = _train(tmp_path, "cuda", [*args, "--device", "cuda"])
    assert gpu["steps"] == cpu["steps"] and gpu["world_size"] == cpu["world_size"]
    scale = max(abs(twin["train_loss"] - cpu["train_loss"]), U32 * abs(cpu["train_loss"]))
    allowed = cpu["steps"] * ratio * scale
    assert abs(gpu["train_loss"] - cpu["train_loss"]) <= allowed, (
        f"GPU {gpu['train_loss']}, CPU {cpu['train_loss']}, twin {twin['train_loss']}: "
        f"allowed S R D / (1 - momentum) = {cpu['steps']} x {ratio:.3g} x {scale:.3g}")
    return cpu, gpu


def test_one_process_on_the_gpu_trains_as_on_cpu(tmp_path: Path, step_ratio: float) -> None:
    torch.cuda.reset_peak_memory_stats()
    _same_run(tmp_path, ["--parallel", "single"], step_ratio)
    assert torch.cuda.max_memory_allocated() > 0  # it ran here, on the GPU


@TWO_GPUS
@pytest.mark.parametrize("algorithm", ["native", "ring"])
def test_data_parallel_over_nccl_trains_as_over_gloo(tmp_path: Path, algorithm: str,
                                                     step_ratio: float) -> None:
    cpu, gpu = _same_run(tmp_path, ["--parallel", "dp", "--world-size", "2",
                                    "--algorithm", algorithm], step_ratio)
    if algorithm == "ring":  # through the link layer: the same bytes either way
        assert gpu["bytes_sent"] == cpu["bytes_sent"] > 0


@TWO_GPUS
def test_a_pipeline_over_nccl_trains_as_over_gloo(tmp_path: Path, step_ratio: float) -> None:
    cpu, gpu = _same_run(tmp_path, ["--parallel", "pipeline", "--stages", "2",
                                    "--microbatches", "4", "--fwd-codec", "bf16",
                                    "--bwd-codec", "bf16"], step_ratio)
    assert gpu["bytes_sent"] == cpu["bytes_sent"] > 0


@TWO_GPUS
@pytest.mark.parametrize("mode", [["ps", "--servers", "1", "--workers", "1"],
                                  ["tensor", "--tp", "2", "--set", "tp.algorithm=ring"]],
                         ids=["ps", "tensor"])
def test_a_parameter_server_and_tensor_parallelism_over_nccl_train_as_over_gloo(
        tmp_path: Path, mode: list[str], step_ratio: float) -> None:
    cpu, gpu = _same_run(tmp_path, ["--parallel", *mode, "--world-size", "2"], step_ratio)
    # the link layer's bytes either way (the all-reduce pinned: `auto` calibrates per backend)
    assert gpu["bytes_sent"] == cpu["bytes_sent"] > 0


@FOUR_GPUS
def test_a_hybrid_over_nccl_trains_as_over_gloo(tmp_path: Path, step_ratio: float) -> None:
    cpu, gpu = _same_run(tmp_path, ["--parallel", "hybrid", "--stages", "2", "--replicas", "2",
                                    "--world-size", "4", "--microbatches", "4", "--algorithm",
                                    "ring"], step_ratio)
    assert gpu["bytes_sent"] == cpu["bytes_sent"] > 0
