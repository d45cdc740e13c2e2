"""`approxdist` whose run directory fails after its first checkpoint (a test fixture).

    python tests/helpers/disk_fault.py full|readonly[:FOLDER] ARGS...   # as `approxdist ARGS...`

Once a checkpoint folder (only the one named FOLDER, e.g. `stage1`, when given) has its
first checkpoint, its next one fails as on a full disk (`full`: the pending file is a
link to /dev/full, whose writes the kernel answers with ENOSPC, for root too) or because
the folder became read-only (`readonly`: mode 0555, which root ignores). The fault is
installed when this file is imported, and the local launcher's workers (spawned) import
it again as their main module, so it holds on every rank as well as in-process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import approxdist.train.resume as resume
from approxdist.cli.main import main
from approxdist.train.checkpoint import TMP_NAME

_commit = resume.commit


def _fail_after_first(kind: str, folder: str) -> None:
    def commit(run_dir: str | Path) -> Path:
        path = _commit(run_dir)
        if folder and Path(run_dir).name != folder:
            return path
        if kind == "full":
            os.symlink("/dev/full", Path(run_dir) / TMP_NAME)
        else:
            os.chmod(run_dir, 0o555)
        resume.commit = _commit  # once
        return path

    resume.commit = commit


_KIND, _, _FOLDER = sys.argv[1].partition(":") if len(sys.argv) > 1 else ("", "", "")
if _KIND in ("full", "readonly"):
    _fail_after_first(_KIND, _FOLDER)
    if __name__ == "__main__":
        sys.exit(main(sys.argv[2:]))
