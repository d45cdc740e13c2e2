"""Rank-aware console output: only the main rank prints, and never through a progress bar."""

from __future__ import annotations

import sys

from tqdm import tqdm

from approxdist.launch.context import DistContext


def info(ctx: DistContext, message: str) -> None:
    if ctx.is_main:
        tqdm.write(message, file=sys.stdout)


def notice(ctx: DistContext, message: str | None) -> None:
    """One line before the run starts (a note or a warning about the settings), from the
    main rank, to stderr; nothing for None."""
    if message and ctx.is_main:
        tqdm.write(f"approxdist: {message}", file=sys.stderr)


def warn(ctx: DistContext, message: str) -> None:
    """Warnings come from any rank, prefixed with it."""
    tqdm.write(f"[rank {ctx.rank}] warning: {message}", file=sys.stderr)


def progress(ctx: DistContext, total: int, desc: str, enabled: bool) -> tqdm:
    show = enabled and ctx.is_main and sys.stderr.isatty()
    return tqdm(total=total, desc=desc, leave=False, disable=not show, mininterval=0.5,
                dynamic_ncols=True, file=sys.stderr)
