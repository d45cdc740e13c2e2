"""Run outputs: one JSON object per logged step/epoch in metrics.jsonl, and summary.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsWriter:
    """Appends JSON lines; only the main rank writes (others get `enabled=False`)."""

    def __init__(self, run_dir: str | Path, enabled: bool) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


def write_summary(run_dir: str | Path, summary: dict[str, Any]) -> Path:
    path = Path(run_dir) / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
