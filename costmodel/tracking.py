"""MLflow tracking of a fit: one run with parameters, data hash and provenance, held-out
metrics, Optuna trials as nested runs, the tables, a predicted-vs-measured plot and a pyfunc
model (registered under a name on request). Kept outside the estimators and the fit itself.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from stepcal.costmodel.fitting import FitResult
from stepcal.costmodel.table_meta import TableMeta

PIP_REQUIREMENTS = ["numpy", "pandas", "pyarrow", "scikit-learn", "mlflow"]


def default_tracking_uri(out_dir: Path) -> str:
    """A SQLite store in the output folder (MLflow 3 refuses a plain ./mlruns file store)."""
    return f"sqlite:///{Path(out_dir).resolve() / 'mlflow.db'}"


def _quiet_mlflow() -> None:
    """MLflow's store migrations and model-logging advice are noise on a CLI's terminal."""
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*type hints to the `predict` method.*")
    warnings.filterwarnings("ignore", message=".*Passing a Python object as `python_model`.*")


def track_fit(result: FitResult, table_dir: Path, meta: TableMeta, *, tracking_uri: str,
              experiment: str = "stepcal-fit", register: str | None = None,
              plot_path: Path | None = None, params: dict | None = None,
              artifact_root: Path | None = None) -> str:
    """Log the fit; returns the run id. A new experiment keeps its artifacts in `artifact_root`
    (so that a default store under the output folder does not write into the working directory)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    _quiet_mlflow()
    import mlflow  # lazy: loads mlflow
    mlflow.set_tracking_uri(tracking_uri)
    if artifact_root is not None and mlflow.get_experiment_by_name(experiment) is None:
        mlflow.create_experiment(experiment, artifact_location=Path(artifact_root).resolve().as_uri())
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"fit-{result.data_hash}") as run:
        mlflow.log_params({**(params or {}), "regressor": result.config.regressor,
                           "trials": result.config.trials, "seed": result.config.seed,
                           "targets": ",".join(sorted(result.targets))})
        mlflow.set_tags({"training_data_hash": result.data_hash,
                         "sources": ",".join(meta.provenance["sources"]),
                         "devices": ",".join(meta.provenance["devices"]) or "unknown",
                         "mode": meta.mode})
        mlflow.log_metrics(flat_metrics(result))
        for target, fit in result.targets.items():
            mlflow.log_params({f"{target}.family": fit.choice.family,
                               **{f"{target}.{k}": v for k, v in fit.choice.params.items()}})
            _log_trials(mlflow, target, fit.trials)
        if plot_path is not None and plot_path.exists():
            mlflow.log_artifact(str(plot_path))
        with tempfile.TemporaryDirectory() as tmp:
            tables = _copy_tables(table_dir, meta, Path(tmp) / "tables")
            mlflow.log_artifacts(str(tables), artifact_path="tables")
            if (table_dir / "models").is_dir():
                mlflow.log_artifacts(str(table_dir / "models"), artifact_path="regressors")
            from stepcal.costmodel.mlflow_model import TStepPyfunc  # lazy: loads mlflow
            info = mlflow.pyfunc.log_model(name="t_step", python_model=TStepPyfunc(),
                                           artifacts={"tables": str(tables)},
                                           pip_requirements=PIP_REQUIREMENTS)
        if register:
            mlflow.register_model(info.model_uri, register)
        return run.info.run_id


def _copy_tables(table_dir: Path, meta: TableMeta, dest: Path) -> Path:
    """The grid files and meta.json only: the output folder also holds the store itself."""
    dest.mkdir(parents=True)
    names = ["meta.json", "ops.parquet"] + [entry["file"] for entry in meta.terms.values()]
    for name in names:
        if (table_dir / name).exists():
            shutil.copy2(table_dir / name, dest / name)
    return dest


def flat_metrics(result: FitResult) -> dict[str, float]:
    """`<split>.<stat>` overall and `<target>.<split>.<stat>` per target (MLflow-safe names)."""
    out = {}
    for split, stats in result.errors.items():
        out.update({f"{split}.{k}": v for k, v in stats.items() if v is not None})
    for target, fit in result.targets.items():
        name = target.replace(":", ".")
        for split, stats in fit.errors.items():
            out.update({f"{name}.{split}.{k}": v for k, v in stats.items() if v is not None})
    return out


def _log_trials(mlflow, target: str, trials: list[dict]) -> None:
    for trial in trials:
        with mlflow.start_run(run_name=f"{target}-trial-{trial['number']}", nested=True):
            mlflow.log_params(dict(trial["params"]))
            mlflow.set_tags({"target": target, "state": trial["state"]})
            if trial["value"] is not None:
                mlflow.log_metric("objective_ape", trial["value"])
