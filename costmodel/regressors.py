"""Regressors, following scikit-learn's rules: `fit` validates, learns `*_` attributes, writes
nothing and returns self. Tuning (costmodel.tuning) and tracking (costmodel.tracking) wrap them.

Families: plain tree ensembles (random forest, extra trees, histogram gradient boosting) and a
physics-informed model, linear in FLOPs and bytes moved with a tree model on its residual, which
keeps extrapolating along the linear part where pure trees go flat. Each can give a spread per
prediction (the spread of its trees) for the simulator's ranges.
"""
from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.ensemble import ExtraTreesRegressor, HistGradientBoostingRegressor, RandomForestRegressor
from sklearn.utils.validation import check_is_fitted, validate_data

FAMILIES = ("rf", "et", "hgb", "physics")


def _tree(kind: str, *, n_estimators: int, min_samples_leaf: int, max_features: float,
          learning_rate: float, max_iter: int, max_leaf_nodes: int, random_state):
    if kind == "hgb":
        return HistGradientBoostingRegressor(learning_rate=learning_rate, max_iter=max_iter,
                                             max_leaf_nodes=max_leaf_nodes,
                                             min_samples_leaf=max(min_samples_leaf, 2),
                                             random_state=random_state)
    cls = RandomForestRegressor if kind == "rf" else ExtraTreesRegressor
    # One job: fits are small and run inside CV loops, where a thread pool costs more than it saves.
    return cls(n_estimators=n_estimators, min_samples_leaf=min_samples_leaf,
               max_features=max_features, random_state=random_state, n_jobs=1)


def _tree_spread(model, X: np.ndarray) -> np.ndarray:
    """Standard deviation over a forest's trees; zero for boosting (one additive model)."""
    trees = getattr(model, "estimators_", None)
    if trees is None or not len(trees) or not hasattr(trees[0], "predict"):
        return np.zeros(len(X))
    per_tree = np.stack([t.predict(X) for t in trees])
    return per_tree.std(axis=0)


class TimeRegressor(RegressorMixin, BaseEstimator):
    """What every estimator of step or kernel time shares: its targets are times, positive."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = True
        return tags

    def _validate_times(self, X, y):
        X, y = validate_data(self, X, y, y_numeric=True)
        if (y <= 0).any():
            raise ValueError("times must be positive")
        return X, y


class _TreeParams(TimeRegressor):
    """The hyperparameters of the tree ensemble a regressor fits (see `_tree`); subclasses list
    them in their own __init__ (scikit-learn reads the parameters from its signature)."""

    def __init__(self, tree, n_estimators, min_samples_leaf, max_features, learning_rate,
                 max_iter, max_leaf_nodes, random_state):
        self.tree = tree
        self.n_estimators = n_estimators
        self.min_samples_leaf = min_samples_leaf
        self.max_features = max_features
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.max_leaf_nodes = max_leaf_nodes
        self.random_state = random_state

    def _new_tree(self):
        return _tree(self.tree, n_estimators=self.n_estimators,
                     min_samples_leaf=self.min_samples_leaf, max_features=self.max_features,
                     learning_rate=self.learning_rate, max_iter=self.max_iter,
                     max_leaf_nodes=self.max_leaf_nodes, random_state=self.random_state)


class TreeRegressor(_TreeParams):
    """A tree ensemble on the raw features; learns log(time) so that its error is relative."""

    def __init__(self, tree="rf", n_estimators=100, min_samples_leaf=1, max_features=1.0,
                 learning_rate=0.1, max_iter=200, max_leaf_nodes=31, log_target=True,
                 random_state=0):
        super().__init__(tree, n_estimators, min_samples_leaf, max_features, learning_rate,
                         max_iter, max_leaf_nodes, random_state)
        self.log_target = log_target

    def fit(self, X, y):
        X, y = self._validate_times(X, y)
        self.model_ = self._new_tree()
        self.model_.fit(X, np.log(y) if self.log_target else y)
        return self

    def predict(self, X):
        check_is_fitted(self, "model_")
        X = validate_data(self, X, reset=False)
        raw = self.model_.predict(X)
        return np.exp(raw) if self.log_target else raw

    def predict_spread(self, X):
        """One standard deviation of the prediction over the trees, in ms."""
        check_is_fitted(self, "model_")
        X = validate_data(self, X, reset=False)
        spread = _tree_spread(self.model_, X)
        return self.predict(X) * spread if self.log_target else spread


class PhysicsResidualRegressor(_TreeParams):
    """time = (c0 + c·physics(x)) corrected by a tree model of the residual.

    The linear part is a non-negative least-squares fit in relative error on the physics
    columns (FLOPs, bytes moved, ...). The residual is a ratio (`residual="ratio"`, the tree
    learns log(time / linear)) or a difference (`"additive"`). Beyond the profiled range the
    tree's correction stays at its value at the edge while the linear part keeps growing, so
    the model extrapolates like the roofline rather than going flat. With `trim` (a log
    ratio, e.g. 0.4 for 1.5x) the model is fitted without the training rows that 3-fold
    out-of-fold predictions miss by more than that factor: glitched profile points.
    """

    def __init__(self, physics_index=(), intercept=True, residual="ratio", tree="rf",
                 n_estimators=100, min_samples_leaf=1, max_features=1.0, learning_rate=0.1,
                 max_iter=200, max_leaf_nodes=31, trim=None, random_state=0):
        super().__init__(tree, n_estimators, min_samples_leaf, max_features, learning_rate,
                         max_iter, max_leaf_nodes, random_state)
        self.physics_index = physics_index
        self.intercept = intercept
        self.residual = residual
        self.trim = trim

    def fit(self, X, y):
        X, y = self._validate_times(X, y)
        keep = np.ones(len(y), dtype=bool)
        if self.trim is not None and len(y) >= 30:
            keep = self._consistent_rows(X, y)
        self.n_trimmed_ = int((~keep).sum())
        return self._fit(X[keep], y[keep])

    def _consistent_rows(self, X, y) -> np.ndarray:
        """Rows whose time agrees with a model of the other rows within a factor exp(trim).

        A profile may hold a few glitched points (several times off their neighbours); one in a
        leaf drags every prediction near it. Out-of-fold predictions (3 folds) find them."""
        rng = np.random.default_rng(self.random_state)
        fold = rng.integers(0, 3, len(y))
        oof = np.empty(len(y))
        for f in range(3):
            inner = clone(self).set_params(trim=None).fit(X[fold != f], y[fold != f])
            oof[fold == f] = inner.predict(X[fold == f])
        return np.abs(np.log(y / oof)) <= self.trim

    def _fit(self, X, y):
        from scipy.optimize import nnls  # lazy: loads scipy
        if self.residual not in ("ratio", "additive"):
            raise ValueError(f"residual must be 'ratio' or 'additive', got {self.residual!r}")
        P = self._physics(X)
        self.scale_ = np.maximum(np.abs(P).max(axis=0), 1e-300)
        w = 1.0 / y   # relative error: every point counts alike whatever its size
        coef, _ = nnls(P / self.scale_ * w[:, None], y * w)
        self.coef_ = coef / self.scale_
        self.fallback_ms_ = 0.0
        linear = self._linear(X)
        if not (linear > 0).all():
            # No usable physics (e.g. all coefficients zero): the tree carries everything.
            self.coef_ = np.zeros_like(self.coef_)
            self.fallback_ms_ = float(np.median(y))
            linear = self._linear(X)
        self.tree_ = self._new_tree()
        target = np.log(y / linear) if self.residual == "ratio" else y - linear
        self.tree_.fit(self._tree_features(X), target)
        return self

    def predict(self, X):
        check_is_fitted(self, "tree_")
        X = validate_data(self, X, reset=False)
        linear = self._linear(X)
        correction = self.tree_.predict(self._tree_features(X))
        if self.residual == "ratio":
            return linear * np.exp(correction)
        return np.maximum(linear + correction, 1e-3 * linear)

    def predict_spread(self, X):
        check_is_fitted(self, "tree_")
        X = validate_data(self, X, reset=False)
        spread = _tree_spread(self.tree_, self._tree_features(X))
        if self.residual == "ratio":
            return self.predict(X) * spread
        return spread

    def _physics(self, X):
        cols = [X[:, i] for i in self.physics_index]
        if self.intercept or not cols:
            cols = [np.ones(len(X))] + cols
        return np.column_stack(cols)

    def _linear(self, X):
        return self._physics(X) @ self.coef_ + self.fallback_ms_

    def __setstate__(self, state):
        # Models pickled before every fit set fallback_ms_ held it only where it was not zero.
        if "coef_" in state:
            state.setdefault("fallback_ms_", 0.0)
        super().__setstate__(state)

    @staticmethod
    def _tree_features(X):
        # Sizes span decades: logs put 8 vs 16 tokens as far apart as 4096 vs 8192.
        return np.log1p(np.maximum(X, 0.0))


def make_regressor(family: str, params: dict, physics_index, random_state=0):
    """An unfitted regressor of a family with its hyperparameters (names as in the classes)."""
    if family == "physics":
        if not physics_index:
            raise ValueError("the physics family needs physics features")
        return PhysicsResidualRegressor(physics_index=tuple(physics_index),
                                        random_state=random_state, **params)
    if family in ("rf", "et", "hgb"):
        return TreeRegressor(tree=family, random_state=random_state, **params)
    raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")


def predict_with_spread(model, X) -> tuple[np.ndarray, np.ndarray]:
    mean = model.predict(X)
    spread = model.predict_spread(X) if hasattr(model, "predict_spread") else np.zeros(len(mean))
    return mean, spread


__all__ = [
    "FAMILIES",
    "PhysicsResidualRegressor",
    "TimeRegressor",
    "TreeRegressor",
    "make_regressor",
    "predict_with_spread",
]
