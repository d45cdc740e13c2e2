"""Plans: which layer splits how (torch's `parallelize_module` plan, as data), and applying one.

A plan maps a layer's path in the model (`"1.attn"`, `"2.mlp.0"`) to a style:
| style | layer | becomes |
|---|---|---|
| `colwise` | `nn.Linear` | its output features split (`ColumnLinear`) |
| `rowwise` | `nn.Linear` | its input features split, partial outputs summed (`RowLinear`) |
| `heads` | self-attention (`qkv`, `proj`, `heads`) | its heads split (`HeadParallelAttention`) |
| `channel_out` | `nn.Conv1d/2d` | its output channels split (`ChannelConv`) |
| `channel_in` | `nn.Conv1d/2d` | its input channels split, partial sums summed |
| `channel_norm` | `nn.BatchNorm1d/2d` | the channels of the layer before it (`channel_norm`) |
| `split_seq` | any layer | its output split along the sequence: this rank's positions |
| `colwise_seq`, `heads_seq` | as `colwise`, `heads` | the same, its input's positions gathered first |
| `rowwise_seq` | `nn.Linear` | as `rowwise`, partial outputs reduce-scattered along the sequence |
| `norm_seq` | `nn.LayerNorm` | on this rank's positions, its gradients summed (`SequenceNorm`) |
| `gather_seq` | any layer | its input's positions gathered from every rank |
| `dropout_seq` | `nn.Dropout` | on this rank's positions, one process's mask (`SequenceDropout`) |
The `_seq` styles are sequence parallelism (`sequence.py`; Megatron-LM's, Korthikanti et
al. 2022): between a `split_seq` and a `gather_seq` layer, activations (batch, sequence,
features) hold 1/n of the positions, and whole layers there (dropout, residual adds) run
on those. Every other layer stays whole on every rank (its gradients equal on every
rank). A model's own plan comes from its family (`models.tp_plan`: Megatron's
column-then-row pairs; `models.sequence_plan_of`: with sequence parallelism); a plan file
holds `path = style` lines (`#` comments). `parallelize` checks every name, type and
divisibility before it changes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from approxdist.errors import ConfigError
from approxdist.tensor_parallel.attention import HeadParallelAttention
from approxdist.tensor_parallel.comm import TPComm
from approxdist.tensor_parallel.layers import (
    ChannelConv,
    ColumnLinear,
    RowLinear,
    SequenceNorm,
    channel_norm,
)
from approxdist.tensor_parallel.sequence import (
    SequenceDropout,
    gather_from_sequence,
    scatter_to_sequence,
)
from approxdist.tensor_parallel.shard import piece

Plan = Mapping[str, str]
CONV = (nn.Conv1d, nn.Conv2d)
NORM = (nn.BatchNorm1d, nn.BatchNorm2d)


Make = Callable[[nn.Module, TPComm, str], nn.Module]


def _colwise(sequence: bool) -> Make:
    def make(m: nn.Module, c: TPComm, site: str) -> nn.Module:
        assert isinstance(m, nn.Linear)
        return ColumnLinear(m, piece(m.out_features, c.rank, c.size,
                                     f"output features of {site}"), c, site, sequence)
    return make


def _rowwise(sequence: bool) -> Make:
    def make(m: nn.Module, c: TPComm, site: str) -> nn.Module:
        assert isinstance(m, nn.Linear)
        return RowLinear(m, piece(m.in_features, c.rank, c.size, f"input features of {site}"),
                         c, site, sequence)
    return make


def _channels(split: str) -> Callable[[nn.Module, TPComm, str], nn.Module]:
    def make(m: nn.Module, c: TPComm, site: str) -> nn.Module:
        assert isinstance(m, CONV)
        n = m.out_channels if split == "out" else m.in_channels
        return ChannelConv(m, piece(n, c.rank, c.size, f"{split}put channels of {site}"), split,
                           c, site)
    return make


def _norm(m: nn.Module, c: TPComm, site: str) -> nn.Module:
    assert isinstance(m, NORM)
    return channel_norm(m, piece(m.num_features, c.rank, c.size, f"channels of {site}"))


def _heads(sequence: bool) -> Make:
    def make(m: nn.Module, c: TPComm, site: str) -> nn.Module:
        piece(int(getattr(m, "heads")), c.rank, c.size, f"attention heads of {site}")  # noqa: B009
        return HeadParallelAttention(m, c, site, sequence)
    return make


def _norm_seq(m: nn.Module, c: TPComm, site: str) -> nn.Module:
    assert isinstance(m, nn.LayerNorm)
    return SequenceNorm(m, c, site)


def _split_seq(m: nn.Module, c: TPComm, site: str) -> nn.Module:
    """`m` itself, its output cut to this rank's positions (a forward hook, as torch's
    `parallelize_module` styles; the layer's parameter names stay)."""
    def hook(module: nn.Module, args: Any, out: Any) -> Any:
        return scatter_to_sequence(out, c, site)
    m.register_forward_hook(hook)
    return m


def _gather_seq(m: nn.Module, c: TPComm, site: str) -> nn.Module:
    """`m` itself, its input's positions gathered first (the layer is whole: each rank
    keeps its positions' gradient backward)."""
    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (gather_from_sequence(args[0], c, site, partial_grad=False), *args[1:])
    m.register_forward_pre_hook(hook)
    return m


def _dropout_seq(m: nn.Module, c: TPComm, site: str) -> nn.Module:
    assert isinstance(m, nn.Dropout)
    return SequenceDropout(m.p, c, site)


def _linear(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear)


def _attention(m: nn.Module) -> bool:
    return all(hasattr(m, a) for a in ("qkv", "proj", "heads"))


ATTENTION = "a self-attention with qkv, proj and heads"
#: style -> (the layers it takes, what it needs them to be, how it splits one)
STYLES: dict[str, tuple[Callable[[nn.Module], bool], str, Make]] = {
    "colwise": (_linear, "an nn.Linear", _colwise(False)),
    "rowwise": (_linear, "an nn.Linear", _rowwise(False)),
    "heads": (_attention, ATTENTION, _heads(False)),
    "channel_out": (lambda m: isinstance(m, CONV), "an nn.Conv1d/2d", _channels("out")),
    "channel_in": (lambda m: isinstance(m, CONV), "an nn.Conv1d/2d", _channels("in")),
    "channel_norm": (lambda m: isinstance(m, NORM), "an nn.BatchNorm1d/2d", _norm),
    "split_seq": (lambda m: True, "a layer", _split_seq),
    "colwise_seq": (_linear, "an nn.Linear", _colwise(True)),
    "rowwise_seq": (_linear, "an nn.Linear", _rowwise(True)),
    "heads_seq": (_attention, ATTENTION, _heads(True)),
    "norm_seq": (lambda m: isinstance(m, nn.LayerNorm), "an nn.LayerNorm", _norm_seq),
    "gather_seq": (lambda m: True, "a layer", _gather_seq),
    "dropout_seq": (lambda m: isinstance(m, nn.Dropout), "an nn.Dropout", _dropout_seq),
}


def parallelize(model: nn.Module, plan: Plan, comm: TPComm) -> nn.Module:
    """`model` with every layer `plan` names replaced by this rank's part (in place; also
    returned). Names, types and divisibility are checked for the whole plan first."""
    check_plan(model, plan, comm.size)
    layers = dict(model.named_modules())
    parts = {path: STYLES[style][2](layers[path], comm, path) for path, style in plan.items()}
    for path, part in parts.items():
        model.set_submodule(path, part)
    return model


def check_plan(model: nn.Module, plan: Plan, size: int) -> None:
    """Every layer `plan` names exists, has the type its style splits and a size `size`
    divides; one `ConfigError` line naming the first that does not (no process needed)."""
    if not plan:
        raise ConfigError("the tp plan splits no layer: with nothing split every rank would "
                          "compute the whole model; name layers to split (docs/tensor_parallel.md)")
    layers = dict(model.named_modules())
    for path, style in plan.items():
        if style not in STYLES:
            raise ConfigError(f"tp plan: layer {path!r} has style {style!r}, not one of: "
                              f"{', '.join(STYLES)}")
        if path not in layers or not path:
            near = [n for n in layers if n and n.split(".")[0] == path.split(".")[0]]
            splittable = [n for n, m in layers.items() if any(f(m) for f, _, _ in STYLES.values())]
            raise ConfigError(f"tp plan names layer {path!r}, which the model does not have; "
                              + (f"its layers there: {', '.join(near[:8])}" if near else
                                 f"layers a style splits: {', '.join(splittable[:8])}"
                                 + (", ..." if len(splittable) > 8 else "")))
        fits, what, _ = STYLES[style]
        if not fits(layers[path]):
            raise ConfigError(f"tp plan: style {style} needs {what}; layer {path!r} is "
                              f"{type(layers[path]).__name__}")
        for n, what_split in _split_sizes(layers[path], style, path):
            piece(n, 0, size, what_split)
    _check_sequence(plan)


def _check_sequence(plan: Plan) -> None:
    """A plan with sequence-parallel styles enters the region somewhere and leaves it."""
    styles = set(plan.values())
    if any(s.endswith("_seq") for s in styles):
        for end, what in (("split_seq", "enters"), ("gather_seq", "leaves")):
            if end not in styles:
                raise ConfigError(f"tp plan uses sequence-parallel styles but no layer has "
                                  f"style {end} (where the sequence-split region {what}); "
                                  f"e.g. the gpt plan: models.sequence_plan_of('gpt-tiny')")


def _split_sizes(m: nn.Module, style: str, site: str) -> list[tuple[int, str]]:
    """The sizes a style splits on layer `m` (for the divisibility check)."""
    style = style.removesuffix("_seq")
    if style in ("split", "gather", "norm", "dropout"):
        return []  # the sequence length is the data's (checked when it arrives)
    if style == "colwise":
        return [(int(m.out_features), f"output features of {site}")]  # type: ignore[arg-type]
    if style == "rowwise":
        return [(int(m.in_features), f"input features of {site}")]  # type: ignore[arg-type]
    if style == "heads":
        return [(int(getattr(m, "heads")), f"attention heads of {site}")]  # noqa: B009
    if style in ("channel_out", "channel_in"):
        attr = "out_channels" if style == "channel_out" else "in_channels"
        return [(int(getattr(m, attr)), f"{attr.split('_')[0]}put channels of {site}")]
    return [(int(getattr(m, "num_features")), f"channels of {site}")]  # noqa: B009


def read_tp_plan(path: str | Path) -> dict[str, str]:
    """A plan file: one `layer.path = style` per line; `#` starts a comment."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"tp plan file {str(p)!r} cannot be read ({exc.strerror}); pass a "
                          f"file of 'layer.path = style' lines, or the plan inline: "
                          f"0=colwise,2=rowwise") from None
    entries = [(f"tp plan file {str(p)!r} line {n}", line) for n, line in
               enumerate((raw.split("#", 1)[0].strip() for raw in text.splitlines()), 1)]
    return _plan_of([(where, line) for where, line in entries if line],
                    "'layer.path = style'; e.g. 1.mlp.0 = colwise")


def tp_plan_from(spec: str) -> dict[str, str]:
    """`tp.plan`: a plan file, or the plan inline (`0=colwise,2=rowwise`)."""
    if "=" not in spec or Path(spec).exists():
        return read_tp_plan(spec)
    return _plan_of([(f"tp.plan = {spec!r}", item.strip()) for item in spec.split(",")],
                    "'layer.path=style'; e.g. 0=colwise,2=rowwise, or a plan file")


def _plan_of(entries: list[tuple[str, str]], form: str) -> dict[str, str]:
    """{layer: style} from `(where, "layer = style")` entries; `ConfigError` naming `where`
    and the `form` expected for one that is not."""
    plan: dict[str, str] = {}
    for where, entry in entries:
        name, eq, style = (part.strip() for part in entry.partition("="))
        if not eq or not name or not style:
            raise ConfigError(f"{where}: {entry!r} is not {form}")
        plan[name] = style
    return plan


def default_plan(model: nn.Module, family: Callable[[nn.Module], dict[str, str]] | None,
                 name: str) -> dict[str, str]:
    """The model family's own plan; a model without one needs a plan file."""
    if family is None:
        raise ConfigError(f"model {name!r} has no tensor-parallel plan of its own; pass a plan "
                          f"file (--tp-plan FILE of 'layer.path = style' lines, "
                          f"docs/tensor_parallel.md)")
    return family(model)
