"""Parameters -> servers, balanced by bytes (pure): the largest tensor goes to the least
loaded server first (longest-processing-time rule, Graham 1969), ties to the lower index."""

from __future__ import annotations

from collections.abc import Sequence

from approxdist.errors import ConfigError


def shard_by_bytes(sizes: Sequence[int], servers: int,
                   name: str = "--servers") -> tuple[tuple[int, ...], ...]:
    """For each of `servers` servers, the indices (ascending) of the tensors it holds, given
    each tensor's size in bytes. Every tensor goes to exactly one server; every server gets
    at least one (`ConfigError` naming the counts, and `name`, the setting, otherwise)."""
    sep = " " if name.startswith("-") else "="
    if servers < 1:
        raise ConfigError(f"{name}{sep}{servers} must be >= 1")
    if len(sizes) < servers:
        raise ConfigError(f"{name}{sep}{servers}: the model has only {len(sizes)} parameter "
                          f"tensor(s) to shard; use {name}{sep}{max(1, len(sizes))} or fewer")
    load = [0] * servers
    owned: list[list[int]] = [[] for _ in range(servers)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        k = min(range(servers), key=lambda k: (load[k], len(owned[k]), k))
        load[k] += sizes[i]
        owned[k].append(i)
    return tuple(tuple(sorted(o)) for o in owned)


def shard_bytes(sizes: Sequence[int], shards: Sequence[Sequence[int]]) -> list[int]:
    """Bytes each server holds."""
    return [sum(sizes[i] for i in shard) for shard in shards]
