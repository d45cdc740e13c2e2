"""`approxdist train --device cuda` against the same run on CPU: one process on one GPU; with
2 GPUs data parallelism over NCCL with the native and a link-layer all-reduce, a 2-stage
pipeline whose wires carry bf16, a parameter server (1 server + 1 worker) and tensor
parallelism (tp 2); with 4 GPUs a hybrid (2 stages x 2 replicas). NCCL runs one rank per
GPU (it refuses two ranks of a group on one device), so a machine with one GPU runs the
single-process check only.

The oracle is the CPU run of the same config (same seed, data and initial weights): only
the order of float32 sums differs (a relative 1e-7 per operation), so the epoch's mean
training loss agrees to 1e-3 relative; a GPU path that trained on wrong values (a stale
copy, a tensor left on the wrong device, a corrupted transfer) misses that by far. The
model is an MLP: no convolution, so no TF32 rounding from cuDNN.

Skipped without a GPU (the 2-rank runs with fewer than 2); `scripts/gpu_check.sh` runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from approxdist.cli.main import main

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(GPUS < 1, reason="no CUDA GPU visible")]
TWO_GPUS = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs (NCCL: one rank per GPU), "
                                                f"{GPUS} visible")
FOUR_GPUS = pytest.mark.skipif(GPUS < 4, reason=f"needs 4 CUDA GPUs, {GPUS} visible")

MLP = ["--model", "mlp", "--epochs", "1", "--seed", "3"]
REL = 1e-3


def _train(tmp_path: Path, name: str, args: list[str]) -> dict[str, float]:
    out = tmp_path / name
    assert main(["train", *MLP, *args, "--out", str(out)]) == 0
    return dict(json.loads((out / "summary.json").read_text()))


def _same_run(tmp_path: Path, args: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    cpu = _train(tmp_path, "cpu", [*args, "--device", "cpu"])
    gpu = _train(tmp_path, "cuda", [*args, "--device", "cuda"])
    assert gpu["steps"] == cpu["steps"] and gpu["world_size"] == cpu["world_size"]
    assert gpu["train_loss"] == pytest.approx(cpu["train_loss"], rel=REL)
    return cpu, gpu


def test_one_process_on_the_gpu_trains_as_on_cpu(tmp_path: Path) -> None:
    torch.cuda.reset_peak_memory_stats()
    _same_run(tmp_path, ["--parallel", "single"])
    assert torch.cuda.max_memory_allocated() > 0  # it ran here, on the GPU


@TWO_GPUS
@pytest.mark.parametrize("algorithm", ["native", "ring"])
def test_data_parallel_over_nccl_trains_as_over_gloo(tmp_path: Path, algorithm: str) -> None:
    cpu, gpu = _same_run(tmp_path, ["--parallel", "dp", "--world-size", "2",
                                    "--algorithm", algorithm])
    if algorithm == "ring":  # through the link layer: the same bytes either way
        assert gpu["bytes_sent"] == cpu["bytes_sent"] > 0


@TWO_GPUS
def test_a_pipeline_over_nccl_trains_as_over_gloo(tmp_path: Path) -> None:
    cpu, gpu = _same_run(tmp_path, ["--parallel", "pipeline", "--stages", "2",
                                    "--microbatches", "4", "--fwd-codec", "bf16",
                                    "--bwd-codec", "bf16"])
    assert gpu["bytes_sent"] == cpu["bytes_sent"] > 0


@TWO_GPUS
@pytest.mark.parametrize("mode", [["ps", "--servers", "1", "--workers", "1"],
                                  ["tensor", "--tp", "2", "--set", "tp.algorithm=ring"]],
                         ids=["ps", "tensor"])
def test_a_parameter_server_and_tensor_parallelism_over_nccl_train_as_over_gloo(
        tmp_path: Path, mode: list[str]) -> None:
    cpu, gpu = _same_run(tmp_path, ["--parallel", *mode, "--world-size", "2"])
    # the link layer's bytes either way (the all-reduce pinned: `auto` calibrates per backend)
    assert gpu["bytes_sent"] == cpu["bytes_sent"] > 0


@FOUR_GPUS
def test_a_hybrid_over_nccl_trains_as_over_gloo(tmp_path: Path) -> None:
    cpu, gpu = _same_run(tmp_path, ["--parallel", "hybrid", "--stages", "2", "--replicas", "2",
                                    "--world-size", "4", "--microbatches", "4", "--algorithm", "ring"])
    assert gpu["bytes_sent"] == cpu["bytes_sent"] > 0
