"""The record frame: every importer turns its format into these columns, one row per timed point.

One table for all sources keeps the rest of the cost model format-blind: features, targets,
splits and tables read only these columns. Absent values are NaN (numeric) or None (text).
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from stepcal.core.batch import FEATURE_NAMES
from stepcal.core.errors import InputError, shown

# op: gemm, attn_prefill, attn_decode, step, overhead, elementwise (Vidur's small per-layer ops),
# moe, mla_prefill, mla_decode, or an imported op name. name: the sub-operation (qkv_proj,
# input_layernorm, ...; for moe the routing distribution).
# A mixture-of-experts layer's shape: experts, experts each token is routed to (top-k), one
# expert's full FFN width (before any tensor-parallel split) and the expert-parallel degree;
# its tokens, hidden width and tensor-parallel degree reuse num_tokens, width and tp.
MOE_COLUMNS = ("num_experts", "experts_per_token", "expert_ffn_size", "ep")
SHAPE_COLUMNS = ("m", "n", "k") + FEATURE_NAMES + ("num_heads", "num_kv_heads", "head_dim",
                                                   "width", "tp") + MOE_COLUMNS
TEXT_COLUMNS = ("source", "file", "op", "name", "dtype", "device")
TIME_COLUMNS = ("time_ms", "time_ms_p10", "time_ms_p90")
RECORD_COLUMNS = TEXT_COLUMNS + ("row",) + SHAPE_COLUMNS + TIME_COLUMNS

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                 "float": "float32", "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8",
                 # Weight-only int4 (AIConfigurator's int4_wo, vLLM's Marlin w4a16): what the
                 # weights take in memory is what sets a kernel's bytes; activations stay 16-bit.
                 "int4_wo": "int4", "w4a16": "int4"}


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
                         f"got {shown(frame[column].iloc[i])}")


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
                             f"got {shown(frame[col].iloc[i])}")


def check_text(frame: pd.DataFrame, column: str, *, path: str) -> None:
    """A label column (e.g. a routing distribution) must hold a non-empty string in every row."""
    for i, value in enumerate(frame[column]):
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"{path}: row {i}: column {column!r} must be a non-empty label, "
                             f"got {shown(value)}")


def data_hash(frame: pd.DataFrame) -> str:
    """A content hash of the rows that train a model (order-independent of files' paths).

    The MoE shape columns count only where some row has them: records without any hash as they
    did before those columns existed, so tables fitted then keep their training data hash."""
    cols = [c for c in RECORD_COLUMNS if c not in ("file", "row")
            and not (c in MOE_COLUMNS and (c not in frame.columns or frame[c].isna().all()))]
    body = pd.util.hash_pandas_object(frame[cols].reset_index(drop=True), index=False)
    return hashlib.sha256(np.sort(body.to_numpy()).tobytes()).hexdigest()[:16]
