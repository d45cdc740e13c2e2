"""A zero-bubble stage's split backward priced from the profile: `I` and `W` (cost.pipeline)."""

from __future__ import annotations

from approxdist.pipeline.block_profile import BlockProfile


def split_backward_s(blocks: tuple[BlockProfile, ...], first: bool, compute_scale: float,
                     action_s: float, acc_s: float, decode_s: float) -> dict[str, float]:
    """`StageTimes`' `backward_input` and `backward_weight` of a stage of `blocks` (see the
    module docstring; `acc_s`: what accumulating adds, `decode_s`: decoding the gradient
    received); {} where the profile did not measure the halves."""
    if first:  # I decodes (its inputs are data: no input gradient), W is the whole backward
        whole = compute_scale * (sum(b.bwd_s for b in blocks) + action_s) + acc_s
        return {"backward_input": compute_scale * action_s + decode_s, "backward_weight": whole}
    if not all(b.split_known for b in blocks):
        return {}
    i = sum(b.input_s or 0.0 for b in blocks)
    w = sum(b.weight_s or 0.0 for b in blocks)
    return {"backward_input": compute_scale * (i + action_s) + decode_s,
            "backward_weight": compute_scale * (w + action_s) + acc_s}
