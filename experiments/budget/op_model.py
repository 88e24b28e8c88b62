"""The op's regressor, fitted to the points measured so far and asked, at every candidate, for its
time and how sure it is.

For ops with physics features (GEMMs, attention, MoE, element-wise: costmodel.features) it is the
physics-informed model that `stepcal fit`'s tuning starts from (costmodel.tuning.STARTING_POINTS:
linear in FLOPs and bytes, extra trees on the ratio residual), which interpolates between sparse
points where a plain forest steps; other ops take the fit's default choice.

Candidates are record rows (costmodel.records) of one op; each of the op's fit targets
(costmodel.features.assign_targets: e.g. one per element-wise operator) gets its own model on its
own design matrix, exactly as a fit would. The uncertainty is the spread of the forest's trees,
relative to the prediction: the campaign scores by relative error, as the fit's MAPE does.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from stepcal.costmodel.features import assign_targets, design, kind_for, kind_of
from stepcal.costmodel.fitting import MIN_ROWS, build_estimator
from stepcal.costmodel.regressors import predict_with_spread
from stepcal.costmodel.tuning import Choice, default_choice

# below the rows `stepcal fit` needs to fit a target at all, its candidates count as unknown: a target
# whose points mostly fall outside a replayed profile's hull keeps drawing picks until the fit can use it
MIN_FIT_ROWS = MIN_ROWS
UNKNOWN_REL_SPREAD = 1.0
PHYSICS = Choice("physics", {"residual": "ratio", "intercept": True, "tree": "et", "n_estimators": 60,
                             "min_samples_leaf": 1, "max_features": 0.7})


class OpModel:
    """The fit targets of a candidate record frame, with their design matrices built once."""

    def __init__(self, candidates: pd.DataFrame, seed: int = 0) -> None:
        self.candidates = candidates.reset_index(drop=True)
        self.seed = seed
        targets = assign_targets(self.candidates)
        self.targets = {}
        for target in sorted(targets.unique()):
            index = np.flatnonzero((targets == target).to_numpy())
            rows = self.candidates.iloc[index]
            kind = kind_for(target, rows)
            self.targets[target] = (index, design(target, rows, kind), kind)

    def predict(self, measured: np.ndarray, times_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time_ms, relative spread) at every candidate, from forests fitted on the candidates
        `measured` (indices) at `times_ms`; NaN time and UNKNOWN_REL_SPREAD where a target has
        too few measured points."""
        time_ms = np.full(len(self.candidates), np.nan)
        spread = np.full(len(self.candidates), UNKNOWN_REL_SPREAD)
        measured_time = dict(zip(np.asarray(measured).tolist(), np.asarray(times_ms, dtype=float).tolist()))
        for target, (index, d, kind) in self.targets.items():
            have = np.array([i in measured_time for i in index])
            if have.sum() < MIN_FIT_ROWS:
                continue
            model = self.fit(target, d, kind, have, np.array([measured_time[i] for i in index[have]]))
            mean, sd = predict_with_spread(model, d.X)
            time_ms[index] = np.maximum(mean, 1e-9)
            spread[index] = sd / time_ms[index]
        return time_ms, spread

    def fit(self, target: str, d, kind, rows: np.ndarray, times_ms: np.ndarray):
        """The target's estimator fitted on its design rows `rows` (a mask)."""
        choice = PHYSICS if d.physics_index else default_choice(kind_of(target))
        estimator = build_estimator(choice, d.physics_index, self.seed, kind.increasing(d.names))
        return estimator.fit(d.X[rows], times_ms)
