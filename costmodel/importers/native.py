"""Our own files: the profiler's profile table and the engine's / simulator's step logs."""
from __future__ import annotations

import numpy as np
import pandas as pd

from stepcal.core.batch import FEATURE_NAMES, batch_row
from stepcal.core.errors import InputError, shown
from stepcal.costmodel.records import check_positive, check_times, make_records, require_columns

STEP_LIKE_OPS = ("attn_prefill", "attn_decode", "step", "overhead")
# A moe row's expert shape: record column -> the ModelSpec field it comes from.
MOE_SPEC_FIELDS = ("width", "expert_ffn_size", "num_experts", "experts_per_token")
MOE_ONE_DEVICE = ("tp", "ep")        # the profiler times a whole MoE layer on one device


def import_profile(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    """A profile table (core.schemas.PROFILE_COLUMNS); failed points are skipped."""
    require_columns(frame, ("op", "time_ms"), path=path, what="stepcal profile")
    frame = frame.reset_index(drop=True)
    ok = _ok_rows(frame, path)
    # A served workload's own row (op serve) only says that it ran: its steps are the step and host
    # rows named "served" (profiler.serve).
    frame = frame[ok & (frame["op"] != "serve").to_numpy()]
    rows = frame.index.to_numpy()
    frame = frame.reset_index(drop=True)
    check_times(frame, "time_ms", path=path, rows=rows)
    frame = _fill_batch_features(frame, path, rows)
    frame = _fill_moe_shapes(frame, path)
    _check_op_shapes(frame, path, rows)
    cols = {c: frame[c] for c in frame.columns}
    cols["row"] = rows
    if "device" not in frame.columns or frame["device"].isna().all():
        cols["device"] = frame.get("device_name", pd.Series([None] * len(frame)))
    elif "device_name" in frame.columns:
        # "device" is cpu/cuda in our profiles; the chip's name is what tells tables apart.
        cols["device"] = frame["device_name"].where(frame["device_name"].notna(), frame["device"])
    return make_records(cols, source="profile", file=path)


def import_step_log(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    """A measured step log (STEP_LOG_COLUMNS): every step is a whole-step training row."""
    require_columns(frame, ("duration_ms",), path=path, what="step log")
    frame = frame.reset_index(drop=True)
    rows = frame.index.to_numpy()
    check_times(frame, "duration_ms", path=path, rows=rows)
    frame = _fill_batch_features(frame, path, rows)
    cols = {name: frame[name] for name in FEATURE_NAMES}
    cols.update(op="step", name="step_log", time_ms=frame["duration_ms"], row=rows)
    for extra in ("device", "dtype"):
        if extra in frame.columns:
            cols[extra] = frame[extra]
    return make_records(cols, source="steplog", file=path)


def _ok_rows(frame: pd.DataFrame, path: str) -> np.ndarray:
    if "status" not in frame.columns:
        return np.ones(len(frame), dtype=bool)
    status = frame["status"].astype(str).str.lower()
    unknown = ~status.isin(["ok", "failed"])
    if unknown.any():
        i = int(np.flatnonzero(unknown.to_numpy())[0])
        raise InputError(f"{path}: row {i}: column 'status' must be 'ok' or 'failed', "
                         f"got {shown(frame['status'].iloc[i])}")
    return (status == "ok").to_numpy()


def _fill_batch_features(frame: pd.DataFrame, path: str, rows) -> pd.DataFrame:
    """Derive the batch features from q_lens / kv_lens where a file lacks them."""
    have = all(name in frame.columns for name in FEATURE_NAMES)
    if have and not frame[list(FEATURE_NAMES)].isna().to_numpy().any():
        return frame
    if "q_lens" not in frame.columns or "kv_lens" not in frame.columns:
        needed = "op" not in frame.columns or frame["op"].isin(STEP_LIKE_OPS).any()
        if have or not needed:
            return frame
        missing = [n for n in FEATURE_NAMES if n not in frame.columns]
        raise InputError(f"{path}: missing column(s) {', '.join(missing)} and no q_lens/kv_lens "
                         f"to derive them from")
    frame = frame.copy()
    derived = []
    for i, (q, s) in enumerate(zip(frame["q_lens"], frame["kv_lens"])):
        if q is None or s is None or (np.ndim(q) == 0) or len(q) != len(s) or len(q) == 0:
            if frame.get("op") is None or frame["op"].iloc[i] in STEP_LIKE_OPS:
                raise InputError(f"{path}: row {int(rows[i])}: column 'q_lens' / 'kv_lens' must be "
                                 f"two lists of the same non-zero length")
            derived.append(dict.fromkeys(FEATURE_NAMES, np.nan))
            continue
        derived.append(batch_row(np.asarray(q, dtype=np.int64), np.asarray(s, dtype=np.int64)))
    derived = pd.DataFrame(derived, index=frame.index)
    for name in FEATURE_NAMES:
        if name in frame.columns:
            frame[name] = frame[name].where(frame[name].notna(), derived[name])
        else:
            frame[name] = derived[name]
    return frame


def _fill_moe_shapes(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    """moe rows need their expert shape (profile columns since schema 1 gained them); tp and ep
    default to 1: the profiler times a whole MoE layer on one device."""
    if "op" not in frame.columns:
        return frame
    moe = (frame["op"].astype(str) == "moe").to_numpy()
    if not moe.any():
        return frame
    missing = [c for c in MOE_SPEC_FIELDS if c not in frame.columns or frame.loc[moe, c].isna().any()]
    if missing:
        raise InputError(f"{path}: moe rows lack column(s) {', '.join(missing)} (profile it again with this "
                         f"version of stepcal)")
    frame = frame.copy()
    for col in MOE_ONE_DEVICE:
        if col not in frame.columns:
            frame[col] = np.nan
        frame.loc[moe, col] = frame.loc[moe, col].fillna(1)
    return frame


def _check_op_shapes(frame: pd.DataFrame, path: str, rows) -> None:
    ops = frame["op"].astype(str)
    gemm = frame[ops == "gemm"]
    if len(gemm):
        require_columns(frame, ("m", "n", "k"), path=path, what="GEMM profile")
        _positive(gemm, ("m", "n", "k"), path, rows)
    attn = frame[ops.isin(["attn_prefill", "attn_decode"])]
    if len(attn):
        require_columns(frame, ("num_heads", "num_kv_heads", "head_dim"), path=path,
                        what="attention profile")
        _positive(attn, ("num_seqs", "num_heads", "num_kv_heads", "head_dim"), path, rows)
    steps = frame[ops.isin(["step", "overhead"])]
    if len(steps):
        _positive(steps, ("num_seqs",), path, rows)
    moe = frame[ops == "moe"]
    if len(moe):
        _positive(moe, ("num_tokens", *MOE_SPEC_FIELDS, *MOE_ONE_DEVICE), path, rows)


def _positive(part: pd.DataFrame, columns, path, rows) -> None:
    try:
        check_positive(part.reset_index(drop=True), columns, path=path)
    except InputError:
        # Re-raise naming the file's own row number, not the position within the op's rows.
        for col in columns:
            values = pd.to_numeric(part[col], errors="coerce").to_numpy(dtype=np.float64)
            bad = ~np.isfinite(values) | (values <= 0)
            if bad.any():
                i = part.index[int(np.flatnonzero(bad)[0])]
                raise InputError(f"{path}: row {int(rows[i])}: column {col!r} must be a positive "
                                 f"number, got {shown(part[col].loc[i])}") from None
        raise
