"""A model's tensor-parallel layout under a plan, read off one forward pass (the cost model's `TPLayout`).

The cost of a tp axis (`cost.tensor`) needs, per block of the model, what share of its
compute the plan splits and which parameters, and every collective the split layers run
with its size. `measure_layout` reads them off one forward pass of the whole model on a
sample, with hooks on every layer (no process, no group):

- a collective per split layer as `tensor_parallel.regions` places them: `rowwise`,
  `channel_in` and attention's output projection all-reduce their output forward; `colwise`,
  `channel_out` and attention's q, k, v projection their input's gradient backward, where
  that input needs a gradient (a model's first layer, on the data, needs none: autograd
  never runs its backward region);
- the compute as floating-point work per layer: 2 x outputs x inputs of a `Linear`,
  2 x outputs x (input channels / groups) x kernel of a convolution, 4 x batch x T^2 x dim
  for the attention scores and their weighted sum, one per output value for any other
  layer. A layer the plan splits is split work, and so is a layer that takes a split
  activation (the ReLU or GELU after a column-parallel layer, up to the row-parallel one);
- a split layer's parameters are split except a row-parallel layer's bias, which every
  shard holds whole (`tensor_parallel.layers`).

`tensor_parallel.check_plan` checks the plan against the model first, and says for each tp
size asked which layer it cannot split (`TPLayout.refused`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from approxdist.config.loader import load_config
from approxdist.config.schema import DataConfig, ModelConfig
from approxdist.errors import ConfigError
from approxdist.models import tp_plan_of
from approxdist.planner.cost.tensor import TPBlock, TPLayout, TPSite
from approxdist.planner.profile import Profile
from approxdist.planner.profiler import model_and_sample
from approxdist.tensor_parallel import check_plan, default_plan, tp_plan_from

#: styles whose collective is forward (partial outputs summed) / backward (input gradient)
ROW = ("rowwise", "channel_in")
COLUMN = ("colwise", "channel_out")
FREE = (nn.Flatten, nn.Unflatten, nn.Identity)


def _attention(m: nn.Module) -> bool:
    return all(hasattr(m, a) for a in ("qkv", "proj", "heads"))


def _work(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Floating-point work of one layer's forward (see the module's docstring)."""
    if isinstance(m, nn.Linear):
        return 2.0 * y.numel() * m.in_features
    if isinstance(m, (nn.Conv1d, nn.Conv2d)):
        return 2.0 * y.numel() * (m.in_channels // m.groups) * math.prod(m.kernel_size)
    if isinstance(m, FREE) or (isinstance(m, nn.Dropout) and m.p == 0):
        return 0.0
    if _attention(m):  # scores and their weighted sum; its projections are layers of their own
        b, t, d = x.shape
        return 4.0 * b * t * t * d
    return float(y.numel()) if not list(m.children()) else 0.0  # containers: their layers


def _split_param(style: str, name: str) -> bool:
    """Whether a split layer's parameter `name` (relative to the layer) is split."""
    if not name.endswith("bias"):
        return True
    return not (style in ROW or (style == "heads" and name.startswith("proj.")))


def measure_layout(model: nn.Module, plan: Mapping[str, str], sample: torch.Tensor, name: str,
                   sizes: Iterable[int] = ()) -> TPLayout:
    """The layout of `model` (an `nn.Sequential` of blocks) under `plan`, from one forward
    pass on `sample`; `sizes`: tp sizes to check the plan against (`refused`)."""
    check_plan(model, plan, 1)
    refused = []
    for tp in sorted(set(sizes)):
        try:
            check_plan(model, plan, tp)
        except ConfigError as exc:
            refused.append((tp, str(exc)))
    blocks = {id(m): i for i, m in enumerate(model.children())}
    paths = {id(m): p for p, m in model.named_modules()}
    top = {p: blocks[id(m)] for p, m in model.named_modules() if id(m) in blocks}
    batch = int(sample.shape[0])
    work = [[0.0, 0.0] for _ in blocks]  # per block: whole, split
    sites: list[TPSite] = []
    split: list[torch.Tensor] = []  # activations split over the ranks (kept alive: ids)

    def owner(path: str) -> tuple[int, str | None]:
        inside = [p for p in plan if path == p or path.startswith(p + ".")]
        return top[path.split(".")[0]], (plan[inside[0]] if inside else None)

    def hook(m: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        path = paths[id(m)]
        if not path or not isinstance(out, torch.Tensor):
            return
        x = args[0] if args and isinstance(args[0], torch.Tensor) else out
        block, style = owner(path)
        taken = any(x is t for t in split)
        if path in plan:
            if style in ROW or style == "heads":
                sites.append(TPSite(block, path, "fwd", out.numel() // batch))
            if (style in COLUMN or style == "heads") and x.requires_grad:
                sites.append(TPSite(block, path, "bwd", x.numel() // batch))
        leaf = not list(m.children())
        if path in plan or style is not None or (taken and leaf):
            work[block][1] += _work(m, x, out)
        else:
            work[block][0] += _work(m, x, out)
        # a column-split layer's output is split, and stays so through the layers it feeds
        # up to a row-split one (the layers inside an attention split by heads are its own)
        if (path in plan and style not in ROW and style != "heads") or \
                (style is None and taken and leaf):
            split.append(out)

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.enable_grad():
            model(sample)
    finally:
        for h in handles:
            h.remove()
    out_blocks = []
    for i, block in enumerate(model.children()):
        prefix = next(p for p, b in top.items() if b == i)
        params = []
        for pname, p in block.named_parameters():
            full = f"{prefix}.{pname}"
            layer = next((q for q in plan if full.startswith(q + ".")), None)
            params.append((p.numel() * p.element_size(),
                           layer is not None and _split_param(plan[layer],
                                                              full[len(layer) + 1:])))
        total = sum(work[i])
        out_blocks.append(TPBlock(work[i][1] / total if total > 0 else 0.0, tuple(params)))
    sites.sort(key=lambda s: (s.block, s.direction == "bwd"))
    return TPLayout(name, tuple(plan.items()), tuple(out_blocks), tuple(sites), tuple(refused))


def plan_for(model: nn.Module, name: str, spec: str = "") -> dict[str, str]:
    """`spec` (a plan file or `0=colwise,2=rowwise`), or the model family's own plan."""
    return tp_plan_from(spec) if spec else default_plan(model, tp_plan_of(name), name)


def layout_of(model_cfg: ModelConfig, data_cfg: DataConfig, micro_batch_size: int,
              spec: str = "", sizes: Iterable[int] = ()) -> TPLayout:
    """The layout of the model a run trains (seed 0) on its first `micro_batch_size`
    training samples, under `spec` or the family's plan."""
    model, sample = model_and_sample(model_cfg, data_cfg, micro_batch_size)
    model.train()
    return measure_layout(model, plan_for(model, model_cfg.name, spec), sample,
                          model_cfg.name, sizes)


def profiled_config(profile: Profile) -> tuple[ModelConfig, DataConfig]:
    """The model and data set a profile file says it measured; `ConfigError` where it does
    not say (a PipeDream graph.txt, an older file)."""
    if profile.model_options is None or profile.data is None:
        raise ConfigError(f"profile of {profile.model!r} does not record its model options and "
                          f"data set (a PipeDream graph.txt or an older file), so its layers "
                          f"cannot be split; profile it with approxdist plan profile --model "
                          f"{profile.model}")
    cfg = load_config(None, {"model": {"name": profile.model, **profile.model_options},
                             "data": dict(profile.data)}, {})
    return cfg.model, cfg.data
