"""A model's whole state from its tensor-parallel shards' (pure): what reloads a checkpoint
at another `tp` size.

Each shard's checkpoint holds its parameters and buffers and, per split one, the
dimension and the indices of the whole it holds (`index_table`). `merge_shards` puts every
shard's pieces back into a whole model's state: each entry of a split tensor must come
from exactly one shard and a tensor no shard splits must be equal on all of them, so a
wrong or missing shard is an error, never a silently wrong model. Splitting the whole
again at any `tp` size is `parallelize` (the layers are cut from a whole model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from approxdist.errors import ConfigError
from approxdist.tensor_parallel.layers import Index

#: a shard's split tensors: name -> (the dimension split, the indices it holds, int64)
IndexTable = dict[str, tuple[int, torch.Tensor]]


def index_table(index: Mapping[str, tuple[int, Index]]) -> IndexTable:
    """`shard_index`'s entries as explicit int64 index tensors (a checkpoint holds them and
    loads them with `weights_only`); a slice has its bounds (`shard.piece` makes them so)."""
    out: IndexTable = {}
    for name, (dim, where) in index.items():
        rows = range(where.start or 0, where.stop, where.step or 1) \
            if isinstance(where, slice) else where
        out[name] = (dim, torch.tensor(list(rows), dtype=torch.int64))
    return out


def merge_shards(whole: Mapping[str, torch.Tensor],
                 shards: Sequence[tuple[Mapping[str, torch.Tensor], IndexTable]],
                 prefix: str = "") -> dict[str, torch.Tensor]:
    """The whole model's state (`whole` gives its names and shapes) from every shard's
    (state, index table) in rank order; a shard's names are `prefix` + the whole's.
    `ConfigError` when a shard lacks a tensor, a split tensor's pieces do not cover it
    exactly once, or an unsplit tensor differs between shards."""
    out: dict[str, torch.Tensor] = {}
    for name, like in whole.items():
        key = prefix + name
        for r, (state, _) in enumerate(shards):
            if key not in state:
                raise ConfigError(f"shard {r} holds no {name!r}: its checkpoint is of another "
                                  "model or plan; evaluate the run it came from")
        split = [table.get(key) for _, table in shards]
        if all(s is None for s in split):
            out[name] = _replicated(name, [state[key] for state, _ in shards])
        else:
            out[name] = _assembled(name, like, [(state[key], s) for (state, _), s
                                                in zip(shards, split, strict=True)])
    return out


def _replicated(name: str, copies: Sequence[torch.Tensor]) -> torch.Tensor:
    first = copies[0]
    for r, t in enumerate(copies[1:], start=1):
        if t.shape != first.shape or not torch.equal(t, first):
            raise ConfigError(f"{name!r} differs between shard 0 and shard {r} though no "
                              "shard splits it: the shards come from different runs or epochs")
    return first.clone()


def _assembled(name: str, like: torch.Tensor,
               pieces: Sequence[tuple[torch.Tensor, tuple[int, torch.Tensor] | None]]
               ) -> torch.Tensor:
    full = torch.zeros_like(like)
    seen = torch.zeros(like.shape[pieces[0][1][0]] if pieces[0][1] else 0, dtype=torch.int64)
    for r, (t, where) in enumerate(pieces):
        if where is None:
            raise ConfigError(f"shard {r} holds {name!r} whole while another splits it: the "
                              "shards come from different plans")
        dim, rows = where
        if seen.numel() != like.shape[dim] or t.shape[dim] != rows.numel():
            raise ConfigError(f"shard {r}'s piece of {name!r} ({tuple(t.shape)}) does not fit "
                              f"the model's {tuple(like.shape)}: evaluate with the run's model")
        full.index_copy_(dim, rows, t.to(full.dtype))
        seen.index_add_(0, rows, torch.ones_like(rows))
    if not torch.equal(seen, torch.ones_like(seen)):
        raise ConfigError(f"the shards' pieces of {name!r} do not cover it exactly once: a "
                          "shard is missing or repeated")
    return full
