"""Put a report together: read the directories, draw, render report.md / report.html, log to MLflow."""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from stepcal.core.errors import InputError
from stepcal.core.io import atomic_output_dir, atomic_write_bytes
from stepcal.experiments.report.document import Document, Image
from stepcal.experiments.report.inputs import SimulationInput, TablesInput, ValidationInput, load_input
from stepcal.experiments.report.plots import decode_grid_ms, decode_heatmap, latency_cdfs, step_scatter
from stepcal.experiments.report.ranges import cdf_bands, interval_cells, ranges_text, simulation_rows
from stepcal.experiments.step_models import resolve_step_model
from stepcal.experiments.validation.compare import ValidationRecord
from stepcal.experiments.validation.extrapolated import describe_beyond
from stepcal.experiments.validation.machine_speed import describe_speed
from stepcal.experiments.validation.steps import StepLevelError
from stepcal.experiments.validation.table import STEP_MATCHED_NOTE, step_matched_rows

HEADLINE = (("ttft_ms", "p50"), ("ttft_ms", "p90"), ("ttft_ms", "p99"), ("tpot_ms", "p50"), ("tpot_ms", "p90"),
            ("tpot_ms", "p99"), ("e2e_ms", "p50"), ("e2e_ms", "p90"), ("e2e_ms", "p99"))
MAX_META_ROWS = 80


def build_report(dirs: list[str], out: str | Path, step_model_specs: list[str] = ()) -> list[str]:
    """Write OUT/report.md, OUT/report.html and the PNGs; returns the names of the files written."""
    inputs = [load_input(d) for d in dirs]
    models = [(spec, _resolve(spec)) for spec in step_model_specs]
    doc = make_document(inputs, models)
    with atomic_output_dir(out) as staging:
        for image in doc.images:
            atomic_write_bytes(staging / image.filename, image.png)
        atomic_write_bytes(staging / "report.md", doc.to_markdown().encode())
        atomic_write_bytes(staging / "report.html", doc.to_html().encode())
    return ["report.md", "report.html"] + [image.filename for image in doc.images]


def describe_report(out: str | Path, files: list[str]) -> str:
    """The line `stepcal report` prints once the files are written."""
    return f"wrote {out}/report.md, report.html and {len(files) - 2} plots"


def _resolve(spec: str):
    return resolve_step_model(spec)


def make_document(inputs: list, models: list[tuple[str, object]]) -> Document:
    doc = Document("stepcal report")
    validations = [i for i in inputs if isinstance(i, ValidationInput)]
    names = _unique_names([i.path for i in inputs])
    if len(validations) > 1:
        doc.heading("Headline errors")
        doc.text("(simulated − measured) / measured per validation run; step MAPE and the error of the total "
                 "step time on the measured step log.")
        doc.table(["validation"] + [f"{m.removesuffix('_ms').upper()} {s}" for m, s in HEADLINE]
                  + ["step MAPE", "step total"],
                  [[names[v.path]] + [_pct(_error(v.record, m, s)) for m, s in HEADLINE]
                   + [_pct(v.record.step_level.mape, signed=False), _pct(v.record.step_level.total_error)]
                   for v in validations])
    for item in inputs:
        if isinstance(item, ValidationInput):
            add_validation(doc, item, names[item.path])
        elif isinstance(item, SimulationInput):
            add_simulation(doc, item, names[item.path])
        else:
            add_tables(doc, item, names[item.path])
    for spec, model in models:
        doc.heading(f"Step model {spec}")
        doc.image(Image(f"heatmap_{_slug(spec)}.png", heatmap_png(model, f"T_step of {spec}, pure decode"),
                        f"T_step of {spec} over batch size and KV length (pure decode)"))
    return doc


def add_validation(doc: Document, v: ValidationInput, name: str) -> None:
    r = v.record
    doc.heading(f"Validation: {v.path}")
    doc.text(f"measured run {r.measured_run}, step model {r.step_model or '?'}: "
             f"{r.num_requests} requests, {r.num_finished_both} finished in both runs, "
             f"{r.num_finished_only_measured} only measured, "
             f"{r.num_finished_only_simulated} only simulated.")
    for note in v.notes:
        doc.text(f"note: {note}")
    if r.ranges:
        doc.text(ranges_text(r.ranges))
    header = ["metric", "stat", "measured", "simulated", "error", "noise floor"]
    doc.table(header + (["90% interval", "measured inside"] if r.ranges else []), error_rows(r))
    doc.text(step_level_text(r.step_level))
    for line in (describe_beyond(r.beyond_fitted), describe_speed(r.speed_probe_ms, r.profile_speed_probe_ms)):
        if line:   # validation.md's warnings: extrapolated steps, the machine's drift against the profile
            doc.text(line[0].upper() + line[1:])
    if r.step_split:
        doc.table(["part of the step", "predicted ms over the measured steps", "share"], split_rows(r.step_split))
    matched = r.step_matched
    if matched:
        note = STEP_MATCHED_NOTE.format(scale=matched.scale)
        doc.text(note[0].upper() + note[1:])
        doc.table(["metric", "p50", "p90", "p99"], step_matched_rows(matched))
    runs = {"measured": v.measured_requests, "simulated": v.simulated_requests}
    if any(frame is not None for frame in runs.values()):
        add_latency_cdfs(doc, name, runs, v.replica_quantiles, "measured vs simulated")
    steps = v.step_predictions
    if steps is not None and len(steps) and {"measured_ms", "predicted_ms"} <= set(steps.columns):
        title = f"{name}: step time ({len(steps)} steps, MAPE {_pct(r.step_level.mape, signed=False)})"
        doc.image(Image(f"{name}_step_time.png", step_scatter(steps["measured_ms"], steps["predicted_ms"], title),
                        f"{name}: predicted vs measured step time"))


def add_latency_cdfs(doc: Document, name: str, runs: dict, replica_quantiles, what: str) -> None:
    """The CDFs of TTFT, TPOT and E2E of `runs`, with the replications' 90% band where their quantiles exist."""
    bands = None
    caption = f"{name}: CDFs of TTFT, TPOT and E2E, {what}"
    if replica_quantiles is not None:
        bands = cdf_bands(replica_quantiles)
        if bands:
            count = next(iter(bands.values())).num_replications
            caption += f", with the 90% band of {count} simulated replications"
    doc.image(Image(f"{name}_latency_cdf.png", latency_cdfs(runs, f"{name}: {what}", bands), caption))


def add_simulation(doc: Document, s: SimulationInput, name: str) -> None:
    """A simulate output: what ran, each headline statistic of the plain run beside the replications'
    median and 90% interval, and the CDFs with their band."""
    summary, ranges = s.summary, s.summary.get("ranges")
    doc.heading(f"Simulation: {s.path}")
    doc.text(f"trace {summary.get('trace', '?')}, step model {summary.get('step_model', '?')}, scheduler "
             f"{summary.get('scheduler', '?')}: {summary.get('num_requests', '?')} requests, "
             f"{summary.get('num_finished', '?')} finished.")
    for note in s.notes:
        doc.text(f"note: {note}")
    if ranges:
        doc.text(ranges_text(ranges))
        doc.table(["metric", "stat", "plain run", "median of the replications", "90% interval"],
                  simulation_rows(summary, ranges, HEADLINE))
    add_latency_cdfs(doc, name, {"simulated": s.requests}, s.replica_quantiles, "simulated")


def split_rows(split: dict) -> list[list[str]]:
    """The step's parts (experiments.validation.split), and the front end per request beside them."""
    names = {"kernels": "kernels", "elementwise": "element-wise", "host": "host",
             "whole_step": "whole steps (all parts, fitted to measured steps)"}
    rows = [[names[part], _num(ms), _pct(split["share"][part], signed=False)] for part, ms in split["total_ms"].items()]
    if split.get("base_scale"):
        rows.append(["the base's times, scaled by calibration (in the parts above)", f"x {split['base_scale']:.3f}", "-"])
    front = split.get("front_end_ms_per_request")
    if front:
        rows.append(["front end (per request, TTFT and E2E; not step time)", f"{_num(front)} per request", "-"])
    return rows


def error_rows(record: ValidationRecord) -> list[list[str]]:
    """One row per metric and statistic, and throughput; with ranges, each cell's interval and whether the
    measured value lies inside it."""
    cells = [(metric, stat, cell) for metric, stats in record.metrics.items() for stat, cell in stats.items()]
    cells.append(("throughput_rps", "", record.throughput_rps))
    return [[metric, stat, _num(cell.measured), _num(cell.simulated), _pct(cell.error),
             _pct(cell.noise_floor, signed=False)]
            + (interval_cells(record.ranges, metric, stat, cell.measured) if record.ranges else [])
            for metric, stat, cell in cells]


def step_level_text(s: StepLevelError) -> str:
    if s.mape is None:
        return "Step level: no measured step log (e.g. an imported vLLM bench), so no step-level error."
    return (f"Step level: MAPE {_pct(s.mape, signed=False)}, P90 APE {_pct(s.p90_ape, signed=False)}, "
            f"max APE {_pct(s.max_ape, signed=False)} over {s.num_steps} measured steps; "
            f"total step time {_pct(s.total_error)} "
            f"(mean measured {_num(s.mean_measured_ms)} ms, predicted {_num(s.mean_predicted_ms)} ms).")


def add_tables(doc: Document, t: TablesInput, name: str) -> None:
    doc.heading(f"Cost model: {t.path}")
    for note in t.notes:
        doc.text(f"note: {note}")
    header, rows, texts = heldout_table(t.meta.to_dict())
    if rows:
        doc.text("Held-out errors of the cost model (from meta.json):")
        doc.table(header, rows)
    else:
        doc.text("meta.json records no held-out errors.")
    for text in texts:
        doc.text(text)
    if t.model is not None:
        doc.image(Image(f"{name}_heatmap.png", heatmap_png(t.model, f"{name}: T_step, pure decode"),
                        f"{name}: T_step over batch size and KV length (pure decode)"))


def heldout_table(meta: dict) -> tuple[list[str], list[list[str]], list[str]]:
    """The entries of meta.json under keys that name held-out data or errors, as a table: one row per
    dotted path to a group of numbers, one column per number's name (e.g. row `held_out_errors.gemm.random`,
    columns mape, p90_ape); strings (notes on units) come back apart. The table format is another
    helper's, so no particular nesting is assumed. Keys without a value (null: what TableMeta gives a key
    an older file lacks) are left out."""
    groups: dict[str, dict] = {}
    texts = []
    for key, value in meta.items():
        lowered = key.lower()
        if value is None or not any(word in lowered for word in ("heldout", "held_out", "error", "mape")):
            continue
        if isinstance(value, str):
            texts.append(f"{key}: {value}")
            continue
        for path, leaf in _flatten(key, value):
            prefix, _, name = path.rpartition(".")
            groups.setdefault(prefix or path, {})[name if prefix else "value"] = leaf
    columns = list(dict.fromkeys(name for group in groups.values() for name in group))
    rows = [[prefix] + [_value(group.get(c)) for c in columns] for prefix, group in groups.items()]
    return ["held-out"] + columns, rows[:MAX_META_ROWS], texts


def _flatten(prefix: str, value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(f"{prefix}.{k}", v)
    else:
        yield prefix, value


def heatmap_png(model, title: str) -> bytes:
    return decode_heatmap(decode_grid_ms(model), title)


def mlflow_client(run_id: str, tracking_uri: str | None = None):
    """A client for an existing MLflow run (checked first, so a wrong id fails before any work)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    _require_existing_store(tracking_uri)
    from mlflow.exceptions import MlflowException  # lazy: loads mlflow
    from mlflow.tracking import MlflowClient  # lazy: loads mlflow
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        client.get_run(run_id)
    except MlflowException as exc:
        raise InputError(f"--mlflow-run-id {run_id}: no such run at {tracking_uri or 'the default tracking URI'} "
                         f"({str(exc).splitlines()[0]})") from None
    return client


def _require_existing_store(tracking_uri: str | None) -> None:
    """MLflow creates a new, empty SQLite store where the URI points at nothing; a run to log a
    report into can only be in an existing one, so say so instead of writing an empty database."""
    if tracking_uri and tracking_uri.startswith("sqlite:///"):
        path = Path(tracking_uri[len("sqlite:///"):])
        if not path.is_file():
            raise InputError(f"--tracking-uri {tracking_uri}: no MLflow store at {path}")


def log_report_to_mlflow(client, run_id: str, out: str | Path, files: list[str]) -> None:
    """Log the report's files as artifacts (under report/) of the run."""
    for name in files:
        client.log_artifact(run_id, str(Path(out) / name), artifact_path="report")


def _unique_names(paths: list[Path]) -> dict[Path, str]:
    """A short file-name-safe name per directory: the last two components of its path (parent_name),
    or as many more as it takes to tell it from every other directory (.../tables/continuous/load_30
    and .../calibrated/continuous/load_30 are tables_continuous_load_30 and calibrated_continuous_load_30);
    numbered only when the names still agree."""
    parts = {path: path.resolve().parts for path in paths}

    def depth(mine: tuple) -> int:
        others = {p for p in parts.values() if p != mine}
        return next((d for d in range(2, len(mine)) if all(o[-d:] != mine[-d:] for o in others)), len(mine))
    names: dict[Path, str] = {}
    for path, mine in parts.items():
        base = _slug("_".join(mine[-depth(mine):]))
        name, k = base, 2
        while name in names.values():
            name, k = f"{base}_{k}", k + 1
        names[path] = name
    return names


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"


def _error(record: ValidationRecord, metric: str, stat: str) -> float | None:
    cell = record.metrics.get(metric, {}).get(stat)    # a validation.json of another version may lack one
    return None if cell is None else cell.error


def _num(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(value, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f}%" if signed else f"{100 * value:.1f}%"


def _value(value) -> str:
    if isinstance(value, float):
        return "-" if not np.isfinite(value) else f"{value:.4g}"
    return "-" if value is None else str(value)
