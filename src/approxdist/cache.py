"""Where approxdist keeps what it computes once per machine: `$APPROXDIST_CACHE_DIR`, else
`$XDG_CACHE_HOME/approxdist`, else `~/.cache/approxdist` (calibrations, kernels, data)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache's root folder (not created here)."""
    explicit = os.environ.get("APPROXDIST_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "approxdist"
