"""A fitted target's prediction (and spread) at grid points given as record columns: what
composition evaluates every term with."""
from __future__ import annotations

from costmodel.features import design
from costmodel.records import make_records
from costmodel.regressors import predict_with_spread


def predict_grid(result, target: str, columns: dict, dtype: str):
    """(mean, spread) in ms of `result.targets[target]` at the points `columns` describe."""
    fit = result.targets[target]
    frame = make_records({**columns, "dtype": dtype}, source="grid", file="grid")
    return predict_with_spread(fit.estimator, design(target, frame).X)
