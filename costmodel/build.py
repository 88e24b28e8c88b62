"""From a FitResult to a T_step table directory (terms, operator grids, regressors, meta)."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

from costmodel.compose import Axes, compose_terms, op_grids
from costmodel.fitting import FitResult
from costmodel.tables import write_meta
from costmodel.terms import AdditiveStep
from simulator.errors import InputError
from simulator.io import atomic_write_parquet
from simulator.model_spec import ModelSpec, Parallelism


def build_tables(result: FitResult, directory: Path, *, spec: ModelSpec | None,
                 parallelism: Parallelism, axes: Axes | None = None,
                 extra_meta: dict | None = None) -> dict:
    """Write the terms, ops.parquet and the regressors into `directory`; return the meta dict
    (written as meta.json too; the caller may rewrite it with the MLflow run id)."""
    import joblib
    axes = axes or Axes.default()
    directory = Path(directory)
    terms, ops = [], None
    has_ops = any(t != "step" for t in result.targets)
    if has_ops:
        if spec is None:
            raise InputError("per-operator profiles need --model-spec to compose T_step "
                             "(layers, hidden size, heads)")
        ops = op_grids(result, spec, parallelism, axes)
        terms = compose_terms(result, spec, parallelism, axes, ops)
        if len(ops):
            atomic_write_parquet(ops, directory / "ops.parquet")
    step = result.targets.get("step")
    if step is not None:
        terms.append(AdditiveStep.from_estimator(step.estimator))
    if not terms:
        raise InputError("nothing to build T_step from: the profiles hold no GEMM, attention, "
                         "overhead or whole-step rows")
    entries = {t.name: t.write(directory) for t in terms}
    # Measured whole steps already hold every cost; composed terms are the fallback.
    t_step_terms = ["step"] if step is not None else [t.name for t in terms]
    (directory / "models").mkdir(parents=True, exist_ok=True)
    for target, fit in result.targets.items():
        joblib.dump(fit.estimator, directory / "models" / f"{_safe(target)}.joblib", compress=3)
    composed = ({"linear", "lm_head", "decode_attn", "prefill_attn", "overhead"}
                | ({"all_reduce"} if parallelism.tp > 1 else set()))
    notes = _coverage_notes(result, spec, parallelism) if (has_ops and step is None) else []
    meta = {
        "mode": "step" if step is not None else "composed",
        "t_step_terms": t_step_terms,
        "missing_terms": sorted(composed - set(entries)) if step is None else [],
        "terms": entries,
        "axes": {name: getattr(axes, name).tolist() for name in axes.__dataclass_fields__},
        "training_data_hash": result.data_hash,
        "held_out_errors": {"overall": result.errors,
                            **{t: f.errors for t, f in result.targets.items()}},
        "error_note": "absolute percentage errors in %, on rows held out from fitting; "
                      "hyperparameters were tuned on the random split's training rows",
        "targets": {t: {"family": f.choice.family, "params": f.choice.params, "rows": f.n_rows,
                        "features": list(f.feature_names), "model": f"models/{_safe(t)}.joblib"}
                    for t, f in result.targets.items()},
        "skipped_targets": result.skipped,
        "notes": notes,
        "regressor": result.config.regressor,
        "trials": result.config.trials if result.config.regressor == "tuned" else None,
        "seed": result.config.seed,
        "model_spec": spec.to_dict() if spec else None,
        "tp": parallelism.tp,
        "num_layers": spec.num_layers if spec else None,
        "mlflow_run_id": None,
        "provenance": {
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "sources": sorted(result.records["source"].unique().tolist()),
            "files": sorted(result.records["file"].unique().tolist()),
            "devices": sorted(result.records["device"].dropna().astype(str).unique().tolist()),
            "dtypes": sorted(result.records["dtype"].dropna().unique().tolist()),
            "rows": int(len(result.records)),
        },
        **(extra_meta or {}),
    }
    write_meta(directory, meta)
    return meta


def _coverage_notes(result: FitResult, spec: ModelSpec, parallelism: Parallelism) -> list[str]:
    """Where composition asks a regressor about shapes outside its data, say so."""
    notes = []
    gemm = result.records[result.records["op"] == "gemm"]
    if len(gemm):
        n_max, k_max = gemm["n"].max(), gemm["k"].max()
        for name, (n, k) in spec.gemm_shapes(parallelism).items():
            if n > n_max or k > k_max:
                notes.append(f"{name} GEMM (n={n:g}, k={k:g}) lies beyond the profiled shapes "
                             f"(n <= {n_max:g}, k <= {k_max:g}): its time is extrapolated")
    return notes


def _safe(target: str) -> str:
    return target.replace(":", "__")
