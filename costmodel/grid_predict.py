"""A fitted target's prediction (and spread) at grid points given as record columns: what
composition evaluates every term with."""
from __future__ import annotations

import numpy as np

from stepcal.costmodel.features import design
from stepcal.costmodel.records import make_records
from stepcal.costmodel.regressors import predict_with_spread


def predict_grid(result, target: str, columns: dict, dtype: str, *, with_spread: bool = True):
    """(mean, spread) in ms of `result.targets[target]` at the points `columns` describe; without
    spread, zeros for it (a forest's spread over its trees costs several times its mean)."""
    fit = result.targets[target]
    frame = make_records({**columns, "dtype": dtype}, source="grid", file="grid")
    X = design(target, frame).X
    if with_spread:
        return predict_with_spread(fit.estimator, X)
    return fit.estimator.predict(X), np.zeros(len(X))
