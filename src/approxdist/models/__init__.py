"""Models as ordered sequences of blocks (so a pipeline can cut them at any block boundary)."""

from approxdist.models.registry import MODELS, build_model

__all__ = ["MODELS", "build_model"]
