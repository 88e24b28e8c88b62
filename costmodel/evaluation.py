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
