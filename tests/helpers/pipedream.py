"""Where the PipeDream graph.txt profiles live, for the planner's tests.

PipeDream's published profiles (msr-fiddle/pipedream, MIT licence; see the README beside
them) are kept in `tests/data/pipedream-profiles` so the published
figures are checked on every clean clone. APPROXDIST_PIPEDREAM_PROFILES points at
another copy.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent.parent / "data" / "pipedream-profiles"
PROFILES = Path(os.environ.get("APPROXDIST_PIPEDREAM_PROFILES", str(HERE)))
#: kept for the tests that use it: with the copy in the repository it never skips
needs_profiles = pytest.mark.skipif(not (PROFILES / "alexnet.txt").is_file(),
                                    reason=f"PipeDream profiles not found in {PROFILES}")
