"""T_step tables: write a fitted cost model as a directory of small grids, and load it back as
a step-time model the simulator drives.

Layout of a table directory:
  meta.json             axes, units, features, data hash, held-out errors, MLflow run id, model
                        spec, provenance, host terms (null until calibrated)
  <term>.parquet        one grid per additive term (time_ms and spread_ms per grid point)
  ops.parquet           per-layer operator times by num_tokens (for exports such as Vidur's)
  models/<target>.joblib  the fitted regressors (for `stepcal predict` on operator rows)

Each term's kind (costmodel.terms.TERM_KINDS) writes its grid and looks it up: the segment of each
value (a precomputed index for counts, a binary search beyond it: costmodel.grid) plus a few
multiply-adds per term; no scikit-learn.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stepcal.core.batch import FEATURE_NAMES, StepBatch, StepFeatures
from stepcal.core.errors import InputError
from stepcal.core.io import atomic_write_json
from stepcal.core.readers import read_json, read_parquet, require_keys
from stepcal.core.schemas import SCHEMA_VERSION, TOOL_VERSION
from stepcal.costmodel.terms import GRID_COLUMNS, Term, read_term
from stepcal.simulator.step_model import FeatureStepModel

TABLE_KIND = "stepcal.t_step_tables"


def write_meta(directory: Path, meta: dict) -> None:
    meta = {"kind": TABLE_KIND, "schema_version": SCHEMA_VERSION, "tool_version": TOOL_VERSION,
            "units": {"time": "ms"}, "features": list(FEATURE_NAMES), "host_terms": None, **meta}
    atomic_write_json(directory / "meta.json", meta)


# ---------------------------------------------------------------------------- loading

META_WHAT = "the meta.json of a T_step table directory, written by `stepcal fit`"
META_KEYS = ("kind", "t_step_terms", "terms")
TERM_KEYS = ("file", "axes")


def read_meta(path: str | Path) -> dict:
    path = Path(path)
    meta_path = path / "meta.json"
    if not meta_path.exists():
        raise InputError(f"{path}: not a T_step table directory (no meta.json)")
    meta = read_json(meta_path, META_WHAT, required_keys=("kind",))
    if meta["kind"] != TABLE_KIND:
        raise InputError(f"{meta_path}: kind is {meta['kind']!r}, expected {TABLE_KIND!r}")
    require_keys(meta_path, meta, META_KEYS, META_WHAT)
    if not isinstance(meta["t_step_terms"], list) or not isinstance(meta["terms"], dict):
        raise InputError(f"{meta_path}: t_step_terms must be a list and terms an object ({META_WHAT})")
    return meta


def term_entry(path: Path, meta: dict, name: str) -> dict:
    """meta.json's entry of a term, with the keys every term kind reads."""
    where = path / "meta.json"
    entry = meta["terms"].get(name) if isinstance(name, str) else None
    if not isinstance(entry, dict):
        raise InputError(f"{where}: term {name!r} has no entry under 'terms' (an object with file and axes)")
    require_keys(where, entry, TERM_KEYS, f"the entry of term {name!r} under 'terms'")
    if not isinstance(entry["file"], str) or not isinstance(entry["axes"], list) \
            or not all(isinstance(axis, str) for axis in entry["axes"]):
        raise InputError(f"{where}: term {name!r}: file must be a file name and axes a list of column names")
    return entry


class TableStepModel(FeatureStepModel):
    """T_step from tables: the sum of the terms (never below zero each).

    Calibrated host terms in meta.json are not added here: experiments.step_models wraps the
    tables in simulator.step_model.HostTermsModel, the one place they are applied."""

    def __init__(self, terms: list[Term], meta: dict, path: Path | None = None):
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
    if meta.get("mode") == "operators":
        raise InputError(f"{path}: per-operator regressors only (fitted without --model-spec): no T_step to "
                         f"simulate with; fit again with --model-spec")
    terms = []
    for name in meta["t_step_terms"]:
        entry = term_entry(path, meta, name)
        file = path / entry["file"]
        frame = read_parquet(file, f"the grid of T_step term {name!r}, listed in meta.json", GRID_COLUMNS)
        terms.append(read_term(name, entry, frame, file))
    if not terms:
        raise InputError(f"{path / 'meta.json'}: no T_step terms listed")
    return TableStepModel(terms, meta, path)
