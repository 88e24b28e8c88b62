"""The directories a report reads: validation directories, simulate output directories and T_step table
directories."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.measured_run import REQUESTS, has_request_log, repeat_dirs
from stepcal.core.readers import read_json, read_parquet
from stepcal.costmodel.table_meta import TABLE_KIND, TableMeta
from stepcal.experiments.replications import RANGES_PERCENTILES
from stepcal.experiments.step_model_meta import BUILTIN_KIND, BuiltinMeta, read_step_model_meta
from stepcal.experiments.step_models import resolve_step_model
from stepcal.experiments.validation.compare import ValidationRecord, read_record


@dataclass
class ValidationInput:
    """A `stepcal validate` output directory and the measured request log it was compared with."""
    path: Path
    record: ValidationRecord           # validation.json
    simulated_requests: object | None  # DataFrame
    measured_requests: object | None   # DataFrame, every repeat of the measured run pooled
    step_predictions: object | None    # DataFrame with measured_ms, predicted_ms (empty for imported runs)
    notes: list[str] = field(default_factory=list)
    replica_quantiles: object | None = None   # DataFrame of validate --ranges' replications (CDF bands)


@dataclass
class SimulationInput:
    """A `stepcal simulate` output directory: its summary (with a `ranges` block after --ranges), the
    simulated request log and, after --ranges, each replication's latency quantiles (CDF bands)."""
    path: Path
    summary: dict
    requests: object                          # DataFrame, LATENCY_COLUMNS
    replica_quantiles: object | None = None   # DataFrame, QUANTILE_COLUMNS
    notes: list[str] = field(default_factory=list)


@dataclass
class TablesInput:
    """A T_step table directory: its meta.json, and the model when the tables can be loaded."""
    path: Path
    meta: TableMeta | BuiltinMeta   # BuiltinMeta: a built-in model calibrated by `stepcal calibrate`
    model: object | None
    notes: list[str] = field(default_factory=list)


# What `stepcal validate` writes (validation.md, for people, is not read back).
VALIDATION_FILES = ("validation.json", "simulated_requests.parquet", "step_predictions.parquet")
QUANTILE_COLUMNS = ("replication", "metric", "quantile", "value_ms")
LATENCY_COLUMNS = ("request_id", "finish_s", "ttft_ms", "tpot_ms", "e2e_ms")
# What `stepcal simulate` writes and a report reads (steps.parquet is not read); config.json names the
# command, which tells a simulation from a measured run's repeat (summary.json and requests.parquet too).
SIMULATION_FILES = ("summary.json", "requests.parquet", "config.json")
# Directories whose meta.json makes them a step model a report can describe: fitted tables, and a
# built-in model calibrated by `stepcal calibrate`.
STEP_MODEL_KINDS = (TABLE_KIND, BUILTIN_KIND)


def load_input(path: str | Path) -> ValidationInput | SimulationInput | TablesInput:
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: not a directory (expected a validation, a simulate output or a T_step "
                         f"table directory)")
    if (path / "validation.json").exists():
        return load_validation(path)
    if _written_by_simulate(path):
        return load_simulation(path)
    if (path / "meta.json").exists():
        return load_tables(path)
    raise InputError(f"{path}: neither a validation directory (validation.json), a simulate output directory "
                     f"(config.json of `stepcal simulate`) nor a T_step table directory (meta.json)")


def load_validation(path: Path) -> ValidationInput:
    record = read_record(path / "validation.json")
    for name in VALIDATION_FILES:
        if not (path / name).exists():
            raise InputError(f"{path}: missing {name} (a validation directory holds "
                             f"{', '.join(VALIDATION_FILES)}, as `stepcal validate` writes them)")
    simulated = read_parquet(path / "simulated_requests.parquet", "a validation's simulated request log",
                             LATENCY_COLUMNS)
    steps = read_parquet(path / "step_predictions.parquet", "a validation's step predictions",
                         ("measured_ms", "predicted_ms"))
    notes = []
    measured_dir = _measured_dir(path, record.measured_run)
    measured = None
    if measured_dir is None:     # the run may have been moved or deleted since: the report goes on without it
        notes.append(f"measured run {record.measured_run!r} not found: CDFs show the simulated run only")
    else:
        import pandas as pd  # lazy: loads pandas
        # every repeat's requests pooled: validation compares with the repeats' mean statistics
        repeats = [read_parquet(d / REQUESTS, "a measured run's request log", LATENCY_COLUMNS)
                   for d in repeat_dirs(measured_dir)]
        measured = pd.concat(repeats, ignore_index=True) if repeats else None
    quantiles = None
    if (path / RANGES_PERCENTILES).exists():
        quantiles = read_parquet(path / RANGES_PERCENTILES, "a validation's per-replication latency quantiles",
                                 QUANTILE_COLUMNS)
    elif record.ranges:
        notes.append(f"validation.json has ranges but no {RANGES_PERCENTILES} (an older validate): the CDFs "
                     f"show no band; the error table still shows each interval")
    return ValidationInput(path, record, simulated, measured, steps, notes, quantiles)


def _written_by_simulate(path: Path) -> bool:
    config = path / "config.json"
    return config.exists() and read_json(config, "a simulation's config.json").get("command") == "simulate"


def load_simulation(path: Path) -> SimulationInput:
    summary = read_json(path / SIMULATION_FILES[0], "a simulation's summary.json")
    for name in SIMULATION_FILES:
        if not (path / name).exists():
            raise InputError(f"{path}: missing {name} (a simulate output directory holds "
                             f"{', '.join(SIMULATION_FILES)}, as `stepcal simulate` writes them)")
    requests = read_parquet(path / SIMULATION_FILES[1], "a simulation's request log", LATENCY_COLUMNS)
    ranges = summary.get("ranges")
    notes, quantiles = [], None
    if (path / RANGES_PERCENTILES).exists():
        quantiles = read_parquet(path / RANGES_PERCENTILES, "a simulation's per-replication latency quantiles",
                                 QUANTILE_COLUMNS)
    elif ranges:
        notes.append(f"summary.json has ranges but no {RANGES_PERCENTILES} (an older simulate): the CDFs show "
                     f"no band; the table still shows each interval")
    else:
        notes.append("no ranges (simulate without --ranges): the CDFs show the plain run only")
    return SimulationInput(path, summary, requests, quantiles, notes)


def _measured_dir(validation_dir: Path, measured_run: str | None) -> Path | None:
    """validation.json names the measured run as it was given on the command line, which may be
    relative to another working directory; `validate`'s default output sits inside the run."""
    for candidate in (Path(measured_run) if isinstance(measured_run, str) else None, validation_dir.parent):
        if candidate is not None and has_request_log(candidate):
            return candidate
    return None


def load_tables(path: Path) -> TablesInput:
    """A step-model directory; its kind is checked here so that another directory with a meta.json
    (a measured run, a profile) is refused by name rather than reported as tables without a heatmap."""
    kind = read_json(path / "meta.json", "the meta.json of a T_step table directory").get("kind")
    if kind not in STEP_MODEL_KINDS:
        raise InputError(f"{path}: neither a validation directory (no validation.json) nor a T_step table "
                         f"directory (meta.json has kind {kind!r}, expected one of "
                         f"{', '.join(STEP_MODEL_KINDS)})")
    meta = read_step_model_meta(path)
    if isinstance(meta, TableMeta) and meta.mode == "operators":
        return TablesInput(path, meta, None, ["could not load the tables as a step model: per-operator "
                                              "regressors only (fitted without --model-spec); no heatmap"])
    return TablesInput(path, meta, resolve_step_model(str(path)), [])
