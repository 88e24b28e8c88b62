"""Held-out error: the splits and the error statistics. Never computed on training rows."""
from __future__ import annotations

import numpy as np

# The held-out splits every target is scored on, in the order errors are reported (then the
# optional --holdout file).
SPLITS = ("random", "extrapolation")


def ape_percent(measured, predicted) -> np.ndarray:
    measured = np.asarray(measured, dtype=np.float64)
    return 100.0 * np.abs(np.asarray(predicted, dtype=np.float64) - measured) / measured


def error_stats(measured, predicted) -> dict:
    """MAPE, P90 and max of the absolute percentage error, and the number of rows."""
    ape = ape_percent(measured, predicted)
    if not len(ape):
        return {"mape": None, "p90_ape": None, "max_ape": None, "n": 0}
    return {"mape": float(ape.mean()), "p90_ape": float(np.percentile(ape, 90)),
            "max_ape": float(ape.max()), "n": int(len(ape))}


def random_split(groups: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
    """Test mask holding out a random share of groups (all records of one source row together)."""
    _, inverse = np.unique(groups, return_inverse=True)
    rng = np.random.default_rng(seed)
    held = rng.random(inverse.max() + 1) < test_fraction
    if not held.any():
        held[rng.integers(len(held))] = True
    if held.all():
        held[rng.integers(len(held))] = False
    return held[inverse]


def extrapolation_split(size: np.ndarray, by_value: bool = False) -> np.ndarray | None:
    """Test mask for the larger half of the size axis; None when the axis does not vary. `by_value`:
    the half is of the axis's distinct values, not of the rows: whole steps served by an engine are
    mostly decodes of a few tokens, and the rows' median (9 tokens on a quickstart's profile) held
    out every prefill (a 57% MAPE that said nothing about the fit); the values' median holds out the
    prefills larger than any the fit saw."""
    size = np.asarray(size, dtype=np.float64)
    threshold = np.median(np.unique(size) if by_value else size)
    test = size > threshold
    if not test.any() or test.all():
        return None
    return test


def group_ids(records) -> np.ndarray:
    """One id per source row: the records an importer made from one line share it."""
    return (records["file"].astype(str) + "#" + records["row"].astype(str)).to_numpy()


# meta.json `model_error` keeps, per split, the held-out rows' log(predicted / measured) at these
# quantiles: enough to draw from without storing every row.
RESIDUAL_QUANTILES = tuple(round(float(q), 2) for q in np.linspace(0.0, 1.0, 21))
Z_P10_P90 = 2.5631   # the width of a normal's 10th-90th percentile range, in standard deviations


def log_residual_quantiles(measured, predicted) -> dict | None:
    """{"n", "log_ratio"}: the held-out rows' log(predicted / measured) at RESIDUAL_QUANTILES; None
    without a row both positive. A lognormal sized by the MAPE would take the errors as symmetric and
    unbiased; the quantiles keep a fit's bias and its long tail. On whole steps timed once each (a
    profile's served steps) they hold that timing's noise as well, which widens the draw."""
    measured = np.asarray(measured, dtype=np.float64)
    predicted = np.asarray(predicted, dtype=np.float64)
    usable = (measured > 0) & (predicted > 0) & np.isfinite(measured) & np.isfinite(predicted)
    if not usable.any():
        return None
    ratios = np.log(predicted[usable] / measured[usable])
    return {"n": int(usable.sum()),
            "log_ratio": [round(float(v), 5) for v in np.quantile(ratios, RESIDUAL_QUANTILES)]}


def repeat_cv(rows, shape_columns=()) -> float | None:
    """The profile's own repeat scatter of a target's points, as a coefficient of variation: the median
    over the points timed more than once of their 10th-90th percentile range over their median time (a
    normal's); where every point is a single timing (whole steps served), the median over shapes timed
    three or more times of the standard deviation of their log time (`shape_columns` name a shape).
    None where neither is known (imported profiles)."""
    if not {"time_ms", "time_ms_p10", "time_ms_p90"} <= set(rows.columns) or not len(rows):
        return None
    # a point timed once has equal percentiles: its zero range says nothing of the scatter
    repeated = rows[rows["time_ms_p90"] > rows["time_ms_p10"]]
    spread = ((repeated["time_ms_p90"] - repeated["time_ms_p10"]) / repeated["time_ms"] / Z_P10_P90).to_numpy(np.float64)
    spread = spread[np.isfinite(spread)]
    if len(spread):
        return round(float(np.median(spread)), 5)
    shapes = [c for c in shape_columns if c in rows.columns]
    timed = rows[rows["time_ms"] > 0]
    if not shapes or not len(timed):
        return None
    log_time = np.log(timed["time_ms"].astype("float64")).rename("log_time")
    by_shape = log_time.groupby([timed[c] for c in shapes], dropna=False).agg(["std", "count"])
    sds = by_shape.loc[by_shape["count"] >= 3, "std"].dropna()
    return round(float(np.median(sds)), 5) if len(sds) else None
