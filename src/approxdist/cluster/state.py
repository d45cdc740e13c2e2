"""The state file of every cluster approxdist made: what `down` must remove, after a crash too.

One JSON file per cluster under `$APPROXDIST_CLUSTER_DIR` (default
`/run/approxdist/clusters`: tmpfs, gone at reboot like the namespaces themselves),
written *before* the first namespace is made, so a cluster whose `up` died half-way is
still found and removed by `down`.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from approxdist.cluster.layout import SUBNETS, ClusterLayout
from approxdist.errors import ClusterError

DIR_ENV = "APPROXDIST_CLUSTER_DIR"
DEFAULT_DIR = Path("/run/approxdist/clusters")
FORMAT = "approxdist-cluster"


def state_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or DEFAULT_DIR)


def _path(name: str) -> Path:
    return state_dir() / f"{name}.json"


def save(layout: ClusterLayout, status: str, shaping: str = "") -> None:
    """Record `layout`; `shaping` says how its links' buckets were set up (for `status`)."""
    state_dir().mkdir(parents=True, exist_ok=True)
    record = {"format": FORMAT, "name": layout.name, "hosts": layout.hosts,
              "subnet": layout.subnet, "link": layout.link, "status": status,
              "shaping": shaping,
              "namespaces": layout.namespaces,
              "written": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    tmp = _path(layout.name).with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(_path(layout.name))


def load(name: str) -> tuple[ClusterLayout, str] | None:
    """The cluster's layout and status ("creating" or "up"), or None if there is none."""
    path = _path(name)
    if not path.is_file():
        return None
    record = _read(path)
    return (ClusterLayout(record["name"], int(record["hosts"]), int(record["subnet"]),
                          str(record.get("link", ""))), str(record.get("status", "")))


def shaping(name: str) -> str:
    """How cluster `name`'s buckets were set up ("" if unshaped, unknown or no cluster)."""
    path = _path(name)
    return str(_read(path).get("shaping", "")) if path.is_file() else ""


def _read(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ClusterError(f"cluster state {path} is unreadable ({exc}); remove its "
                           f"namespaces with `ip netns delete ad-<name>-...` and the file") from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ClusterError(f"{path} is not an approxdist cluster state file; move it out of "
                           f"{state_dir()}")
    return record


def names() -> list[str]:
    folder = state_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def remove(name: str) -> None:
    _path(name).unlink(missing_ok=True)


def free_subnet() -> int:
    """The lowest 198.18.<n>.0/24 no recorded cluster uses."""
    used = set()
    for name in names():
        found = load(name)
        if found is not None:
            used.add(found[0].subnet)
    for subnet in range(SUBNETS):
        if subnet not in used:
            return subnet
    raise ClusterError(f"all {SUBNETS} cluster subnets are in use; remove clusters with "
                       f"`approxdist cluster down --name NAME`")
