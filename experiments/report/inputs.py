"""The directories a report reads: validation directories and T_step table directories."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from experiments.validation.compare import ValidationRecord
from simulator.errors import InputError
from simulator.measured_run import REQUESTS, has_request_log, repeat_dirs


@dataclass
class ValidationInput:
    """A `stepcal validate` output directory and the measured request log it was compared with."""
    path: Path
    record: ValidationRecord           # validation.json
    simulated_requests: object | None  # DataFrame
    measured_requests: object | None   # DataFrame, every repeat of the measured run pooled
    step_predictions: object | None    # DataFrame with measured_ms, predicted_ms (empty for imported runs)
    notes: list[str] = field(default_factory=list)


@dataclass
class TablesInput:
    """A T_step table directory: its meta.json, and the model when the tables can be loaded."""
    path: Path
    meta: dict
    model: object | None
    notes: list[str] = field(default_factory=list)


def load_input(path: str | Path) -> ValidationInput | TablesInput:
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"report: {path}: not a directory")
    if (path / "validation.json").exists():
        return load_validation(path)
    if (path / "meta.json").exists():
        return load_tables(path)
    raise InputError(f"report: {path}: neither a validation directory (validation.json) "
                     f"nor a T_step table directory (meta.json)")


def load_validation(path: Path) -> ValidationInput:
    data = _read_json(path / "validation.json")
    if not isinstance(data.get("metrics"), dict):
        raise InputError(f"report: {path / 'validation.json'}: no 'metrics' (is it from `stepcal validate`?)")
    record = ValidationRecord.from_dict(data)
    notes = []
    simulated = _read_parquet(path / "simulated_requests.parquet", notes)
    steps = _read_parquet(path / "step_predictions.parquet", notes)
    measured_dir = _measured_dir(path, record.measured_run)
    measured = None
    if measured_dir is None:
        notes.append(f"measured run {record.measured_run!r} not found: CDFs show the simulated run only")
    else:
        import pandas as pd
        # every repeat's requests pooled: validation compares with the repeats' mean statistics
        repeats = [_read_parquet(d / REQUESTS, notes) for d in repeat_dirs(measured_dir)]
        repeats = [r for r in repeats if r is not None]
        measured = pd.concat(repeats, ignore_index=True) if repeats else None
    return ValidationInput(path, record, simulated, measured, steps, notes)


def _measured_dir(validation_dir: Path, measured_run: str | None) -> Path | None:
    """validation.json names the measured run as it was given on the command line, which may be
    relative to another working directory; `validate`'s default output sits inside the run."""
    for candidate in (Path(measured_run) if measured_run else None, validation_dir.parent):
        if candidate is not None and has_request_log(candidate):
            return candidate
    return None


def load_tables(path: Path) -> TablesInput:
    meta = _read_json(path / "meta.json")
    notes, model = [], None
    try:
        from experiments.step_models import resolve_step_model
        model = resolve_step_model(str(path))
    except Exception as exc:   # tables from another version, or a loader still being written: report, go on
        notes.append(f"could not load the tables as a step model ({type(exc).__name__}: {exc}); no heatmap")
    return TablesInput(path, meta, model, notes)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"report: {path}: cannot read JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"report: {path}: expected a JSON object")
    return data


def _read_parquet(path: Path, notes: list[str]):
    import pandas as pd
    if not path.exists():
        notes.append(f"{path.name} missing")
        return None
    return pd.read_parquet(path)
