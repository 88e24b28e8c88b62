"""T_step tables: write a fitted cost model as a directory of small grids, and load it back as
a step-time model the simulator drives.

Layout of a table directory:
  meta.json             axes, units, features, data hash, held-out errors, MLflow run id, model
                        spec, provenance, host terms (null until calibrated): costmodel.table_meta
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

from stepcal.core.batch import StepBatch, StepFeatures
from stepcal.core.errors import InputError
from stepcal.core.readers import read_parquet
from stepcal.costmodel.table_meta import TableMeta
from stepcal.costmodel.terms import GRID_COLUMNS, Term, read_term
from stepcal.simulator.step_model import FeatureStepModel


class TableStepModel(FeatureStepModel):
    """T_step from tables: the sum of the terms (never below zero each).

    Calibrated host terms in meta.json are not added here: experiments.step_models wraps the
    tables in simulator.step_model.HostTermsModel, the one place they are applied."""

    def __init__(self, terms: list[Term], meta: TableMeta | None = None, path: Path | None = None):
        self.terms = terms
        self.meta = meta if meta is not None else TableMeta()
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
    meta = TableMeta.read(path)
    if meta.mode == "operators":
        raise InputError(f"{path}: per-operator regressors only (fitted without --model-spec): no T_step to "
                         f"simulate with; fit again with --model-spec")
    terms = []
    for name in meta.t_step_terms:
        entry = meta.term_entry(path, name)
        file = path / entry["file"]
        frame = read_parquet(file, f"the grid of T_step term {name!r}, listed in meta.json", GRID_COLUMNS)
        terms.append(read_term(name, entry, frame, file))
    if not terms:
        raise InputError(f"{path / 'meta.json'}: no T_step terms listed")
    return TableStepModel(terms, meta, path)
