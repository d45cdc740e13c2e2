"""Plot helpers for experiment reports: matplotlib with the Agg backend, one PNG per figure.

Every figure gets labelled axes with units, a legend and a title naming the
experiment and its settings (STYLE: plots a reader can use without the report).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on these machines

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402


def figure(ncols: int = 1, width: float = 6.0, height: float = 4.2) -> tuple[Figure, list[Axes]]:
    """A figure with `ncols` side-by-side axes."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def save(fig: Figure, path: Path, title: str) -> Path:
    """Title the figure, save it as PNG (dpi 110) and close it."""
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def band(ax: Axes, x: Sequence[float], mean: Sequence[float], lo: Sequence[float],
         hi: Sequence[float], label: str, **style: Any) -> None:
    """A mean line with a shaded [lo, hi] band (the spread over seeds)."""
    (line,) = ax.plot(x, mean, label=label, **style)
    if any(a != b for a, b in zip(lo, hi)):
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.18, linewidth=0)


def label(ax: Axes, xlabel: str, ylabel: str, title: str = "", legend: bool = True) -> None:
    """Axis labels (with units), an optional panel title and the legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def finite(values: Sequence[float], fill: float = 0.0) -> list[float]:
    """`values` with NaN/Inf replaced by `fill` (a run that diverged plots at chance)."""
    return [v if math.isfinite(v) else fill for v in values]


def plain_log(ax: Axes, axis: str = "y") -> None:
    """Log scale with plain numbers (1, 10, 100) instead of powers of ten."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    plain = FuncFormatter(lambda value, _pos: f"{value:g}")
    target.set_major_formatter(plain)
    target.set_minor_formatter(plain)


def note(ax: Axes, text: str) -> None:
    """A small grey note in the lower-left corner of a panel."""
    ax.text(0.01, 0.01, text, transform=ax.transAxes, fontsize=7, color="0.35",
            va="bottom", ha="left")
