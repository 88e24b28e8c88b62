"""Per-point results on disk, so an interrupted sweep resumes: OUT/points/<key>.json, written atomically."""
from __future__ import annotations

import json
from pathlib import Path

from stepcal.core.io import atomic_write_json


class PointStore:
    def __init__(self, out_dir: str | Path) -> None:
        self.dir = Path(out_dir) / "points"

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def load(self, key: str) -> dict | None:
        """The stored row, or None when the point has not finished (or its file is unreadable)."""
        path = self.path(key)
        try:
            return json.loads(path.read_text())["row"]
        except (OSError, ValueError, KeyError):
            return None

    def save(self, key: str, row: dict) -> None:
        atomic_write_json(self.path(key), {"key": key, "row": row})
