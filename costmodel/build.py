"""From a FitResult to a T_step table directory (terms, operator grids, regressors, meta)."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from stepcal.core.batch import FEATURE_NAMES
from stepcal.core.errors import InputError
from stepcal.core.io import atomic_write_parquet
from stepcal.core.model_spec import ModelSpec, Parallelism
from stepcal.core.profile_meta import ProfileMeta, is_profile_dir
from stepcal.costmodel.axes import measured_values
from stepcal.costmodel.compose import Axes, additive_term, compose_terms, data_axes, measured_axes, moe_target, op_grids
from stepcal.costmodel.compose_attention import MIXED_DECODE_TARGET, attention_targets
from stepcal.costmodel.compose_comm import DEFAULT_COMPOSITION, Composition, all_reduce_eager_target, all_reduce_target
from stepcal.costmodel.coverage import coverage_notes
from stepcal.costmodel.evaluation import RESIDUAL_QUANTILES, log_residual_quantiles, repeat_cv
from stepcal.costmodel.features import assign_targets
from stepcal.costmodel.fitting import FitResult
from stepcal.costmodel.profile_speed import profile_speed_probes
from stepcal.costmodel.table_meta import TableMeta
from stepcal.costmodel.vidur_keys import STORED_KEYS, profile_keys_at_fit


def build_tables(result: FitResult, directory: Path, *, spec: ModelSpec | None,
                 parallelism: Parallelism, axes: Axes | None = None,
                 extra_meta: dict | None = None, composition: Composition = DEFAULT_COMPOSITION) -> TableMeta:
    """Write the terms, ops.parquet and the regressors into `directory`; return the TableMeta
    (written as meta.json too; the caller may rewrite it with the MLflow run id). `extra_meta`:
    more keys of meta.json (the inputs, the scatter, ...).

    Without a model spec, per-operator regressors are written alone (mode "operators"):
    `stepcal predict` uses them; composing T_step needs the model's layers and widths.

    `axes`: the knots of the terms' grids; by default costmodel.axes.DATA_RULE's, from the data
    (Axes.default() gives the fixed log grid tables had before)."""
    import joblib  # lazy: loads joblib
    directory = Path(directory)
    terms = []
    has_ops = any(t != "step" for t in result.targets)
    composing = has_ops and spec is not None
    if axes is None:
        axes = data_axes(result, spec, parallelism, composition) if composing else Axes.default()
    if composing:
        ops = op_grids(result, spec, parallelism, axes, composition)
        terms = compose_terms(result, spec, parallelism, axes, ops, composition)
        if len(ops):
            atomic_write_parquet(ops, directory / "ops.parquet")
    step = result.targets.get("step")
    if step is not None:
        terms.append(additive_term(result, "step"))
    if not terms and not has_ops:
        raise InputError("nothing to build T_step from: the profiles hold no GEMM, attention, "
                         "overhead or whole-step rows")
    entries = {t.name: t.write(directory) for t in terms}
    # Measured whole steps already hold every cost; composed terms are the fallback.
    t_step_terms = step_terms(result, terms) if step is not None else [t.name for t in terms]
    mode = "step" if step is not None else ("composed" if terms else "operators")
    (directory / "models").mkdir(parents=True, exist_ok=True)
    for target, fit in result.targets.items():
        joblib.dump(fit.estimator, directory / "models" / f"{_safe(target)}.joblib", compress=3)
    extra_meta = dict(extra_meta or {})
    # An importer's notes (what its format holds that the tables leave out) join the build's own.
    notes = _notes(result, spec, parallelism, composition, mode, entries) + list(extra_meta.pop("notes", []))
    meta = {
        "mode": mode,
        "t_step_terms": t_step_terms,
        # "overhead" names the host time: the host op's term stands in for it
        "missing_terms": sorted(expected_terms(spec, parallelism) - set(entries)
                                - ({"overhead"} if "host" in entries else set())) if mode == "composed" else [],
        "terms": entries,
        "term_sources": {name: entry.get("source") or {"source": "data"} for name, entry in entries.items()},
        "axes": axes.to_meta(measured_axes(result, spec, parallelism) if composing else measured_values(result.records)),
        "training_data_hash": result.data_hash,
        "fitted_range": fitted_ranges(result),
        # the machine's speed while the profiles were taken, for validate's drift line (read now, as below)
        "profile_speed_probe_ms": profile_speed_probes(result.records) or None,
        "held_out_errors": {"overall": result.errors,
                            **{t: f.errors for t, f in result.targets.items()}},
        "error_note": "absolute percentage errors in %, on rows held out from fitting; "
                      "hyperparameters were tuned on the random split's training rows",
        "model_error": model_error_meta(result),
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
        "ep": parallelism.ep,
        "composition": _composition_meta(result, spec, parallelism, composition) if mode == "composed" else None,
        "num_layers": spec.num_layers if spec else None,
        "mlflow_run_id": None,
        "provenance": _provenance(result.records),
        # Read now, while the input paths resolve: the Vidur export may run from another directory.
        STORED_KEYS: profile_keys_at_fit(result.records),
        **extra_meta,
    }
    return TableMeta.from_dict(meta).write(directory)


def _notes(result: FitResult, spec: ModelSpec | None, parallelism: Parallelism, composition: Composition,
           mode: str, entries: dict) -> list[str]:
    """meta.json's notes: what composed tables leave out (no profile and no datasheet for a term), or
    that tables of per-operator regressors alone cannot compose T_step."""
    if mode == "operators":
        return ["per-operator regressors only: fit again with --model-spec to compose T_step"]
    if mode != "composed":   # whole steps were measured: no term is left out
        return []
    notes = coverage_notes(result, spec, parallelism, composition)
    unmodelled = sorted({"elementwise", "sampling"} - set(entries))
    if unmodelled:
        notes.append(f"no {' or '.join(unmodelled)} term: no profile times that work and the profiles name no "
                     f"device with a datasheet for a memory roofline; fit with --device-spec NAME to add it")
    return notes


def _provenance(records) -> dict:
    """When the tables were built, and from which sources, files, devices, dtypes and how many rows."""
    return {
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "sources": sorted(records["source"].unique().tolist()),
        "files": sorted(records["file"].unique().tolist()),
        "devices": sorted(records["device"].dropna().astype(str).unique().tolist()),
        "dtypes": sorted(records["dtype"].dropna().unique().tolist()),
        "rows": int(len(records)),
    }


def step_terms(result: FitResult, terms: list) -> list[str]:
    """T_step of a whole-step fit: the step alone where engine step logs trained it (their steps
    hold the host time), step + host where only the profiler's `step` op did (it times the device
    part of an iteration, the `host` op the rest)."""
    records = result.records
    from_logs = ((records["op"] == "step") & (records["name"] == "step_log")).any()
    has_host = any(t.name == "host" for t in terms)
    return ["step", "host"] if has_host and not from_logs else ["step"]


def expected_terms(spec: ModelSpec, parallelism: Parallelism) -> set[str]:
    """The terms a composed T_step of this model should have."""
    terms = {"linear", "elementwise", "lm_head", "sampling", "decode_attn", "prefill_attn", "overhead"}
    if parallelism.tp > 1:
        terms.add("all_reduce")
    if spec.is_moe:
        terms.add("moe")
        if parallelism.ep > 1:
            terms.add("all_to_all")
    return terms


def composed_ops(spec: ModelSpec, parallelism: Parallelism) -> str:
    """The record ops composing this model's T_step reads (what `fit` keeps by default): a whole
    directory of kernel tables also holds other models' kinds (MLA for a GQA model, say)."""
    ops = ["gemm", "elementwise", *attention_targets(spec), "overhead", "host", "step"]
    if not spec.is_mla:
        ops.append(MIXED_DECODE_TARGET)
    if parallelism.tp > 1:
        ops.append("all_reduce")
    if spec.is_moe:
        ops.append("moe")
    return ",".join(ops)


def _composition_meta(result: FitResult, spec: ModelSpec, parallelism: Parallelism,
                      composition: Composition) -> dict:
    """Which regressor each model part came from, and what was assumed rather than measured."""
    decode, prefill = attention_targets(spec)
    meta = {"attention": spec.attention, "decode_target": decode, "prefill_target": prefill}
    graph = all_reduce_target(result) if parallelism.tp > 1 else None
    if graph is not None:
        eager = all_reduce_eager_target(result) if composition.graph_max_tokens is not None else None
        meta["all_reduce"] = {"target": graph, "eager_target": eager,
                              "graph_max_tokens": composition.graph_max_tokens if eager else None}
    if spec.is_moe:
        target = moe_target(result, spec, composition)
        meta.update(moe_target=target, moe_distribution=target and target.split(":", 1)[1],
                    moe_tp=parallelism.moe_tp, ep=parallelism.ep)
        if parallelism.ep > 1:
            meta["all_to_all"] = {"source": "link bandwidth (no measured all-to-all data)",
                                  "link_gbps": composition.ep_link_gbps, "latency_us": composition.ep_latency_us}
    if composition.decode_skew_alpha is not None:
        meta["decode_skew_alpha"] = composition.decode_skew_alpha
    if parallelism.tp > 1 and all_reduce_target(result) is None and composition.tp_link_gbps is not None:
        meta["all_reduce"] = {"source": "ring over a link (no measured all-reduce data)",
                              "link_gbps": composition.tp_link_gbps, "latency_us": composition.tp_latency_us}
    return meta


def _safe(target: str) -> str:
    return target.replace(":", "__")


SHAPE_COLUMNS = ("m", "n", "k", *FEATURE_NAMES)   # what names one profiled point's shape


def model_error_meta(result: FitResult) -> dict:
    """meta.json `model_error`: per target and split (random: points among those fitted;
    extrapolation: beyond them), the held-out rows' log(predicted / measured) at the quantiles
    costmodel.evaluation.RESIDUAL_QUANTILES, the profile's repeat scatter of its points and the share of
    them timed once (whose noise the residuals hold); the speed guard's probes. `--ranges` draws from
    these (experiments.validation.model_error)."""
    targets = assign_targets(result.records).to_numpy()
    by_target = {}
    for name, fit in result.targets.items():
        splits = {split: log_residual_quantiles(*pair) for split, pair in fit.held_out.items()}
        rows = result.records[targets == name]
        by_target[name] = {"splits": {s: q for s, q in splits.items() if q is not None},
                           "repeat_cv": repeat_cv(rows, SHAPE_COLUMNS), "timed_once": timed_once(rows)}
    return {"statistic": "log(predicted / measured) of held-out rows", "quantiles": list(RESIDUAL_QUANTILES),
            "targets": by_target, "speed_probes": guard_probe_spread(result.records)}


def timed_once(rows) -> float | None:
    """The share of a target's rows timed once (equal 10th and 90th percentiles: a served step), whose
    held-out error holds that one timing's noise; None without percentiles (imported profiles)."""
    if not {"time_ms_p10", "time_ms_p90"} <= set(rows.columns) or not len(rows):
        return None
    return round(float((rows["time_ms_p90"] <= rows["time_ms_p10"]).mean()), 4)


def guard_probe_spread(records) -> dict | None:
    """{"n", "log_sd"}: the standard deviation of the log time of the speed guard's probes (one short
    step timed every few seconds through each fitted profile's sweep): how far the machine's speed
    strays from one moment to another, what a run's speed level meets. None without three probes."""
    if not {"source", "file"} <= set(records.columns):
        return None
    probes = []
    for name in sorted(records.loc[records["source"] == "profile", "file"].dropna().astype(str).unique()):
        if is_profile_dir(Path(name).parent):
            for guard in ProfileMeta.read(Path(name).parent).speed_guard:
                values = guard.get("probes_ms") if isinstance(guard, dict) else None
                probes += [float(v) for v in values or () if isinstance(v, (int, float)) and v > 0]
    if len(probes) < 3:
        return None
    return {"n": len(probes), "log_sd": round(float(np.std(np.log(probes), ddof=1)), 5)}


RANGE_FEATURES = ("num_seqs", "num_tokens")   # the batch sizes a whole-step price extrapolates in


def fitted_ranges(result: FitResult) -> dict:
    """{target: {feature: [min, max]}} over the training rows of the whole-step targets (step, host):
    `validate` names the measured steps beyond them, whose prices the fit extrapolated
    (experiments.validation.extrapolated)."""
    records = result.records
    targets = assign_targets(records).to_numpy()
    ranges = {}
    for target in ("step", "host"):
        rows = records[targets == target]
        if target not in result.targets or not len(rows):
            continue
        ranges[target] = {f: [float(rows[f].min()), float(rows[f].max())]
                          for f in RANGE_FEATURES if f in rows and rows[f].notna().any()}
    return ranges
