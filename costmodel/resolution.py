"""How far a T_step table is from the regressors it was built from.

A composed per-token term's table (linear, measured elementwise, moe and all_reduce by num_tokens,
lm_head by num_seqs) holds, at each knot, the sum over layers and operators of the regressors' predictions; between knots it
is linear. This module looks the table up at every value the term's data were measured at and
at the chunk sizes users pick, evaluates the summed regressor predictions at the same points,
and reports the relative difference: what the table's resolution costs, apart from the
regressors' own error.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.model_spec import ModelSpec, Parallelism
from stepcal.costmodel import grid
from stepcal.costmodel.compose import (
    Axes,
    compose_terms,
    data_axes,
    measured_axes,
    op_grids,
    per_seq_terms_ms,
    per_token_terms_ms,
)
from stepcal.costmodel.compose_comm import DEFAULT_COMPOSITION, Composition
from stepcal.costmodel.pickled import load_pickled
from stepcal.costmodel.tables import load_step_model
from stepcal.costmodel.terms import FeatureCurve, Term

CHUNK_SIZES = (256, 512, 1024, 2048, 4096)
# Term -> the axis of its table (and of the measured values in meta.json's "axes").
PER_TOKEN_TERMS = {"linear": "num_tokens", "elementwise": "num_tokens", "moe": "num_tokens",
                   "all_reduce": "num_tokens", "lm_head": "num_seqs"}
COLUMNS = ["term", "x", "point", "table_ms", "regressor_ms", "rel_diff"]


def compare(result, terms: list[Term], spec: ModelSpec, parallelism: Parallelism,
            measured: dict, composition: Composition = DEFAULT_COMPOSITION) -> pd.DataFrame:
    """One row per (per-token term, point): the table's value, the summed regressor predictions
    and table / regressor - 1. Points: the term's measured values ("measured") and the chunk
    sizes ("chunk", listed again where they were measured too)."""
    rows = []
    for term in terms:
        axis = PER_TOKEN_TERMS.get(term.name)
        if axis is None or not isinstance(term, FeatureCurve):
            continue
        data = np.asarray(measured.get(axis, []), dtype=np.float64)
        chunks = np.asarray(CHUNK_SIZES, dtype=np.float64)
        x = np.concatenate([data, chunks])
        regressor = _regressor_ms(result, spec, parallelism, composition, axis, x).get(term.name)
        if regressor is None:
            continue            # a roofline's element-wise term: a formula, no regressor to compare with
        table = grid.interp1(x, term.knots, term.time_ms)
        rows.append(pd.DataFrame({"term": term.name, "x": x,
                                  "point": np.r_[["measured"] * len(data), ["chunk"] * len(chunks)],
                                  "table_ms": table, "regressor_ms": regressor,
                                  "rel_diff": table / regressor - 1.0}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=COLUMNS)


def _regressor_ms(result, spec: ModelSpec, parallelism: Parallelism, composition: Composition,
                  axis: str, x: np.ndarray) -> dict[str, np.ndarray]:
    if axis == "num_seqs":
        return per_seq_terms_ms(result, spec, parallelism, x)
    return per_token_terms_ms(result, spec, parallelism, x, composition)


def summary(frame: pd.DataFrame) -> dict:
    """P50, P99 and max of |table / regressor - 1| in %: over all rows, by kind of point
    (measured, chunk) and by term."""
    def stats(rows: pd.DataFrame) -> dict:
        diff = np.abs(rows["rel_diff"].to_numpy(dtype=np.float64)) * 100
        if not len(diff):
            return {"p50_pct": None, "p99_pct": None, "max_pct": None, "n": 0}
        return {"p50_pct": float(np.percentile(diff, 50)), "p99_pct": float(np.percentile(diff, 99)),
                "max_pct": float(diff.max()), "n": int(len(diff))}
    return {"all": stats(frame), **{point: stats(frame[frame["point"] == point]) for point in ("measured", "chunk")},
            **{term: stats(rows) for term, rows in frame.groupby("term", sort=False)}}


def resolution_of_fit(result, spec: ModelSpec, parallelism: Parallelism, *, axes: Axes | None = None,
                      composition: Composition = DEFAULT_COMPOSITION) -> pd.DataFrame:
    """compare() on the terms a FitResult composes (on `axes`; by default the data's, as
    build_tables makes them), without writing them."""
    axes = axes or data_axes(result, spec, parallelism, composition)
    ops = op_grids(result, spec, parallelism, axes, composition)
    terms = compose_terms(result, spec, parallelism, axes, ops, composition)
    return compare(result, terms, spec, parallelism, measured_axes(result, spec, parallelism), composition)


@dataclass
class StoredTarget:
    estimator: object


@dataclass
class StoredFit:
    """What composition reads of a FitResult (each target's fitted estimator), from the
    models/ of a table directory."""
    targets: dict[str, StoredTarget]


def resolution_of_directory(path: str | Path) -> pd.DataFrame:
    """compare() on a table directory from `stepcal fit`: its tables, its regressors (models/),
    its model spec and the measured values meta.json's "axes" lists."""
    path = Path(path)
    model = load_step_model(path)
    meta = model.meta
    if not meta.model_spec:
        raise InputError(f"{path}: fitted without --model-spec: no composed terms to compare")
    measured = (meta.axes or {}).get("measured")
    if not measured:
        raise InputError(f"{path}: meta.json's axes list no measured values (tables written before "
                         f"they were recorded): fit again to compare")
    fit = StoredFit({t: StoredTarget(load_pickled(path / entry["model"])) for t, entry in meta.targets.items()})
    composition = Composition(moe_distribution=(meta.composition or {}).get("moe_distribution"))
    return compare(fit, model.terms, ModelSpec(**meta.model_spec),
                   Parallelism(tp=meta.tp or 1, ep=meta.ep or 1), measured, composition)
