"""Fit one regressor per target and measure each on held-out rows.

For every target: choose a model (the default forest for `rf`, an Optuna search on the random
split's training rows for `tuned`), score it on the random split and on the extrapolation
split (refitted on each split's training rows), then refit on all rows for the tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.model_spec import DTYPE_BYTES
from stepcal.costmodel.additive import AdditiveGridRegressor
from stepcal.costmodel.evaluation import SPLITS, error_stats, extrapolation_split, group_ids, random_split
from stepcal.costmodel.features import assign_targets, design, kind_for, kind_of
from stepcal.costmodel.records import data_hash
from stepcal.costmodel.regressors import make_regressor
from stepcal.costmodel.tuning import Choice, default_choice, tune

REGRESSORS = ("rf", "tuned")
MIN_ROWS = 8


@dataclass
class FitConfig:
    regressor: str = "tuned"
    trials: int = 12
    seed: int = 0
    storage: str | None = None       # Optuna: None (memory), a journal file, or an RDB URL
    timeout_s: float | None = None   # per target's study
    test_fraction: float = 0.2


@dataclass
class TargetFit:
    target: str
    kind: str
    feature_names: tuple[str, ...]
    physics_index: tuple[int, ...]
    choice: Choice
    estimator: object                 # fitted on all of the target's rows
    n_rows: int
    errors: dict                      # split -> error_stats
    held_out: dict                    # split -> (measured, predicted), for plots and pooling
    trials: list[dict] = field(default_factory=list)


@dataclass
class FitResult:
    targets: dict[str, TargetFit]
    errors: dict                      # split -> error_stats over every target's held-out rows
    data_hash: str
    records: pd.DataFrame
    config: FitConfig
    skipped: dict[str, str] = field(default_factory=dict)   # target -> why


def select_records(records: pd.DataFrame, *, device: str | None = None, dtype: str | dict | None = None,
                   tp: int | None = None, ops: str | None = None) -> pd.DataFrame:
    """The rows of one configuration: one device, one dtype (or one per op: a dict op -> dtype,
    "*" for the rest), one tensor-parallel degree for steps; with `ops` (comma-separated), only
    those ops."""
    out = records
    if ops:
        wanted = [o.strip() for o in ops.split(",") if o.strip()]
        keep = out["op"].isin(wanted)
        if not keep.any():
            raise InputError(f"--ops {ops}: no rows of these ops; the input has {', '.join(sorted(out['op'].unique()))}")
        out = out[keep]
    devices = sorted(d for d in out["device"].dropna().astype(str).unique())
    if device is not None:
        keep = out["device"].isna() | out["device"].astype(str).str.lower().str.contains(
            device.lower(), regex=False)
        if not keep[out["device"].notna()].any():
            raise InputError(f"--device {device!r}: no rows; devices in the input: {devices}")
        out = out[keep]
    elif len(devices) > 1:
        raise InputError(f"the input mixes devices {devices}; choose one with --device")
    if dtype is not None and out["dtype"].notna().any():
        out = _select_dtype(out, dtype)
    steps = out["op"].isin(["step", "overhead", "host"]) & out["tp"].notna()
    if steps.any():
        have = sorted(int(v) for v in out.loc[steps, "tp"].unique())
        wanted = have[0] if tp is None else tp
        if wanted not in have:
            raise InputError(f"--tp {tp}: no whole-step rows at that degree; the input has {have}")
        out = out[~steps | (out["tp"] == wanted)]
    return whole_steps(out).reset_index(drop=True)


def whole_steps(records: pd.DataFrame) -> pd.DataFrame:
    """Where engine step logs train the whole-step target, the profiler's own step rows go: they time
    an iteration's device part alone (the `host` op its host part), held or served, and would pull
    the target below the logs' whole steps (a served profile adds thousands of them)."""
    is_step = records["op"] == "step"
    from_logs = is_step & (records["name"] == "step_log")
    return records[~is_step | from_logs] if from_logs.any() else records


def dtypes_for(spec) -> dict[str, str | tuple[str, ...]]:
    """The dtype(s) of each op's rows a model needs: for GEMMs, every dtype its GEMMs run in (the
    weights', and the compute dtype of those vLLM leaves unquantised: ModelSpec.gemm_dtypes());
    the weights' for experts; the KV cache's (the compute dtype) for attention, collectives and
    the rest."""
    compute = spec.kv_dtype or spec.dtype
    gemm = tuple(sorted(set(spec.gemm_dtypes().values())))
    return {"gemm": gemm[0] if len(gemm) == 1 else gemm, "moe": spec.dtype, "*": compute}


def _select_dtype(out: pd.DataFrame, dtype: str | dict) -> pd.DataFrame:
    """Rows without a dtype, and rows of the wanted one (of an op's wanted ones, a tuple); other
    dtypes are dropped (a model's missing terms are listed in meta.json), but not every row."""
    wanted = dtype if isinstance(dtype, dict) else {"*": dtype}

    def allowed(op) -> tuple:
        value = wanted.get(op, wanted["*"])
        return value if isinstance(value, tuple) else (value,)
    matches = pd.Series([d in allowed(op) for op, d in zip(out["op"], out["dtype"])], index=out.index)
    if not matches.any():
        have = sorted(out["dtype"].dropna().unique())
        what = f"--dtype {dtype!r}" if not isinstance(dtype, dict) else f"the model's dtypes {wanted}"
        raise InputError(f"{what}: no rows; dtypes in the input: {have}{_dtype_hint(wanted['*'], have)}")
    return out[out["dtype"].isna() | matches]


def _dtype_hint(compute: str, have: list[str]) -> str:
    """The --dtype flag(s) that would select the input's rows, those of the compute dtype's width
    first (float16 and bfloat16 run at the same tensor-core rate, so either's rows time the other)."""
    same_width = [d for d in have if DTYPE_BYTES.get(d) == DTYPE_BYTES.get(compute)]
    flags = " or ".join(f"--dtype {d}" for d in (same_width or have))
    return f"; pass {flags} to use them" if flags else ""


def build_estimator(choice: Choice, physics_index, seed: int, increasing=False):
    """`increasing`: the additive regressor's `monotone` flags (one per design column)."""
    if choice.family == "additive":
        return AdditiveGridRegressor(**choice.params, monotone=increasing)
    return make_regressor(choice.family, choice.params, physics_index, random_state=seed)


def fit_all(records: pd.DataFrame, config: FitConfig, holdout: pd.DataFrame | None = None,
            progress=None) -> FitResult:
    if config.regressor not in REGRESSORS:
        raise InputError(f"--regressor: unknown {config.regressor!r}; known: {', '.join(REGRESSORS)}")
    from threadpoolctl import threadpool_limits  # lazy: loads threadpoolctl
    # Small fits in loops: OpenMP thread pools (boosting) cost more than they give, and thrash
    # when the machine is shared.
    with threadpool_limits(limits=1):
        return _fit_all(records, config, holdout, progress)


def _fit_all(records, config, holdout, progress) -> FitResult:
    targets = assign_targets(records)
    hold_targets = assign_targets(holdout, fitted=targets.unique()) if holdout is not None else None
    fits, skipped = {}, {}
    for target in sorted(targets.unique()):
        rows = records[targets == target].reset_index(drop=True)
        if len(rows) < MIN_ROWS:
            skipped[target] = f"only {len(rows)} rows (need {MIN_ROWS})"
            continue
        if progress:
            progress(target, len(rows))
        hold = holdout[hold_targets == target] if holdout is not None else None
        fits[target] = fit_target(target, rows, config, hold)
    if not fits:
        raise InputError("no target has enough rows to fit: " +
                         "; ".join(f"{t}: {why}" for t, why in skipped.items()))
    errors = {}
    for split in (*SPLITS, "holdout"):
        pairs = [f.held_out[split] for f in fits.values() if split in f.held_out]
        if pairs:
            errors[split] = error_stats(np.concatenate([p[0] for p in pairs]),
                                        np.concatenate([p[1] for p in pairs]))
    return FitResult(fits, errors, data_hash(records), records, config, skipped)


def fit_target(target: str, rows: pd.DataFrame, config: FitConfig,
               holdout: pd.DataFrame | None = None) -> TargetFit:
    kind = kind_for(target, rows)
    d = design(target, rows, kind)
    y = rows["time_ms"].to_numpy(dtype=np.float64)
    seed = config.seed
    increasing = kind.increasing(d.names)
    test = random_split(group_ids(rows), config.test_fraction, seed)
    choice, trials = default_choice(kind_of(target)), []
    if config.regressor == "tuned":
        def build(c):
            return build_estimator(c, d.physics_index, seed, increasing)
        choice, trials = tune(build, d.X[~test], y[~test], d.size[~test], kind=kind_of(target),
                              has_physics=bool(d.physics_index), n_trials=config.trials,
                              seed=seed, storage=config.storage,
                              study_name=f"stepcal-{target}", timeout_s=config.timeout_s)
    splits = {"random": test, "extrapolation": extrapolation_split(d.size, by_value=kind_of(target) == "step")}
    errors, held_out = {}, {}
    for split, mask in splits.items():
        if mask is None or (~mask).sum() < 2:
            continue
        model = build_estimator(choice, d.physics_index, seed, increasing).fit(d.X[~mask], y[~mask])
        predicted = model.predict(d.X[mask])
        errors[split] = error_stats(y[mask], predicted)
        held_out[split] = (y[mask], predicted)
    final = build_estimator(choice, d.physics_index, seed, increasing).fit(d.X, y)
    if holdout is not None and len(holdout):
        hd = design(target, holdout.reset_index(drop=True), kind)
        measured = holdout["time_ms"].to_numpy(dtype=np.float64)
        predicted = final.predict(hd.X)
        errors["holdout"] = error_stats(measured, predicted)
        held_out["holdout"] = (measured, predicted)
    return TargetFit(target, kind_of(target), d.names, d.physics_index, choice, final, len(rows),
                     errors, held_out, trials)
