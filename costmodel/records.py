"""The record frame: every importer turns its format into these columns, one row per timed point.

One table for all sources keeps the rest of the cost model format-blind: features, targets,
splits and tables read only these columns. Absent values are NaN (numeric) or None (text).
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from simulator.batch import FEATURE_NAMES
from simulator.errors import InputError

# op: gemm, attn_prefill, attn_decode, step, overhead, elementwise (Vidur's small per-layer ops),
# or an imported op name. name: the sub-operation (qkv_proj, input_layernorm, ...).
SHAPE_COLUMNS = ("m", "n", "k") + FEATURE_NAMES + ("num_heads", "num_kv_heads", "head_dim",
                                                   "width", "tp")
TEXT_COLUMNS = ("source", "file", "op", "name", "dtype", "device")
TIME_COLUMNS = ("time_ms", "time_ms_p10", "time_ms_p90")
RECORD_COLUMNS = TEXT_COLUMNS + ("row",) + SHAPE_COLUMNS + TIME_COLUMNS

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                 "float": "float32", "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8"}


def normalise_dtype(value) -> str | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    text = str(value).strip().lower().replace("torch.", "")
    return DTYPE_ALIASES.get(text, text)


def make_records(columns: dict, *, source: str, file: str) -> pd.DataFrame:
    """A record frame from a dict of columns; missing columns are filled as absent."""
    n = len(next(iter(columns.values())))
    frame = pd.DataFrame(index=range(n))
    for col in RECORD_COLUMNS:
        if col in columns:
            frame[col] = columns[col]
        elif col in TEXT_COLUMNS:
            frame[col] = None
        else:
            frame[col] = np.nan
    frame["source"] = source
    frame["file"] = file
    for col in SHAPE_COLUMNS + TIME_COLUMNS:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(np.float64)
    frame["row"] = frame["row"].astype(np.int64)
    frame["dtype"] = [normalise_dtype(v) for v in frame["dtype"]]
    return frame


def check_times(frame: pd.DataFrame, column: str, *, path: str, rows=None) -> None:
    """Times must be finite and positive: a file that breaks this fails naming file, row, column."""
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values <= 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        row = int(rows[i]) if rows is not None else i
        raise InputError(f"{path}: row {row}: column {column!r} must be a finite positive time in ms, "
                         f"got {frame[column].iloc[i]!r}")


def require_columns(frame: pd.DataFrame, columns, *, path: str, what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: not a {what} file: missing column(s) {', '.join(missing)}")


def check_positive(frame: pd.DataFrame, columns, *, path: str) -> None:
    """Shape columns must be positive numbers (a zero or NaN size is a broken row)."""
    for col in columns:
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(values) | (values <= 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{path}: row {i}: column {col!r} must be a positive number, "
                             f"got {frame[col].iloc[i]!r}")


def data_hash(frame: pd.DataFrame) -> str:
    """A content hash of the rows that train a model (order-independent of files' paths)."""
    cols = [c for c in RECORD_COLUMNS if c not in ("file", "row")]
    body = pd.util.hash_pandas_object(frame[cols].reset_index(drop=True), index=False)
    return hashlib.sha256(np.sort(body.to_numpy()).tobytes()).hexdigest()[:16]
