"""Each parameter its own codec under one error budget (L-GreCo, Markov et al., MLSys 2024).

Seed 004's benchmark rule sends fully-connected gradients in Table-1, convolutions in fp8
and biases in float, by hand. L-GreCo chooses per layer by dynamic programming: the
fewest bits on the wire such that the layers' compression errors together stay within a
budget. Here the errors are AdaPrec's measurements (`comm.update_error`): for each
candidate and parameter, ||E||^2 and ||G||^2 of its speculation. A parameter's error in
candidate c is its relative error r_c^2 = ||E_c||^2 / ||G_c||^2 times ||G||^2 (the mean of
the candidates' ||G||^2: they saw the same batches from the same state); the assignment
keeps sum_i r_i^2 ||G_i||^2 <= budget^2 sum_i ||G_i||^2, the whole update's relative error
at most `budget`, with each parameter's cost its size times the codec's bits per value.
A codec over the budget on a parameter by itself is no option there, and the exact codec
always is (no error, 32 bits), so a solution always exists.
Errors are rounded *up* to `levels` steps of the budget: the chosen mix never exceeds it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: per parameter: (||E||^2, ||G||^2, size), one candidate's measurement
Sums = Mapping[str, tuple[float, float, int]]
#: a candidate that names one codec per parameter: `mix:NAME=CODEC,NAME=CODEC,...`
MIX = "mix:"


def assign(errors: Mapping[str, Sums], bits: Mapping[str, float], budget: float,
           exact: str = "fp32", levels: int = 200) -> dict[str, str]:
    """The cheapest codec per parameter (candidate -> its measured `errors`, `bits` per
    value) whose errors together stay within `budget`; parameters in measurement order."""
    names = list(dict.fromkeys(n for sums in errors.values() for n in sums))
    size = {n: next(s[n][2] for s in errors.values() if n in s) for n in names}
    norm = {n: _mean([s[n][1] for s in errors.values() if n in s]) for n in names}
    cap = budget ** 2 * sum(norm.values())
    # weight (budget steps used) -> (bits, codecs chosen so far)
    best: dict[int, tuple[float, tuple[str, ...]]] = {0: (0.0, ())}
    for n in names:
        options = [(exact, 0, 32.0 * size[n])]
        for cand, sums in errors.items():
            if cand == exact or n not in sums or not option(sums[n], budget):
                continue  # over the budget on this parameter alone: never where it damages
            err = sums[n][0] / sums[n][1] * norm[n]
            w = 0 if err == 0 else math.ceil(err / cap * levels) if cap > 0 else levels + 1
            if w <= levels:
                options.append((cand, w, bits[cand] * size[n]))
        nxt: dict[int, tuple[float, tuple[str, ...]]] = {}
        for used, (cost, picks) in best.items():
            for cand, w, c in options:
                at = used + w
                if at <= levels and (at not in nxt or cost + c < nxt[at][0]):
                    nxt[at] = (cost + c, (*picks, cand))
        best = nxt
    cost, picks = min(best.values(), key=lambda v: v[0])
    return dict(zip(names, picks))


def option(sums: tuple[float, float, int], budget: float) -> bool:
    """Whether a codec measured `sums` (||E||^2, ||G||^2, size) on a parameter may send it:
    a gradient there, and the codec's error on it alone within `budget`."""
    return sums[1] > 0 and sums[0] <= budget ** 2 * sums[1]


def mix_spec(choice: Mapping[str, str]) -> str:
    """One codec when every parameter has the same, else `mix:NAME=CODEC,...`."""
    codecs = set(choice.values())
    if len(codecs) == 1:
        return codecs.pop()
    return MIX + ",".join(f"{n}={c}" for n, c in choice.items())


def mix_rules(candidate: str) -> tuple[str, ...]:
    """The codec rules of a `mix:` candidate (exact names: globs that match themselves)."""
    return tuple(item for item in candidate[len(MIX):].split(",") if item)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
