"""T_step tables: write a fitted cost model as a directory of small grids, and load it back as
a step-time model the simulator drives.

Layout of a table directory:
  meta.json             axes, units, features, data hash, held-out errors, MLflow run id, model
                        spec, provenance, host terms (null until calibrated)
  <term>.parquet        one grid per additive term (time_ms and spread_ms per grid point)
  ops.parquet           per-layer operator times by num_tokens (for exports such as Vidur's)
  models/<target>.joblib  the fitted regressors (for `stepcal predict` on operator rows)

A lookup is searchsorted plus a few multiply-adds per term (costmodel.grid); no scikit-learn.
"""
from __future__ import annotations

import json
from bisect import bisect_right
from pathlib import Path

import numpy as np
import pandas as pd

from costmodel import grid
from costmodel.terms import Term
from simulator.batch import FEATURE_NAMES, StepBatch, StepFeatures
from simulator.errors import InputError
from simulator.io import atomic_write_json, atomic_write_parquet
from simulator.schemas import SCHEMA_VERSION, TOOL_VERSION
from simulator.step_model import FeatureStepModel

TABLE_KIND = "stepcal.t_step_tables"


def step_term(estimator) -> Term:
    """The additive whole-step regressor as a term: one 1-D grid per batch feature."""
    knots = tuple(np.asarray(k, dtype=np.float64) for k in estimator.knots_)
    values = tuple(np.asarray(v, dtype=np.float64) for v in estimator.values_)
    term = Term("step", tuple(FEATURE_NAMES), knots, np.concatenate(values),
                np.zeros(sum(len(v) for v in values)),
                "whole-step time: intercept + one piecewise-linear function per batch feature",
                intercept_ms=float(estimator.intercept_))
    return term


def write_term(term: Term, directory: Path) -> dict:
    """One Parquet per term; returns its meta.json entry."""
    if term.name == "step":
        frame = pd.DataFrame({
            "feature": np.repeat(term.axes, [len(k) for k in term.knots]),
            "x": np.concatenate(term.knots), "time_ms": term.time_ms, "spread_ms": term.spread_ms})
        entry = {"intercept_ms": term.intercept_ms}
    elif len(term.axes) == 1:
        frame = pd.DataFrame({term.axes[0]: term.knots[0], "time_ms": term.time_ms,
                              "spread_ms": term.spread_ms})
        entry = {}
    else:
        x, y = np.meshgrid(*term.knots, indexing="ij")
        frame = pd.DataFrame({term.axes[0]: x.ravel(), term.axes[1]: y.ravel(),
                              "time_ms": term.time_ms.ravel(), "spread_ms": term.spread_ms.ravel()})
        entry = {}
    atomic_write_parquet(frame, directory / f"{term.name}.parquet")
    return {"file": f"{term.name}.parquet", "axes": list(term.axes), "unit": "ms",
            "description": term.description, **entry}


def write_meta(directory: Path, meta: dict) -> None:
    meta = {"kind": TABLE_KIND, "schema_version": SCHEMA_VERSION, "tool_version": TOOL_VERSION,
            "units": {"time": "ms"}, "features": list(FEATURE_NAMES), "host_terms": None, **meta}
    atomic_write_json(directory / "meta.json", meta)


# ---------------------------------------------------------------------------- loading

def read_meta(path: str | Path) -> dict:
    path = Path(path)
    meta_path = path / "meta.json"
    if not meta_path.exists():
        raise InputError(f"{path}: not a T_step table directory (no meta.json)")
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as exc:
        raise InputError(f"{meta_path}: cannot parse: {exc}") from None
    if meta.get("kind") != TABLE_KIND:
        raise InputError(f"{meta_path}: kind is {meta.get('kind')!r}, expected {TABLE_KIND!r}")
    return meta


_COLUMN = {name: i for i, name in enumerate(FEATURE_NAMES)}


def _segment(x: float, knots: list) -> tuple[int, float]:
    """costmodel.grid.segments for one value, in plain floats (same operations, same bits)."""
    if len(knots) == 1:
        return 0, 0.0
    i = min(max(bisect_right(knots, x) - 1, 0), len(knots) - 2)
    return i, (x - knots[i]) / (knots[i + 1] - knots[i])


def _interp1(x: float, knots: list, values: list) -> float:
    if len(knots) == 1:
        return values[0]
    i, t = _segment(x, knots)
    return values[i] + t * (values[i + 1] - values[i])


def _interp2(x: float, y: float, xknots: list, yknots: list, values: list) -> float:
    i, u = _segment(x, xknots)
    j, v = _segment(y, yknots)
    i1, j1 = min(i + 1, len(xknots) - 1), min(j + 1, len(yknots) - 1)
    low = values[i][j] + v * (values[i][j1] - values[i][j])
    high = values[i1][j] + v * (values[i1][j1] - values[i1][j])
    return low + u * (high - low)


class _Lookup:
    """A term loaded for lookups: grids as arrays, evaluated on StepFeatures (vectorised) or on
    one feature_row() tuple (plain floats, for the simulator's one-step path)."""

    def __init__(self, name: str, entry: dict, frame: pd.DataFrame, path: Path):
        self.name = name
        self.axes = tuple(entry["axes"])
        missing = [c for c in ("time_ms", "spread_ms") if c not in frame.columns]
        if missing:
            raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
        if name == "step":
            self.intercept_ms = float(entry.get("intercept_ms", 0.0))
            self.parts = []
            for feature in self.axes:
                rows = frame[frame["feature"] == feature]
                self.parts.append((feature, rows["x"].to_numpy(np.float64),
                                   rows["time_ms"].to_numpy(np.float64),
                                   rows["spread_ms"].to_numpy(np.float64)))
        elif len(self.axes) == 1:
            frame = frame.sort_values(self.axes[0])
            self.knots = (frame[self.axes[0]].to_numpy(np.float64),)
            self.time_ms = frame["time_ms"].to_numpy(np.float64)
            self.spread_ms = frame["spread_ms"].to_numpy(np.float64)
        else:
            frame = frame.sort_values(list(self.axes))
            self.knots = tuple(np.unique(frame[a].to_numpy(np.float64)) for a in self.axes)
            shape = tuple(len(k) for k in self.knots)
            if len(frame) != shape[0] * shape[1]:
                raise InputError(f"{path}: grid is not complete ({len(frame)} rows for "
                                 f"{shape[0]} x {shape[1]} axis values)")
            self.time_ms = frame["time_ms"].to_numpy(np.float64).reshape(shape)
            self.spread_ms = frame["spread_ms"].to_numpy(np.float64).reshape(shape)
        # Python lists for the scalar path: indexing them costs far less than indexing arrays.
        if name == "step":
            self.row_parts = [(_COLUMN[f], k.tolist(), v.tolist()) for f, k, v, _ in self.parts]
        else:
            self.row_knots = [k.tolist() for k in self.knots]
            self.row_values = self.time_ms.tolist()

    def evaluate(self, f: StepFeatures, which: str = "time_ms") -> np.ndarray:
        if self.name == "step":
            col = 2 if which == "time_ms" else 3
            total = np.full(len(f), self.intercept_ms if which == "time_ms" else 0.0)
            for part in self.parts:
                total = total + grid.interp1(getattr(f, part[0]), part[1], part[col])
            return total
        values = getattr(self, which)
        if self.name == "decode_attn":
            b = f.num_decode
            kv = f.decode_kv_sum / np.maximum(b, 1.0)
            return np.where(b > 0, grid.interp2(b, kv, *self.knots, values), 0.0)
        if self.name == "prefill_attn":
            t = f.prefill_tokens
            ctx = f.prefill_attn_work / np.maximum(t, 1.0)
            return np.where(t > 0, grid.interp2(t, ctx, *self.knots, values), 0.0)
        x = f.num_tokens if self.axes[0] == "num_tokens" else f.num_seqs
        return grid.interp1(x, self.knots[0], values)

    def row_ms(self, row: tuple) -> float:
        """evaluate() of one batch, term for term the same floating-point operations."""
        if self.name == "step":
            total = self.intercept_ms
            for col, knots, values in self.row_parts:
                total = total + _interp1(float(row[col]), knots, values)
            return total
        if self.name == "decode_attn":
            b = float(row[2])
            if not b > 0:
                return 0.0
            return _interp2(b, float(row[3]) / max(b, 1.0), *self.row_knots, self.row_values)
        if self.name == "prefill_attn":
            t = float(row[5])
            if not t > 0:
                return 0.0
            return _interp2(t, float(row[6]) / max(t, 1.0), *self.row_knots, self.row_values)
        x = float(row[1]) if self.axes[0] == "num_tokens" else float(row[0])
        return _interp1(x, self.row_knots[0], self.row_values)


class TableStepModel(FeatureStepModel):
    """T_step from tables: the sum of the terms (never below zero each).

    Calibrated host terms in meta.json are not added here: experiments.step_models wraps the
    tables in simulator.step_model.HostTermsModel, the one place they are applied."""

    def __init__(self, terms: list[_Lookup], meta: dict, path: Path | None = None):
        self.terms = terms
        self.meta = meta
        self.path = path

    def features_ms(self, features: StepFeatures) -> np.ndarray:
        total = np.zeros(len(features))
        for term in self.terms:
            total = total + np.maximum(term.evaluate(features), 0.0)
        return np.asarray(total, dtype=np.float64) * np.ones(len(features))

    def row_ms(self, row: tuple) -> float:
        """The simulator's one-step path: plain floats, bit-identical to features_ms."""
        total = 0.0
        for term in self.terms:
            total = total + max(term.row_ms(row), 0.0)
        return total

    def features_spread_ms(self, features: StepFeatures) -> np.ndarray:
        """One standard deviation of T_step (terms' spreads added in quadrature)."""
        total = np.zeros(len(features))
        for term in self.terms:
            total = total + term.evaluate(features, "spread_ms") ** 2
        return np.sqrt(total)

    def step_ms_spread(self, batch: StepBatch) -> float:
        return float(self.features_spread_ms(batch.features())[0])

    def term_ms(self, features: StepFeatures) -> dict[str, np.ndarray]:
        return {t.name: np.maximum(t.evaluate(features), 0.0) for t in self.terms}

    def describe(self) -> str:
        return f"tables:{self.path}" if self.path else "tables"


def load_step_model(path: str | Path) -> TableStepModel:
    """The StepTimeModel of a T_step table directory (what `simulate --step-model DIR` uses)."""
    path = Path(path)
    meta = read_meta(path)
    lookups = []
    for name in meta.get("t_step_terms", []):
        entry = meta["terms"][name]
        file = path / entry["file"]
        if not file.exists():
            raise InputError(f"{file}: missing (listed in {path / 'meta.json'})")
        lookups.append(_Lookup(name, entry, pd.read_parquet(file), file))
    if not lookups:
        raise InputError(f"{path / 'meta.json'}: no T_step terms listed")
    return TableStepModel(lookups, meta, path)
