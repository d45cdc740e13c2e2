"""The gradient wire's own state by parameter, kept across codec switches (AdaPrec, docs/adaprec.md).

What a bucket's wire remembers between steps: the error-feedback residual of a codec
(`comm.error_feedback`) and a compressor's state (its residual, PowerSGD's Q, a random
stream; `comm.compressors`). A switch of the wire (`DataParallel.set_codecs`) re-plans the
buckets; the state of a parameter whose new bucket does not use it is *parked*, not
dropped, and comes back when the wire does: top-k's residual survives a phase in fp32.
One dict holds all of it, active and parked alike, so a snapshot (`train/snapshot.py`)
or a checkpoint carries everything, and loading it puts every piece back where the
current buckets use it; an active piece it does not hold starts fresh (a compressor
rebuilt, a residual zero), so restoring a snapshot leaves no trace of what ran since. A
compressor that has not run since it was built holds its first state, which is no state:
it is left out, so a switch to it and back leaves the state as it was:

    {"residuals": {name: tensor}, "compressors": {spec: {name: {key: tensor}}}}

(`spec` as the compressor writes itself: `topk:0.01`, `powersgd:2`). A checkpoint of the
form before parking (`compressors: {name: state}`) loads into the current compressors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from approxdist.comm.compressors import is_compressor
from approxdist.data_parallel.reducer import BucketState

#: per compressor spec, per parameter: that compressor's state
CompressorStates = dict[str, dict[str, dict[str, torch.Tensor]]]


@dataclass
class Parked:
    """State of parameters that no current bucket uses (by reference: never written)."""

    residuals: dict[str, torch.Tensor] = field(default_factory=dict)
    compressors: CompressorStates = field(default_factory=dict)


def collect(buckets: Sequence[BucketState], parked: Parked) -> dict[str, Any]:
    """The whole wire state: the buckets' (copies) and the parked."""
    residuals = dict(parked.residuals)
    comps: CompressorStates = {spec: dict(states) for spec, states in parked.compressors.items()}
    for b in buckets:
        if b.residuals is not None:
            residuals.update(b.residuals.state_dict())
        if b.compressor_used:
            for name, comp in b.named_compressors():
                comps.setdefault(comp.spec, {})[name] = comp.state_dict()
    return {"residuals": residuals, "compressors": comps}


def spread(buckets: Sequence[BucketState], state: Mapping[str, Any]) -> Parked:
    """Load `state` (`collect`'s form) into the buckets; what they do not use, parked."""
    residuals = dict(state.get("residuals", {}))
    comps = _by_spec(buckets, state.get("compressors", {}))
    for b in buckets:
        if b.residuals is not None:
            b.residuals.reset()  # a slice the state does not hold starts from zero
            b.residuals.load_state_dict(residuals)
            for name in b.residuals.names:
                residuals.pop(name, None)
        if b.compressor is not None:
            saved = {name: comps.get(comp.spec, {}).pop(name, None)
                     for name, comp in b.named_compressors()}
            b.fresh_compressor()  # a member the state does not hold starts anew
            for name, comp in b.named_compressors():
                held = saved[name]
                if held is not None:
                    comp.load_state_dict(held)
                    b.compressor_used = True
    return Parked(residuals, {spec: states for spec, states in comps.items() if states})


def _by_spec(buckets: Sequence[BucketState], comps: Mapping[str, Any]) -> CompressorStates:
    """`compressors` by spec (copies of the mappings); the older form by parameter name is
    the state of each parameter's current compressor."""
    if all(is_compressor(key) for key in comps):
        return {spec: dict(states) for spec, states in comps.items()}
    out: CompressorStates = {}
    for b in buckets:
        for name, comp in b.named_compressors():
            if name in comps:
                out.setdefault(comp.spec, {})[name] = comps[name]
    return out
