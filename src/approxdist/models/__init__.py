"""Models as ordered sequences of blocks (so a pipeline can cut them at any block boundary),
each family with its own tensor-parallel plan where it has one (`tp_plan_of`; with sequence
parallelism `sequence_plan_of`)."""

from approxdist.models.registry import MODELS, build_model, sequence_plan_of, tp_plan_of

__all__ = ["MODELS", "build_model", "sequence_plan_of", "tp_plan_of"]
