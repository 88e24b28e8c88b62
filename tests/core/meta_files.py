"""A meta.json written by hand, as an older or newer stepcal (or a person) might have left it."""
import json
from pathlib import Path


def write_meta_json(directory: Path, meta: dict, name: str = "meta.json") -> Path:
    """Write `meta` as DIR/<name>; returns DIR, ready for a reader."""
    (directory / name).write_text(json.dumps(meta))
    return directory
