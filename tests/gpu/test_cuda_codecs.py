"""Every wire format on CUDA tensors sends and decodes exactly the bytes and values of the
CPU path (its fused C kernels where they are built, `approxdist.kernels.kernel_status()`):
the torch ops a GPU runs must agree with them bit for bit, whatever device each end of a
link is on.

Skipped without a GPU; `scripts/gpu_check.sh` runs it (marker `gpu`)."""

from __future__ import annotations

import pytest
import torch

from approxdist.comm.codecs import DEFAULT_SPECS, Payload, get_codec

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")]

#: the default formats, and widths whose fields straddle byte and half-word boundaries
SPECS = (*DEFAULT_SPECS, "bits:s1e8m10", "bits:s1e3+2m2", "table8")
SPECIAL = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-40, -1e-45, 3.4e38, -3.4e38, 65504.0, 7e4,
                        2.0 ** -24, 1.5, -0.75])
#: an odd count, so packed codes end inside a byte
COUNT = 40_009
#: where the other end runs (a module constant, so the checks can be tried on CPU too)
DEVICE = "cuda"


def _values(spec: str) -> torch.Tensor:
    x = torch.randn(COUNT, generator=torch.Generator().manual_seed(7)) * 10
    x = torch.cat([x, SPECIAL, torch.relu(x[:999])])  # ReLU outputs: many exact zeros
    if spec.startswith(("bits:s", "fp32", "fp16", "bf16")):  # data-fitted codecs need finite
        x = torch.cat([x, torch.tensor([float("inf"), float("-inf"), float("nan")])])
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().contiguous().view(torch.int32).cpu()


@pytest.mark.parametrize("spec", SPECS)
def test_encode_on_cuda_gives_the_cpu_bytes(spec: str) -> None:
    x = _values(spec)
    on_cpu = get_codec(spec).encode(x)
    on_gpu = get_codec(spec).encode(x.to(DEVICE))
    assert on_gpu.data.device.type == DEVICE and on_gpu.shape == on_cpu.shape
    assert torch.equal(on_gpu.data.cpu(), on_cpu.data)


@pytest.mark.parametrize("spec", SPECS)
def test_decode_on_cuda_gives_the_cpu_values(spec: str) -> None:
    x = _values(spec)
    codec = get_codec(spec)
    payload = codec.encode(x)
    want = _bits(codec.decode(payload))
    gpu_payload = Payload(payload.data.to(DEVICE), payload.shape)  # bytes from a CPU sender
    got = get_codec(spec).decode(gpu_payload)
    assert got.device.type == DEVICE and torch.equal(_bits(got), want)
    assert torch.equal(_bits(get_codec(spec).roundtrip(x.to(DEVICE))), want)


@pytest.mark.parametrize("spec", SPECS)
def test_decode_add_on_cuda_gives_the_cpu_sums(spec: str) -> None:
    x = _values(spec)
    codec = get_codec(spec)
    payload = codec.encode(x)
    base = torch.randn(x.numel(), generator=torch.Generator().manual_seed(8))
    want = base.clone()
    codec.decode_add(payload, want)
    got = base.to(DEVICE)
    get_codec(spec).decode_add(Payload(payload.data.to(DEVICE), payload.shape), got)
    assert torch.equal(_bits(got), _bits(want))
