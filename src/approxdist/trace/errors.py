"""The error of the trace layer: a missing or malformed trace, an impossible analysis."""

from __future__ import annotations

from approxdist.errors import ApproxDistError


class TraceError(ApproxDistError):
    """A trace file is missing or malformed, or a run directory cannot be analysed."""
