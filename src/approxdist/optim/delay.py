"""The delay rule: SGD's momentum lowered by the implicit momentum a gradient delay adds.

A gradient applied d optimiser steps after the weights it was computed on (2BW: d = 1 on
every stage; PipeDream: d = P - s - 1 on stage s; an asynchronous or SSP parameter server
with W workers: d = W - 1 on average) acts like extra momentum: asynchrony begets momentum,
about 1 - 1/(d + 1) = d / (d + 1) of it (Mitliagkas et al. 2016, "Asynchrony begets
momentum, with an application to deep learning"). Added to a synchronous run's momentum b
it leaves the heavy ball with far less stable room: on a quadratic of curvature h,
x(t+1) = x(t) + b (x(t) - x(t-1)) - lr h x(t-d) is stable for lr h < 2 (1 + b) when d = 0
but only for lr h < 1 - b when d = 1 (`stable_rate`; docs/pipeline.md derives both). The
rule (`rule_momentum`, "auto") runs the optimiser of a delayed gradient with momentum
max(0, b - d / (d + 1)) and the learning rate unchanged; "off" keeps b. `delay_line` is
the one line a run prints before it starts: what the rule changed, or, with the rule off,
how little stable room the user's momentum leaves. docs/pipeline.md ("The delay rule") has the
measurements that chose this rule over the others tried.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from approxdist.errors import ConfigError

#: `optim.delay_rule` values: lower momentum by the delay's implicit momentum, or not
DELAY_RULES = ("auto", "off")


def check_rule(rule: str, name: str = "optim.delay_rule") -> str:
    """`rule` if it is one of `DELAY_RULES`; a `ConfigError` naming them otherwise."""
    if rule not in DELAY_RULES:
        shown = f"{name} = {rule!r}" if "." in name else f"{name}={rule!r}"
        raise ConfigError(f"{shown} is not one of: {', '.join(DELAY_RULES)} "
                          f"(auto lowers momentum by a gradient delay's implicit momentum)")
    return rule


def implicit_momentum(delay: int) -> float:
    """The momentum a gradient delay of `delay` optimiser steps adds: d / (d + 1)."""
    return delay / (delay + 1)


def rule_momentum(momentum: float, delay: int, rule: str = "auto") -> float:
    """The momentum the optimiser of gradients `delay` steps late runs with under `rule`:
    max(0, b - d / (d + 1)) with "auto", `momentum` itself with "off" or no delay."""
    if check_rule(rule) == "off" or delay <= 0:
        return momentum
    return max(0.0, momentum - implicit_momentum(delay))


def _stable(rate: float, momentum: float, delay: int) -> bool:
    """Whether every root of the delayed heavy ball's characteristic polynomial
    z^(d+1) - (1 + b) z^d + b z^(d-1) + a (d >= 1; for d = 0, z^2 - (1 + b - a) z + b)
    lies inside the unit circle, a = lr h."""
    coeffs = np.zeros(max(delay, 1) + 2)
    coeffs[0], coeffs[1], coeffs[2] = 1.0, -(1.0 + momentum), momentum
    coeffs[delay + 1] += rate
    return bool(np.max(np.abs(np.roots(coeffs))) < 1.0)


def stable_rate(momentum: float, delay: int) -> float:
    """The largest lr x curvature for which SGD with `momentum` on a quadratic, its gradient
    `delay` steps late, converges: 2 (1 + b) without a delay, 1 - b with one step,
    2 sin(pi / (2 (2d + 1))) without momentum (found by bisection, to 1e-9)."""
    if delay <= 0:
        return 2.0 * (1.0 + momentum)
    lo, hi = 0.0, 2.0 * (1.0 + momentum)  # a delay never widens the synchronous range
    while hi - lo > 1e-9:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _stable(mid, momentum, delay) else (lo, mid)
    return lo


def apply_delay_rule(optimizer: torch.optim.Optimizer, delay: int, rule: str = "auto") -> None:
    """Set each parameter group's momentum (groups without one are left alone) to what
    `rule` gives for gradients `delay` steps late; Nesterov is dropped where it falls to 0."""
    for group in optimizer.param_groups:
        if "momentum" in group:
            group["momentum"] = rule_momentum(float(group["momentum"]), delay, rule)
            if group["momentum"] == 0.0 and group.get("nesterov"):
                group["nesterov"] = False


def _listing(values: Sequence[float]) -> str:
    """`0.4` for equal values, `0.15, 0.233, 0.4, 0.9` for one per optimiser."""
    return f"{values[0]:.3g}" if len(set(values)) == 1 else ", ".join(f"{v:.3g}" for v in values)


def delay_line(momentum: float, delays: Sequence[int], rule: str, where: str) -> str | None:
    """One line for a run whose optimisers (one per stage or server, `where`: "on stages
    0-3 (pipedream)") apply gradients `delays` steps late: with "auto", the momentum the
    rule gives each; with "off", the stable room `momentum` leaves and the fix, when the
    rule would lower it. None when there is no delay or no momentum to lower."""
    worst = max(delays, default=0)
    if worst == 0 or momentum == 0.0:
        return None
    late = f"{_listing(delays)} step{'s' if len(set(delays)) > 1 or worst > 1 else ''} late"
    if check_rule(rule) == "auto":
        lowered = [rule_momentum(momentum, d) for d in delays]
        return (f"note: gradients arrive {late} {where}, which adds momentum d/(d+1) "
                f"(Mitliagkas et al. 2016), so the delay rule runs momentum {momentum:.3g} as "
                f"{_listing(lowered)} (--set optim.delay_rule=off keeps {momentum:.3g})")
    ruled = rule_momentum(momentum, worst)
    return (f"warning: momentum {momentum:.3g} with gradients {late} {where} is stable only "
            f"for lr x curvature < {stable_rate(momentum, worst):.2g} (at the delay rule's "
            f"momentum {ruled:.3g}: {stable_rate(ruled, worst):.2g}; without a delay: "
            f"{stable_rate(momentum, 0):.2g}), so expect lost accuracy or divergence; "
            f"--set optim.delay_rule=auto (the default) lowers it")
