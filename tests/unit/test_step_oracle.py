"""The first-step oracles of the GPU check, proven on the CPU.

`step_oracle`'s bound on the whole step (Higham's gamma_n layer by layer, fp32's u) must
hold for the fp32 step the product takes on the CPU (`tests/helpers/first_step.py`, the
engine `train` runs) and for the same step summed in another order (as a GPU's kernels
sum), and must not be vacuous: a gradient moved by twice its bound fails it, and so do the
gradients of steps that went wrong by one rounding of another format (the weights as TF32
or bf16 read them) or by one sample (a label changed, a sample left out). `op_oracle`'s
bounds on each operation of the recorded step must hold for that step too, and a matmul
whose operands were rounded to TF32 fails them, as does a record that is not one chain.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.config.schema import ModelConfig
from approxdist.models.registry import build_model
from tests.helpers.collective_oracles import U32
from tests.helpers.first_step import FirstStep, first_step
from tests.helpers.op_oracle import op_excess, op_outside
from tests.helpers.step_oracle import StepReference, gamma, outside, step_reference


@pytest.fixture(scope="module")
def step() -> FirstStep:
    return first_step("cpu")


@pytest.fixture(scope="module")
def ref(step: FirstStep) -> StepReference:
    return step_reference(step.model, step.x, step.y)


def test_gamma_is_highams_and_refuses_n_u_of_one() -> None:
    assert gamma(3, U32) == 3 * U32 / (1 - 3 * U32)
    assert gamma(0, U32) == 0.0
    with pytest.raises(ValueError, match="unbounded"):
        gamma(2 ** 24, U32)


def test_the_fp32_step_the_engine_takes_is_within_the_bound(step: FirstStep,
                                                            ref: StepReference) -> None:
    assert set(step.grads) == {name for name, _ in step.model.named_parameters()}
    assert outside(step.grads, ref) == {}
    # fp32 did round: there was an error to bound
    assert any(not torch.equal(g.double(), ref.grads[k]) for k, g in step.grads.items())


def test_the_step_summed_in_another_order_is_within_the_bound(step: FirstStep,
                                                              ref: StepReference) -> None:
    """The input features permuted (the first layer's dot products in another order) and
    the batch reversed (every weight gradient's sum in another order): the same step."""
    model = copy.deepcopy(step.model)
    first = next(m for m in model.modules() if isinstance(m, nn.Linear))
    perm = torch.randperm(first.in_features, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        first.weight.copy_(first.weight[:, perm])
    out = model(step.x.flatten(1)[:, perm].flip(0))
    F.cross_entropy(out, step.y.flip(0)).backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    name = next(n for n, p in model.named_parameters() if p is first.weight)
    grads[name] = grads[name][:, torch.argsort(perm)]
    assert outside(grads, ref) == {}
    assert any(not torch.equal(grads[k], step.grads[k]) for k in grads)  # another order


def test_a_gradient_moved_by_twice_its_bound_is_outside(step: FirstStep,
                                                        ref: StepReference) -> None:
    for sign in (1, -1):
        moved = {k: g.double() + sign * 2 * ref.bounds[k] for k, g in step.grads.items()}
        assert set(outside(moved, ref)) == set(ref.grads)


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """`t` (fp32) rounded to TF32's 10 mantissa bits, to nearest (ties away from zero)."""
    bits = t.float().contiguous().view(torch.int32)
    return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)


def _rounded(model: nn.Module, rounding: str) -> nn.Module:
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.copy_(_tf32(p) if rounding == "tf32" else p.to(torch.bfloat16).float())
    return out


@pytest.mark.parametrize("fault", ["tf32 weights", "bf16 weights", "a label changed",
                                   "a sample left out"])
def test_the_bound_is_finer_than_a_step_gone_wrong(step: FirstStep, ref: StepReference,
                                                   fault: str) -> None:
    """The exact gradient of a wrong step is outside the right step's bound."""
    model, x, y = step.model, step.x, step.y.clone()
    if fault.endswith("weights"):
        model = _rounded(model, fault.split()[0])
    elif fault == "a label changed":
        y[0] = (y[0] + 1) % 10
    else:
        x, y = x[1:], y[1:]
    wrong = step_reference(model, x, y).grads
    assert outside(wrong, ref), f"{fault}: every gradient within fp32's bound"


def test_a_pre_activation_at_zero_puts_its_whole_gradient_into_the_bound() -> None:
    """x W^T = 0 exactly: a computed sum may land on either side, so the bound of the
    layer's weight gradient covers the gradient the unit would pass; at -1 it is off for
    sure and nothing passes."""
    x, y = torch.tensor([[1.0, 1.0]]), torch.tensor([0])
    bounds = {}
    for bias in (0.0, -1.0):
        model = nn.Sequential(nn.Linear(2, 1), nn.ReLU(), nn.Linear(1, 2))
        with torch.no_grad():
            model[0].weight.copy_(torch.tensor([[1.0, -1.0]]))
            model[0].bias.fill_(bias)
            model[2].weight.copy_(torch.tensor([[1.0], [-1.0]]))
            model[2].bias.zero_()
        r = step_reference(model, x, y)
        assert torch.equal(r.grads["0.weight"], torch.zeros(1, 2))  # off in exact arithmetic
        bounds[bias] = r.bounds["0.weight"]
    # were it on, it would pass d loss / d unit = W2^T (softmax(0) - onehot) = -1, times x
    assert torch.all(bounds[0.0] >= 1.0)
    assert torch.equal(bounds[-1.0], torch.zeros(1, 2))


def test_the_twin_is_the_mlp_one_ulp_up() -> None:
    """`--model tests.helpers.user_models:nudged_mlp` (the GPU check's twin run) builds the
    weights `--model mlp` builds from the same seed, each moved by one ulp."""
    built = {}
    for name in ("mlp", "tests.helpers.user_models:nudged_mlp"):
        torch.manual_seed(3)
        built[name] = build_model(ModelConfig(name=name), (1, 8, 8), 10).state_dict()
    plain, twin = built.values()
    assert plain.keys() == twin.keys()
    for k, w in plain.items():
        assert torch.equal(twin[k], torch.nextafter(w, torch.full_like(w, float("inf"))))


def test_every_operation_of_the_fp32_step_is_within_its_bound(step: FirstStep) -> None:
    checks = op_excess(step)
    linears = [n for n, m in step.model.named_modules() if isinstance(m, nn.Linear)]
    assert {f"{n} forward" for n in linears} | set(step.grads) | {"loss", "chain"} <= set(checks)
    assert op_outside(step) == {}
    assert max(checks.values()) > 0  # fp32 rounded somewhere


def test_a_matmul_on_tf32_operands_is_outside_its_bound(step: FirstStep) -> None:
    """Each Linear's output, and its weight gradient, computed from operands rounded to
    TF32 (as a GPU with TF32 on computes them) instead of the recorded fp32 ones."""
    layers = dict(step.model.named_modules())
    for i, op in enumerate(step.ops):
        layer = layers[op.name]
        if not isinstance(layer, nn.Linear):
            continue
        assert op.grad_out is not None
        ops = [copy.copy(o) for o in step.ops]
        ops[i].out = F.linear(_tf32(op.inp), _tf32(layer.weight.detach()), layer.bias.detach())
        grads = {**step.grads, f"{op.name}.weight": _tf32(op.grad_out).T @ _tf32(op.inp)}
        failed = op_outside(dataclasses.replace(step, ops=ops, grads=grads))
        assert {f"{op.name} forward", f"{op.name}.weight"} <= set(failed), op.name


def test_a_record_that_is_not_one_chain_fails(step: FirstStep) -> None:
    ops = [copy.copy(o) for o in step.ops]
    ops[3].inp = ops[3].inp.flip(0)  # another sample order than the layer before gave
    assert "chain" in op_outside(dataclasses.replace(step, ops=ops))
