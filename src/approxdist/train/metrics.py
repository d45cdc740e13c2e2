"""Run outputs: summary.json, and reading metrics.jsonl (written by `train/sink.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_summary(run_dir: str | Path, summary: dict[str, Any]) -> Path:
    path = Path(run_dir) / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
