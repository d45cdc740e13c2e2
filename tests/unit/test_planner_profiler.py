"""The planner's profiler: per-block times and bytes of a model, and `approxdist plan profile`."""

from __future__ import annotations

import torch
from torch import nn

from approxdist.cli.main import main
from approxdist.pipeline.profiler import measure_blocks
from approxdist.planner.profile import read_profile
from approxdist.planner.profiler import profile_model


def test_blocks_report_their_output_parameter_and_stashed_bytes() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    blocks = measure_blocks(model, torch.randn(5, 8), repeat=1, warmup=0)
    assert [b.name for b in blocks] == ["0 Linear", "1 ReLU", "2 Linear"]
    assert [b.out_bytes for b in blocks] == [5 * 16 * 4, 5 * 16 * 4, 5 * 4 * 4]
    assert [b.param_bytes for b in blocks] == [(8 * 16 + 16) * 4, 0, (16 * 4 + 4) * 4]
    # a Linear keeps its input (its weight is a parameter, not stashed); ReLU its output
    assert [b.stash_bytes for b in blocks] == [5 * 8 * 4, 5 * 16 * 4, 5 * 16 * 4]
    assert all(b.fwd_s > 0 and b.bwd_s > 0 for b in blocks)
    assert all(p.grad is None for p in model.parameters())


def test_profile_records_its_conditions_and_restores_threads() -> None:
    before = torch.get_num_threads()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
    profile = profile_model(model, torch.randn(3, 8), "tiny", threads=1, repeat=1)
    assert torch.get_num_threads() == before
    assert (profile.model, profile.input_shape, profile.micro_batch_size, profile.threads) == \
        ("tiny", (8,), 3, 1)
    assert profile.torch_version == torch.__version__ and "cores" in profile.machine


def test_plan_profile_writes_a_readable_profile_file(tmp_path, capsys) -> None:
    out = tmp_path / "mlp.json"
    assert main(["plan", "profile", "--model", "mlp", "--microbatch-size", "16",
                 "--threads", "1", "--repeat", "1", "--json", str(out)]) == 0
    profile = read_profile(out)
    text = capsys.readouterr().out
    assert profile.model == "mlp" and profile.micro_batch_size == 16 and profile.threads == 1
    assert profile.input_shape == (1, 8, 8)  # digits: one 8 x 8 grey image per sample
    assert f"{len(profile.blocks)} blocks" in text and profile.blocks[0].name in text


def test_plan_profile_refuses_a_micro_batch_larger_than_the_data(capsys) -> None:
    assert main(["plan", "profile", "--model", "mlp", "--microbatch-size", "100000"]) == 2
    assert "micro-batch size 100000 must be 1.." in capsys.readouterr().err


def test_each_timed_run_starts_without_gradients() -> None:
    """The profiler's backward writes a block's gradients as a training step's does after
    zero_grad(set_to_none=True), never adding into the last run's (an extra pass over
    every weight that inflated a wide MLP's profile 1.7x)."""
    from approxdist.pipeline.profiler import _forward_backward

    torch.manual_seed(0)
    block = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    for _ in range(3):
        _forward_backward(block, x)
    once = torch.nn.Linear(8, 4)
    once.load_state_dict(block.state_dict())
    once(x.clone().requires_grad_(True)).sum().backward()
    assert once.weight.grad is not None and block.weight.grad is not None
    assert torch.equal(block.weight.grad, once.weight.grad)
