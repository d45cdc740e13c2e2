"""Where the PipeDream graph.txt profiles live (DESIGN.md `data/pipedream-profiles`), for the planner's tests.

They are the project's shared data, not part of the package; point
APPROXDIST_PIPEDREAM_PROFILES at another copy, or the tests that need them skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROFILES = Path(os.environ.get("APPROXDIST_PIPEDREAM_PROFILES", "/work/shared/data/pipedream-profiles"))
needs_profiles = pytest.mark.skipif(not (PROFILES / "alexnet.txt").is_file(),
                                    reason=f"PipeDream profiles not found in {PROFILES}")
