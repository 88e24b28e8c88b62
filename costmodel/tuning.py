"""The Optuna search over model families and hyperparameters for one target.

TPE, seeded; a median pruner stops trials whose first folds are already worse than most.
The objective weighs the APE of one extrapolation fold (fit on the smaller half of the size
axis, score on the larger) and the mean APE over three random folds half and half, so that
families that go flat beyond the data lose. Whole steps (TIME_WEIGHTED_KINDS) weigh instead, on the
random folds, the mean APE and the time-weighted APE half and half. Everything here runs on training
rows only; the caller holds out the rest.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stepcal.costmodel.evaluation import ape_percent, extrapolation_split

TUNE_MAX_ROWS = 1500   # trials see at most this many rows: the ranking of configs survives it
# The chosen physics model fits without training rows that out-of-fold predictions miss by over
# 1.5x: shared profiles hold glitched points (2-4x their neighbours) that drag nearby predictions.
# Held-out rows are never trimmed. Trials search untrimmed (trimming costs three extra fits, and
# it helped every family alike), so only the fits of the chosen model pay for it.
TRIM = 0.4


# Known-good configurations tried first, so that even a short study has seen each idea once.
STARTING_POINTS = {
    "ops": [{"family": "physics", "residual": "ratio", "intercept": True, "tree": "hgb",
             "learning_rate": 0.1, "max_iter": 300, "max_leaf_nodes": 31, "min_samples_leaf": 4},
            {"family": "physics", "residual": "additive", "intercept": False, "tree": "et",
             "n_estimators": 60, "min_samples_leaf": 1, "max_features": 0.7},
            # Ratio residual on extra trees, leaves of one: follows the steps of tiled kernels.
            {"family": "physics", "residual": "ratio", "intercept": True, "tree": "et",
             "n_estimators": 60, "min_samples_leaf": 1, "max_features": 0.7},
            {"family": "rf", "n_estimators": 100, "min_samples_leaf": 2, "max_features": 1.0}],
    # Many knots for thousands of logged steps; few and smooth for a profile's dozen or two whole
    # steps (the quick grid's 18: leave-one-out MAPE 13% with 8 knots, 7% with 3 and smoothing 0.1).
    "step": [{"n_knots": 8, "smoothing": 1e-3}, {"n_knots": 3, "smoothing": 0.1}, {"n_knots": 24, "smoothing": 1e-4}],
    "host": [{"n_knots": 3, "smoothing": 0.1}],
}
# Kinds fitted by the additive regressor (their tables are its own grids: costmodel.terms.AdditiveStep),
# with their search spaces: (n_knots low, high), (smoothing low, high). Host time is nearly linear in
# sequences and tokens and a profile holds a dozen points of it: eight knots a feature fitted the
# noise (the quickstart's host curve went negative between 141 and 165 tokens; leave-one-out MAPE
# 105-209% against 13-60% with three knots and smoothing 0.1).
ADDITIVE_SPACES = {"step": ((2, 32), (1e-5, 10.0)), "host": ((2, 4), (1e-2, 10.0))}
ADDITIVE_KINDS = tuple(ADDITIVE_SPACES)
# Kinds scored by time-weighted error in place of the extrapolation fold. A whole step's size axis
# (num_tokens) splits a served profile at a few tokens, so that fold trained on decodes and scored on
# prefills of up to 8,192 tokens: every configuration missed by 700-3,800%, and that half of the
# objective picked one at random. The few big prefill steps hold much of a profile's time and all of
# a burst's wait, yet count as a few rows in the mean APE. The choices it made (three to eight knots)
# priced a profile's own 28 steps over 4,096 tokens at 0.79-0.87 of their time; 24 knots priced them
# right, at a lower mean APE too (5.4% against 6.4% on a held-out quarter). Over sixteen quickstarts
# the runs' steps over 4,096 tokens went from 0.88 to 0.99 of their time, and 475 -> 488 of 576
# P50/P90 cells of the profiled path met their target.
TIME_WEIGHTED_KINDS = ("step",)


@dataclass
class Choice:
    family: str
    params: dict = field(default_factory=dict)


def default_choice(kind: str) -> Choice:
    if kind in ADDITIVE_KINDS:
        return Choice("additive", dict(STARTING_POINTS[kind][0]))
    return Choice("rf", {"n_estimators": 100, "min_samples_leaf": 2, "max_features": 1.0})


def make_storage(storage: str | None):
    """None: in memory. A URL (sqlite:///..., postgresql://...): RDB. Anything else: a journal file."""
    import optuna  # lazy: loads optuna
    if storage is None:
        return None
    if "://" in storage:
        return storage
    from optuna.storages.journal import JournalFileBackend  # lazy: loads optuna
    return optuna.storages.JournalStorage(JournalFileBackend(storage))


def suggest(trial, kind: str, has_physics: bool) -> Choice:
    if kind in ADDITIVE_KINDS:
        (knots_low, knots_high), (smooth_low, smooth_high) = ADDITIVE_SPACES[kind]
        return Choice("additive", {"n_knots": trial.suggest_int("n_knots", knots_low, knots_high),
                                   "smoothing": trial.suggest_float("smoothing", smooth_low, smooth_high,
                                                                    log=True)})
    families = ["rf", "et", "hgb"] + (["physics"] if has_physics else [])
    family = trial.suggest_categorical("family", families)
    params: dict = {}
    tree = family
    if family == "physics":
        params["residual"] = trial.suggest_categorical("residual", ["ratio", "additive"])
        params["intercept"] = trial.suggest_categorical("intercept", [True, False])
        tree = params["tree"] = trial.suggest_categorical("tree", ["rf", "et", "hgb"])
    if tree == "hgb":
        params["learning_rate"] = trial.suggest_float("learning_rate", 0.02, 0.3, log=True)
        params["max_iter"] = trial.suggest_int("max_iter", 50, 300, log=True)
        params["max_leaf_nodes"] = trial.suggest_int("max_leaf_nodes", 8, 64, log=True)
        params["min_samples_leaf"] = trial.suggest_int("min_samples_leaf", 2, 20, log=True)
    else:
        params["n_estimators"] = trial.suggest_int("n_estimators", 30, 120, log=True)
        params["min_samples_leaf"] = trial.suggest_int("min_samples_leaf", 1, 8, log=True)
        params["max_features"] = trial.suggest_categorical("max_features", [1.0, 0.7, 0.4])
    return Choice(family, params)


def tune(build, X: np.ndarray, y: np.ndarray, size: np.ndarray, *, kind: str, has_physics: bool,
         n_trials: int, seed: int, storage: str | None = None, study_name: str | None = None,
         timeout_s: float | None = None) -> tuple[Choice, list[dict]]:
    """The best Choice found and a record of every trial. `build(choice)` makes an estimator."""
    import optuna  # lazy: loads optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = np.random.default_rng(seed)
    if len(y) > TUNE_MAX_ROWS:
        keep = np.sort(rng.choice(len(y), TUNE_MAX_ROWS, replace=False))
        X, y, size = X[keep], y[keep], size[keep]
    time_weighted = kind in TIME_WEIGHTED_KINDS
    folds = _folds(len(y), None if time_weighted else size, rng)
    has_extrapolation = len(folds) == 4

    def objective(trial):
        choice = suggest(trial, kind, has_physics)
        scores = []
        for step, (train, test) in enumerate(folds):
            model = build(choice).fit(X[train], y[train])
            scores.append(_score(y[test], model.predict(X[test]), time_weighted))
            trial.report(_objective(scores, has_extrapolation), step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        trial.set_user_attr("choice", {"family": choice.family, "params": choice.params})
        return _objective(scores, has_extrapolation)

    study = optuna.create_study(
        direction="minimize", study_name=study_name, storage=make_storage(storage),
        load_if_exists=storage is not None,
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(4, n_trials // 3)),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=1))
    if not study.trials:
        for params in STARTING_POINTS.get(kind if kind in ADDITIVE_KINDS else "ops", []):
            if has_physics or params.get("family") != "physics":
                study.enqueue_trial(params)
    study.optimize(objective, n_trials=n_trials, timeout=timeout_s)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not done:
        return default_choice(kind), _trial_log(study)
    best = study.best_trial.user_attrs["choice"]
    params = {**best["params"], "trim": TRIM} if best["family"] == "physics" else best["params"]
    return Choice(best["family"], params), _trial_log(study)


def _objective(scores: list[float], has_extrapolation: bool) -> float:
    """The extrapolation fold (first) and the random folds count half each."""
    if not has_extrapolation or len(scores) < 2:
        return float(np.mean(scores))
    return 0.5 * scores[0] + 0.5 * float(np.mean(scores[1:]))


def _score(measured: np.ndarray, predicted: np.ndarray, time_weighted: bool) -> float:
    """A fold's mean APE; `time_weighted`: its mean with the time-weighted APE (sum |error| / sum time)."""
    ape = float(ape_percent(measured, predicted).mean())
    if not time_weighted:
        return ape
    weighted = 100.0 * float(np.abs(predicted - measured).sum() / measured.sum())
    return 0.5 * ape + 0.5 * weighted


def _folds(n: int, size: np.ndarray | None, rng) -> list[tuple[np.ndarray, np.ndarray]]:
    """Three random folds, after the extrapolation fold of `size` where it has one (None: none)."""
    order = rng.permutation(n)
    parts = np.array_split(order, 3)
    folds = [(np.setdiff1d(order, part), part) for part in parts]
    extrap = None if size is None else extrapolation_split(size)
    if extrap is not None and (~extrap).sum() >= 10:
        # First, so that the pruner judges every trial on extrapolation from its first report.
        folds.insert(0, (np.flatnonzero(~extrap), np.flatnonzero(extrap)))
    return folds


def _trial_log(study) -> list[dict]:
    return [{"number": t.number, "state": t.state.name, "value": t.value, "params": dict(t.params),
             "duration_s": t.duration.total_seconds() if t.duration else None}
            for t in study.trials]
