"""The times an AIConfigurator export writes: the profile's own median where it measured the shape,
else the fitted regressor's prediction; each row says which (`stepcal_source`).

A shape in AIConfigurator's columns becomes our record through the AIConfigurator importer itself
(costmodel.importers.aiconfigurator), so the regressor sees it as it saw AIConfigurator's rows
when it was fitted, and a measured row of the profile matches it column for column.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.model_spec import ModelSpec
from stepcal.core.readers import one_line
from stepcal.costmodel.features import KINDS, design, kind_of
from stepcal.costmodel.importers import load_profiles
from stepcal.costmodel.importers.aiconfigurator import import_table
from stepcal.costmodel.records import SHAPE_COLUMNS
from stepcal.costmodel.regressors import predict_with_spread

MEASURED, PREDICTED = "measured", "predicted"
# No kernel launches faster than this: a regressor extended far beyond its data may fall below it.
FLOOR_MS = 1e-3
_ABSENT = -1.0     # what an absent shape column is matched as


@dataclass(frozen=True)
class Values:
    """One table's times and where each came from."""
    latency_ms: np.ndarray
    source: np.ndarray          # MEASURED or PREDICTED per row
    floored: int                # predictions raised to FLOOR_MS


def shape_records(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """Our records of AIConfigurator-format shapes (row i is frame's row i)."""
    return import_table(frame.assign(latency=1.0), f"<{table} shapes>")


def table_values(frame: pd.DataFrame, table: str, target: str, model,
                 profile: pd.DataFrame | None) -> Values:
    records = shape_records(frame, table)
    predicted, _ = predict_with_spread(model, design(target, records).X)
    floored = int(np.sum(predicted < FLOOR_MS))
    latency = np.maximum(np.asarray(predicted, dtype=np.float64), FLOOR_MS)
    source = np.full(len(frame), PREDICTED, dtype=object)
    if profile is not None:
        measured = measured_ms(records, profile, target)
        hit = ~np.isnan(measured)
        latency[hit], source[hit] = measured[hit], MEASURED
    return Values(latency, source, floored)


def shape_columns(target: str) -> tuple[str, ...]:
    """The record columns that say which shape a row of `target` times: those its regressor reads
    (an all-reduce's message too), every shape column for an op without a kind."""
    kind = kind_of(target)
    if kind not in KINDS:
        return SHAPE_COLUMNS
    return KINDS[kind].columns + (("num_tokens", "width") if kind == "all_reduce" else ())


def _keys(records: pd.DataFrame, target: str) -> pd.DataFrame:
    keys = records[["op", "dtype"] + (["name"] if ":" in target else [])].astype(str)
    shapes = records[list(shape_columns(target))].astype(np.float64)
    # An absent degree is one GPU, as the regressor reads it.
    shapes = shapes.fillna({c: 1.0 for c in ("tp", "ep") if c in shapes}).fillna(_ABSENT)
    return pd.concat([keys.reset_index(drop=True), shapes.reset_index(drop=True)], axis=1)


def measured_ms(records: pd.DataFrame, profile: pd.DataFrame, target: str) -> np.ndarray:
    """The profile's median time of each record's shape (same op, dtype and shape_columns; the
    name too where the target is one implementation's), NaN where it was not measured."""
    ops = set(records["op"].astype(str))
    timed = profile[profile["op"].astype(str).isin(ops)]
    if timed.empty:
        return np.full(len(records), np.nan)
    keys = _keys(timed, target)
    columns = list(keys.columns)
    medians = keys.assign(time_ms=timed["time_ms"].to_numpy()).groupby(columns, dropna=False)["time_ms"].median()
    wanted = _keys(records, target)
    joined = wanted.merge(medians.reset_index(), on=columns, how="left")
    return joined["time_ms"].to_numpy(dtype=np.float64)


def profile_records(inputs, devices, spec: ModelSpec | None, tp: int) -> tuple[pd.DataFrame | None, str]:
    """The fitted profile read again (the paths meta.json's `inputs` lists), restricted to the
    fitted devices; None and the reason where it cannot be read (moved, or never recorded)."""
    if not inputs:
        return None, "the tables do not say which profile they were fitted on: every time is predicted"
    paths = [Path(p) for p in inputs]
    try:
        bundle = any(p.is_dir() and ((p / "meta.yaml").exists() or any(p.glob("tp*"))) for p in paths)
        frame = load_profiles(paths, "llmservingsim", spec, tp) if bundle else load_profiles(paths, "auto")
    except (InputError, OSError) as exc:
        return None, f"the fitted profile could not be read again ({one_line(exc)}): every time is predicted"
    if devices:
        frame = frame[frame["device"].isna() | frame["device"].isin(list(devices))]
    return frame.reset_index(drop=True), ""
