"""The test suite's defaults for every process it starts (ranks inherit the environment).

The `auto` all-reduce calibrates itself on first use and caches the result per machine
(`comm/collectives/autocal.py`). The suite's tests compare algorithms, bytes and traces
that must not depend on a timing measured while other tests run, so they use its
alpha-beta model unless a test asks for calibration `measure` explicitly
(tests/dist/test_autocal.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("APPROXDIST_ALLREDUCE_CALIBRATION", "off")
