"""Predictions of a table directory for every timed row of a profile file (any supported format).

Whole steps go through the T_step tables (what the simulator sees); operator rows go through
the fitted regressor of their target, stored with the tables.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from stepcal.core.batch import StepFeatures
from stepcal.core.errors import InputError
from stepcal.core.readers import one_line
from stepcal.costmodel.features import assign_targets, design
from stepcal.costmodel.pickled import load_pickled
from stepcal.costmodel.regressors import predict_with_spread
from stepcal.costmodel.table_meta import TableMeta
from stepcal.costmodel.tables import load_step_model

OUTPUT_SHAPE_COLUMNS = ("name", "m", "n", "k", "num_seqs", "num_tokens", "num_decode",
                        "decode_kv_sum", "decode_kv_max", "prefill_tokens", "prefill_attn_work",
                        "kv_sum", "num_heads", "num_kv_heads", "head_dim", "width", "tp", "num_experts",
                        "experts_per_token", "expert_ffn_size", "ep")


def predict_records(table_dir: str | Path, records: pd.DataFrame) -> pd.DataFrame:
    """One row per record: row, op, shape columns, measured_ms, predicted_ms, spread_ms, ape_percent."""
    table_dir = Path(table_dir)
    meta = TableMeta.read(table_dir)
    fitted = meta.targets
    # GEMM rows go to their dtype's regressor where the tables have one per dtype.
    targets = assign_targets(records, fitted=fitted if isinstance(fitted, dict) else {})
    predicted = np.full(len(records), np.nan)
    spread = np.full(len(records), np.nan)
    step_model = None
    for target in targets.unique():
        mask = (targets == target).to_numpy()
        rows = records[mask].reset_index(drop=True)
        if target == "step":
            step_model = step_model or load_step_model(table_dir)
            features = StepFeatures.from_columns(rows)
            predicted[mask] = step_model.features_ms(features)
            spread[mask] = step_model.features_spread_ms(features)
            continue
        model = _load_regressor(table_dir, meta, target)
        if model is None:
            continue   # the tables know nothing of this target: predicted_ms stays empty
        predicted[mask], spread[mask] = predict_with_spread(model, design(target, rows).X)
    out = pd.DataFrame({"row": records["row"].to_numpy(), "op": records["op"].to_numpy()})
    for col in OUTPUT_SHAPE_COLUMNS:
        if records[col].notna().any():
            out[col] = records[col].to_numpy()
    out["measured_ms"] = records["time_ms"].to_numpy()
    out["predicted_ms"] = predicted
    out["spread_ms"] = spread
    out["ape_percent"] = 100 * np.abs(predicted - out["measured_ms"]) / out["measured_ms"]
    return out


def _load_regressor(table_dir: Path, meta: TableMeta, target: str):
    targets = meta.targets or {}
    entry = targets.get(target) if isinstance(targets, dict) else None
    if entry is None:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
        raise InputError(f"{table_dir / 'meta.json'}: targets.{target}: missing key 'model' (the file name "
                         f"of the target's regressor)")
    path = table_dir / entry["model"]
    if not path.is_file():
        raise InputError(f"{path}: regressor of target {target!r} is missing from the tables")
    try:
        return load_pickled(path)
    except Exception as exc:   # unpickling a damaged file can raise almost anything; all mean "damaged"
        raise InputError(f"{path}: not a readable regressor of target {target!r} "
                         f"({type(exc).__name__}: {one_line(exc)})") from None
