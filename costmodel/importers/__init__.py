"""Importers: every supported profile format -> the record frame (costmodel.records).

`load_profiles(paths, fmt)` reads files (or an AIConfigurator system directory) and detects
the format from the columns unless `fmt` names it.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.readers import check_text, one_line, read_parquet
from stepcal.costmodel.importers import aiconfigurator, llmservingsim, native, splitwise, vidur

FORMATS = ("auto", "profile", "steplog", "vidur", "aiconfigurator", "splitwise", "llmservingsim")
_IMPORTERS = {
    "profile": native.import_profile,
    "steplog": native.import_step_log,
    "vidur": vidur.import_table,
    "aiconfigurator": aiconfigurator.import_table,
    "splitwise": splitwise.import_perf_model,
}


def load_profiles(paths, fmt: str = "auto", spec=None, tp: int | None = None) -> pd.DataFrame:
    """All records of all paths, concatenated; `row` is the row number within its own file. An
    LLMServingSim bundle (a directory) is shaped by the ModelSpec `spec` and read at degree `tp`."""
    if fmt not in FORMATS:
        raise InputError(f"--format: unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if fmt == "llmservingsim":
        if not paths:
            raise InputError("--profile: no input files")
        return pd.concat([llmservingsim.import_bundle(Path(p), spec, tp) for p in paths], ignore_index=True)
    frames = []
    for path in _expand(paths):
        frames.append(load_file(path, fmt))
    if not frames:
        raise InputError("--profile: no input files")
    return pd.concat(frames, ignore_index=True)


def load_file(path: Path, fmt: str = "auto") -> pd.DataFrame:
    frame = read_table(path)
    kind = detect_format(frame.columns, path) if fmt == "auto" else fmt
    records = _IMPORTERS[kind](frame, str(path))
    if records.empty:
        raise InputError(f"{path}: no usable rows (every point failed or the file is empty)")
    return records


def detect_format(columns, path) -> str:
    cols = set(columns)
    if any(c.startswith("time_stats.") for c in cols) and ("num_tokens" in cols or "num_workers" in cols):
        return "vidur"
    if aiconfigurator.is_aiconfigurator_table(cols):
        return "aiconfigurator"
    if {"prompt_time", "token_time"} <= cols:
        return "splitwise"
    if {"op", "time_ms"} <= cols:
        return "profile"
    if "duration_ms" in cols:
        return "steplog"
    raise InputError(f"{path}: cannot tell the format from its columns "
                     f"({', '.join(sorted(cols)[:8])}...); pass --format")


def read_table(path: Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    what = "a profile table: Parquet, CSV, JSON or JSONL"
    if path.suffix == ".parquet":
        return read_parquet(path, what)
    try:
        with path.open("rb") as f:    # a binary file is named as such, not as a parse error at some line
            check_text(path, f.read(1 << 16), what)
        if path.suffix in (".json", ".jsonl"):
            return pd.read_json(path, lines=path.suffix == ".jsonl")
        return pd.read_csv(path)
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise InputError(f"{path}: cannot read as a table: {one_line(exc)}") from None


def profile_table(path: str | Path) -> Path | None:
    """The profile table of a directory `stepcal profile --out` wrote; None for a file, or a directory
    without one."""
    table = Path(path) / "profile.parquet"
    return table if Path(path).is_dir() and table.exists() else None


def _expand(paths) -> list[Path]:
    """Files as given; a directory stands for its profile.parquet or its AIConfigurator tables."""
    out = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            table = profile_table(path)
            found = [table] if table else aiconfigurator.table_files(path)
            if not found:
                raise InputError(f"{path}: directory holds neither profile.parquet nor AIConfigurator "
                                 f"tables ({', '.join(aiconfigurator.TABLES)}); an LLMServingSim bundle needs "
                                 f"--format llmservingsim")
            out.extend(found)
        else:
            out.append(path)
    return out
