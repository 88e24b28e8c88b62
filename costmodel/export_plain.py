"""Plain exports of a T_step table directory: one CSV per grid (plus meta.json), or one tables.json."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from stepcal.core.io import atomic_write_bytes, atomic_write_json
from stepcal.core.readers import read_parquet
from stepcal.costmodel.tables import term_entry

OPS_WHAT = "the per-layer operator times of a T_step table directory"


def write_csv(frame: pd.DataFrame, path: Path) -> Path:
    atomic_write_bytes(path, frame.to_csv(index=False).encode())
    return path


def term_files(table_dir: Path, meta: dict) -> dict[str, tuple[Path, str]]:
    """Each grid's file and what it is (for messages): the terms', and ops.parquet where it was written."""
    files = {name: (table_dir / term_entry(table_dir, meta, name)["file"], f"the grid of T_step term {name!r}")
             for name in meta["terms"]}
    if (table_dir / "ops.parquet").exists():
        files["ops"] = (table_dir / "ops.parquet", OPS_WHAT)
    return files


def export_csv(table_dir: Path, meta: dict, out: Path) -> list[Path]:
    written = [write_csv(read_parquet(path, what), out / f"{name}.csv")
               for name, (path, what) in term_files(table_dir, meta).items()]
    atomic_write_json(out / "meta.json", meta)
    return written + [out / "meta.json"]


def export_json(table_dir: Path, meta: dict, out: Path) -> list[Path]:
    tables = {name: json.loads(read_parquet(path, what).to_json(orient="records"))
              for name, (path, what) in term_files(table_dir, meta).items()}
    atomic_write_json(out / "tables.json", {"meta": meta, "tables": tables})
    return [out / "tables.json"]
