"""The engines' own CPU work around the profiled compute, and its fit to held-out runs of a tiny model.

A profile times each block's forward and backward alone; a training step also runs the
engines: the pipeline executor's per-action work (walking the schedule, setting up
autograd for a received activation, posting and completing its transfer through the
link layer, the loss of the last stage) and each engine's per-step work (zero_grad,
the flush, the optimizer's wrapper, the data-parallel hooks and bucket copies). On this
2-core machine these are not small: a 2-stage pipeline of a 3-block MLP of width 16
(0.2 ms of forward + backward for the whole model) takes about 0.6 ms per micro-batch.
`RuntimeOverhead` holds seven numbers, all CPU seconds on one rank:

- `action_s`: one forward or one backward of one micro-batch on one pipeline stage
  (charged to every such action of a pipeline or hybrid schedule);
- `pipeline_step_s`: one step of a pipeline or hybrid rank beyond its actions (once per
  step);
- `dp_step_s`: one step of a data-parallel rank beyond its forward, backward,
  all-reduces and optimizer (once per step);
- `dp_byte_s`: per gradient byte a data-parallel rank all-reduces, the engine's own
  passes over it (copying into and out of its buckets, averaging), charged with each
  bucket's all-reduce and with a replicated stage's;
- `shared_action_s`: what each forward or backward of a pipeline or hybrid rank adds
  where more ranks than cores share a machine: the switching between them (each action
  waits for a message, sleeps and is woken on a core another rank's work just left,
  its data cold), CPU work shared like the rest;
- `loss_value_s`: per value of the model's output, what the loss, its hit count and its
  backward add to each micro-batch where the loss is computed (a pipeline's last stage,
  every data-parallel replica): a profile times the blocks from a gradient of ones, not
  the loss (`planner.profiler.loss_s_per_value` measures it directly, not fitted; its
  fixed part, tens of microseconds, stays in `action_s` and `dp_step_s`);
- `tp_collective_s`: per collective a tensor-parallel rank runs (each tp all-reduce of a
  split layer, forward or backward), the tensor engine's own work around the link time:
  the autograd region, `TPComm`, the wire's codec path, the link layer's call and the
  hand-off that blocks both shards until both arrive (`cost.tensor.tp_time` charges it to
  every site; the engine's fixed work per step stays `dp_step_s`, as `tp_time` charges
  it).

They are measured, not fitted to the configurations a model is judged on: `fit_linear`
takes step times of a *tiny* pipeline (any model whose compute is small next to its
overhead) at several micro-batch counts and schedules, each with the cost model's
prediction at zero overhead (`base_s`) and its growth per second of `action_s`
(`slope`, from the simulation: how many actions lie on the step's critical path), and
solves `measured = base + slope x action_s + pipeline_step_s` by non-negative least
squares on the relative error; the same fit of a tiny and a wide data-parallel step
(slope: the growth per second of `dp_byte_s`, about the gradient bytes) gives
`dp_byte_s` and `dp_step_s`. `fit_one` solves for one unknown with the rest known
(`shared_action_s`, `tp_collective_s`), `refine` takes its secant slopes again at the value
found until it settles.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from approxdist.errors import ConfigError, DataError
from approxdist.planner.cost.nnls import nonnegative_lstsq


@dataclass(frozen=True)
class RuntimeOverhead:
    """Seconds of engine CPU work per action and per step (see the module docstring)."""

    action_s: float = 0.0
    pipeline_step_s: float = 0.0
    dp_step_s: float = 0.0
    dp_byte_s: float = 0.0
    shared_action_s: float = 0.0
    loss_value_s: float = 0.0
    tp_collective_s: float = 0.0

    def __post_init__(self) -> None:
        for key in FIELDS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ConfigError(f"engine overhead {key} = {value!r} must be a finite number "
                                  f"of seconds >= 0")

    def to_json(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in FIELDS}

    def loss_s(self, out_bytes: int) -> float:
        """Seconds the loss adds to one micro-batch whose output (fp32) is `out_bytes`."""
        return self.loss_value_s * out_bytes / 4


#: the names of its seven numbers, the keys of its JSON form
FIELDS = tuple(f.name for f in fields(RuntimeOverhead))
NONE = RuntimeOverhead()


@dataclass(frozen=True)
class OverheadRow:
    """One timed configuration of a tiny model: what was measured, what the cost model
    predicts at zero overhead, and how many seconds the prediction grows per second of
    the per-unit overhead being fitted (`action_s`, `dp_byte_s`, `shared_action_s` or
    `tp_collective_s`)."""

    key: str
    measured_s: float
    base_s: float
    slope: float = 0.0

    def __post_init__(self) -> None:
        for name in ("measured_s", "base_s", "slope"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise DataError(f"overhead row {self.key!r} {name} = {value!r} must be a finite "
                                f"number >= 0")
        if self.measured_s <= 0:
            raise DataError(f"overhead row {self.key!r} measured_s = {self.measured_s!r} must "
                            f"be > 0")


def fit_linear(rows: Sequence[OverheadRow]) -> tuple[float, float, float]:
    """(per-unit seconds, fixed seconds, rms relative error) solving measured = base +
    slope x per-unit + fixed over `rows` (>= 2 distinct slopes), both >= 0, by least
    squares on the relative error."""
    if len({round(r.slope, 12) for r in rows}) < 2:
        raise DataError(f"{len(rows)} overhead row(s) with slopes "
                        f"{sorted({r.slope for r in rows})}: the fit needs >= 2 rows whose "
                        f"predictions grow differently with the overhead (time several "
                        f"micro-batch counts, e.g. 2 and 32, or two model widths)")
    t = np.array([r.measured_s for r in rows])
    x = np.array([[r.slope, 1.0] for r in rows]) / t[:, None]
    y = np.array([(r.measured_s - r.base_s) / r.measured_s for r in rows])
    found = nonnegative_lstsq(x, y)
    coef = found if found is not None else np.zeros(2)
    errors = (x @ coef - y)
    return float(coef[0]), float(coef[1]), float(math.sqrt(float(np.mean(errors ** 2))))


def fit_one(rows: Sequence[OverheadRow]) -> tuple[float, float]:
    """(per-unit seconds >= 0, rms relative error) solving measured = base + slope x
    per-unit over `rows` by least squares on the relative error (the fixed part is in
    `base`); 0 where no row grows with it."""
    if not rows:
        raise DataError("no overhead row to fit: time the runs of the term before fitting it")
    x = np.array([r.slope / r.measured_s for r in rows])
    y = np.array([(r.measured_s - r.base_s) / r.measured_s for r in rows])
    found = max(0.0, float(x @ y / (x @ x))) if float(x @ x) > 0 else 0.0
    return found, float(math.sqrt(float(np.mean((x * found - y) ** 2))))


def refine(rows_at: Callable[[float], list[OverheadRow]], probe: float, rounds: int
           ) -> tuple[float, float, list[OverheadRow]]:
    """(`fit_one`'s value, its rms, the rows of the last round): the rows' slopes are
    secants between 0 and `probe`, taken again at the value found (`rounds` times at
    most, until it settles): a simulated step is piecewise linear in an overhead."""
    found, rms, rows = 0.0, 0.0, []
    for _ in range(1 + rounds):
        rows = rows_at(probe)
        found, rms = fit_one(rows)
        if found <= 0 or math.isclose(found, probe, rel_tol=1e-6):
            break
        probe = found
    return found, rms, rows
