"""The planner's profiler: per-block times and bytes of a model, and `approxdist plan profile`."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from approxdist.cli.main import main
from approxdist.errors import DataError
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.profiler import measure_blocks, pass_cpu_s
from approxdist.planner.profile import read_profile, scale_times
from approxdist.planner.profiler import profile_model
from approxdist.train.profile_probe import ProbeRound, by_busy, drift, under_load


def test_blocks_report_their_output_parameter_and_stashed_bytes() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    blocks = measure_blocks(model, torch.randn(5, 8), repeat=1, warmup=0)
    assert [b.name for b in blocks] == ["0 Linear", "1 ReLU", "2 Linear"]
    assert [b.out_bytes for b in blocks] == [5 * 16 * 4, 5 * 16 * 4, 5 * 4 * 4]
    assert [b.param_bytes for b in blocks] == [(8 * 16 + 16) * 4, 0, (16 * 4 + 4) * 4]
    # each tensor's bytes in registration order, as the data-parallel engine buckets them
    assert [b.param_sizes for b in blocks] == [(8 * 16 * 4, 16 * 4), (), (16 * 4 * 4, 4 * 4)]
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


def test_each_timed_pass_starts_without_gradients_or_adds_into_them() -> None:
    """A fresh pass writes the gradients as a step does after zero_grad(set_to_none=True)
    (an extra pass over every weight inflated a wide MLP's profile 1.7x when every run
    added into the last); the pass after it adds into them, as a later micro-batch does."""
    from approxdist.pipeline.profiler import _timed_pass

    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(8, 4), nn.Tanh())
    x = torch.randn(3, 8)
    for _ in range(3):
        _timed_pass(seq, x, fresh=True)
    once = nn.Linear(8, 4)
    once.load_state_dict(seq[0].state_dict())
    nn.Sequential(once, nn.Tanh())(x).sum().backward()
    assert torch.equal(seq[0].weight.grad, once.weight.grad)
    _timed_pass(seq, x, fresh=False)
    assert torch.allclose(seq[0].weight.grad, 2 * once.weight.grad)


class _LogicalClock:
    """The profiler's clock in these tests: it moves only when a block says it works
    (`advance`), so each block's share is exact whatever the machine's speed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __deepcopy__(self, memo: dict[int, Any]) -> _LogicalClock:
        return self  # the profiler times a deep copy of the model: one clock for both

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _Slow(torch.autograd.Function):
    """Identity whose forward / backward advance `clock` (the backward only while `owner`
    already holds a gradient, when `only_accumulating`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, owner: nn.Module, clock: _LogicalClock,
                fwd_s: float, bwd_s: float, only_accumulating: bool) -> torch.Tensor:
        ctx.owner, ctx.clock, ctx.bwd_s, ctx.only = owner, clock, bwd_s, only_accumulating
        clock.advance(fwd_s)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        if not ctx.only or ctx.owner.weight.grad is not None:
            ctx.clock.advance(ctx.bwd_s)
        return grad, None, None, None, None, None


class _SlowLinear(nn.Linear):
    def __init__(self, clock: _LogicalClock, fwd_s: float = 0.0, bwd_s: float = 0.0,
                 only_accumulating: bool = False) -> None:
        super().__init__(4, 4)
        self.clock, self.times = clock, (fwd_s, bwd_s, only_accumulating)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Slow.apply(super().forward(x), self, self.clock, *self.times)


def test_blocks_are_timed_in_context_each_with_its_own_share(monkeypatch) -> None:
    """The clock marks at the blocks' boundaries give each block what it did: a block
    that works in its forward, one that works in its backward and one that works only
    when accumulating are told apart (the backward of block i runs from its output's
    gradient to its input's, which the hooks mark). The clock is logical and moves by
    powers of two, so every share is exact."""
    from approxdist.pipeline import profiler

    clock = _LogicalClock()
    monkeypatch.setattr(profiler, "time", clock)
    t = 2.0 ** -5
    model = nn.Sequential(_SlowLinear(clock, fwd_s=t), _SlowLinear(clock, bwd_s=t), nn.Tanh(),
                          _SlowLinear(clock, bwd_s=t, only_accumulating=True),
                          _SlowLinear(clock))
    blocks = profiler.measure_blocks(model, torch.randn(2, 4), repeat=3, warmup=0)
    assert [b.fwd_s for b in blocks] == [t, 0, 0, 0, 0]
    assert [b.bwd_s for b in blocks] == [0, t, 0, 0, 0]
    assert [b.acc_s for b in blocks] == [0, 0, 0, t, 0]


def test_a_block_no_gradient_reaches_has_no_backward() -> None:
    """The data needs no gradient, so a first block without parameters (a flatten) has
    no backward: the model's whole backward belongs to the blocks after it."""
    from approxdist.pipeline.profiler import _timed_pass

    fwd, bwd = _timed_pass(nn.Sequential(nn.Flatten(), nn.Linear(16, 4)), torch.randn(2, 4, 4),
                           fresh=True)
    assert bwd[0] == 0.0 and bwd[1] > 0 and all(f > 0 for f in fwd)


def test_the_adding_pass_accumulates_as_the_pipeline_stage_does(monkeypatch) -> None:
    """With `fuse_accumulation` the adding pass runs large Linear layers fused (one
    addmm_ into .grad, as `StageCompute` runs them), the fresh pass plainly; `off` never
    fuses; an unknown mode is refused."""
    from approxdist.pipeline import accumulate
    from approxdist.pipeline.errors import PipelineError
    from approxdist.pipeline.profiler import measure_blocks

    calls: list[int] = []
    backward = accumulate._LinearAccumulate.backward

    def counted(ctx: Any, grad: torch.Tensor) -> Any:
        calls.append(1)
        return backward(ctx, grad)

    monkeypatch.setattr(accumulate._LinearAccumulate, "backward", staticmethod(counted))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    measure_blocks(model, torch.randn(5, 8), repeat=2, warmup=0, fuse_accumulation="off")
    assert calls == []
    measure_blocks(model, torch.randn(5, 8), repeat=2, warmup=0, fuse_accumulation="all")
    assert len(calls) == 2 * 2  # two Linear layers, in each of the 2 adding passes
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(PipelineError, match="fuse_accumulation = 'some' is not one of"):
        measure_blocks(model, torch.randn(5, 8), fuse_accumulation="some")


def test_a_pass_costs_cpu_and_leaves_the_model_as_it_was() -> None:
    """Alone, a pass's CPU seconds are about its wall seconds; what the probe compares
    under load. The model is measured on a copy."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    before = [p.detach().clone() for p in model.parameters()]
    assert pass_cpu_s(model, torch.randn(32, 64), repeat=3) > 0
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    with pytest.raises(PipelineError, match="repeat \\(0\\) must be >= 1"):
        pass_cpu_s(model, torch.randn(2, 64), repeat=0)


def test_probe_rounds_join_by_median_of_each_rounds_profile_under_its_load() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
    one = profile_model(model, torch.randn(3, 8), "tiny", threads=1, repeat=1)
    two = scale_times(one, 3.0)
    assert [b.fwd_s for b in two.blocks] == pytest.approx([3 * b.fwd_s for b in one.blocks])
    assert [b.out_bytes for b in two.blocks] == [b.out_bytes for b in one.blocks]
    rounds = [ProbeRound(one, 1.0, 1.1), ProbeRound(two, 2.0, 2.0), ProbeRound(one, 1.0, 1.3)]
    assert [r.load_factor for r in rounds] == pytest.approx([1.1, 1.0, 1.3])
    got, factor = under_load(rounds)
    assert factor == pytest.approx(1.1)  # the median round's, not the mean
    # each round's profile times its own factor, (1.1x, 3x, 1.3x): the median is 1.3x
    assert [b.bwd_s for b in got.blocks] == pytest.approx([1.3 * b.bwd_s for b in one.blocks])
    with pytest.raises(DataError, match="at least one probe round"):
        under_load([])
    with pytest.raises(DataError, match="time factor = 0 must be a finite number > 0"):
        scale_times(one, 0)


def test_probe_rounds_join_per_number_of_ranks_computing() -> None:
    """With 4 ranks a round also has the loaded pass with 2 and 3 of them computing:
    factors (1 alone, 2, 3, 4), each joined over the rounds as `under_load` joins them."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
    one = profile_model(model, torch.randn(3, 8), "tiny", threads=1, repeat=1)
    rounds = [ProbeRound(one, 1.0, 1.2, (1.0, 1.1)), ProbeRound(one, 2.0, 2.6, (2.2, 2.4)),
              ProbeRound(one, 1.0, 1.3, (1.05, 1.1))]
    assert rounds[1].factors == pytest.approx((1.0, 1.1, 1.2, 1.3))
    profiles, factors = by_busy(rounds)
    assert factors == pytest.approx((1.0, 1.05, 1.1, 1.3))
    assert [p.blocks[0].fwd_s for p in profiles] == pytest.approx(
        [f * one.blocks[0].fwd_s for f in factors])
    assert under_load(rounds)[1] == pytest.approx(1.3)  # every rank computing
    with pytest.raises(DataError, match=r"probe rounds of different world sizes \(\[3, 4\]"):
        by_busy([*rounds, ProbeRound(one, 1.0, 1.2, (1.1,))])


def test_the_drift_is_the_rounds_pass_alone_over_the_ex_ante_ones() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
    one = profile_model(model, torch.randn(3, 8), "tiny", threads=1, repeat=1)
    before = [ProbeRound(one, 1.0, 1.2), ProbeRound(one, 1.2, 1.3), ProbeRound(one, 5.0, 5.0)]
    during = [ProbeRound(one, 1.1, 1.2), ProbeRound(one, 1.32, 1.4)]
    assert drift(before, during) == pytest.approx(1.21 / 1.2)  # medians: 1.21 over 1.2
    with pytest.raises(DataError, match="probe rounds before and during"):
        drift([], during)


def test_profiling_holds_freed_memory_before_timing_as_the_ranks_do(monkeypatch) -> None:
    """Without it a large layer's fresh gradient was faulted in at every timed backward
    (2x mlp-wide's backward in a process that had not held its heap yet)."""
    from approxdist.planner import profiler

    calls: list[str] = []
    monkeypatch.setattr(profiler, "hold_freed_memory", lambda: calls.append("hold") or "")
    timed = profiler.measure_blocks

    def measure(*args: Any, **kwargs: Any) -> Any:
        calls.append("time")
        return timed(*args, **kwargs)

    monkeypatch.setattr(profiler, "measure_blocks", measure)
    profile_model(nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4), "tiny", threads=1,
                  repeat=1, warmup=0)
    assert calls == ["hold", "time"]
