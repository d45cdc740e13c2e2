"""Adaptive communication precision (seed 004): the learning-curve model AdaPrec decides with."""

from approxdist.adaptive.learning_curve import CurveConfig, LearningCurveModel, Prediction

__all__ = ["CurveConfig", "LearningCurveModel", "Prediction"]
