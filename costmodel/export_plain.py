"""Plain exports of a T_step table directory: one CSV per grid (plus meta.json), or one tables.json."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from stepcal.core.io import atomic_write_bytes, atomic_write_json
from stepcal.core.readers import read_parquet
from stepcal.costmodel.table_meta import TableMeta

OPS_WHAT = "the per-layer operator times of a T_step table directory"


def write_csv(frame: pd.DataFrame, path: Path) -> Path:
    atomic_write_bytes(path, frame.to_csv(index=False).encode())
    return path


def term_files(table_dir: Path, meta: TableMeta) -> dict[str, tuple[Path, str]]:
    """Each grid's file and what it is (for messages): the terms', and ops.parquet where it was written."""
    files = {name: (table_dir / meta.term_entry(table_dir, name)["file"], f"the grid of T_step term {name!r}")
             for name in meta.terms}
    if (table_dir / "ops.parquet").exists():
        files["ops"] = (table_dir / "ops.parquet", OPS_WHAT)
    return files


def export_csv(table_dir: Path, meta: TableMeta, out: Path) -> list[Path]:
    written = [write_csv(read_parquet(path, what), out / f"{name}.csv")
               for name, (path, what) in term_files(table_dir, meta).items()]
    atomic_write_json(out / "meta.json", meta.to_dict())   # a copy of the tables' meta.json
    return written + [out / "meta.json"]


def export_json(table_dir: Path, meta: TableMeta, out: Path) -> list[Path]:
    tables = {name: json.loads(read_parquet(path, what).to_json(orient="records"))
              for name, (path, what) in term_files(table_dir, meta).items()}
    atomic_write_json(out / "tables.json", {"meta": meta.to_dict(), "tables": tables})
    return [out / "tables.json"]
