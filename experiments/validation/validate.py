"""The work of `stepcal validate`: replay a measured run in the simulator and write the comparison."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from stepcal.core.io import atomic_output_dir, atomic_write_bytes, atomic_write_json, atomic_write_parquet
from stepcal.core.measured_run import RunStats
from stepcal.core.metrics import clean_json
from stepcal.core.run_meta import LLMSERVINGSIM, VLLM_BENCH
from stepcal.experiments.replications import RANGES_PERCENTILES
from stepcal.experiments.step_models import front_end, resolve_step_models
from stepcal.experiments.validation.compare import ValidationRecord, compare, step_matched_errors
from stepcal.experiments.validation.coverage import coverage_block
from stepcal.experiments.validation.extrapolated import beyond_fitted
from stepcal.experiments.validation.machine_speed import profile_probes
from stepcal.experiments.validation.measured import load_measured_run, sim_config_for, slowed_repeats
from stepcal.experiments.validation.split import mean_front_end_ms, step_split
from stepcal.experiments.validation.steps import predict_steps, step_level_error, step_noise_floor
from stepcal.experiments.validation.table import format_table
from stepcal.experiments.validation.timeseries import timeseries_block
from stepcal.simulator.simulation import simulate

TIMESERIES_FILE = "timeseries.parquet"    # both sides' running, waiting and KV use at the run's ticks
LIST_COLUMNS = ("request_ids", "q_lens", "kv_lens")   # the batch itself: too big for step_predictions.parquet
# The measured runs served by the engine their scheduler names: imported from `vllm bench` or from
# LLMServingSim's bench, vLLM servers' both. A run of `stepcal measure` was served by the torch
# engine, whose host time is its own.
ENGINE_SERVED_SOURCES = (VLLM_BENCH, LLMSERVINGSIM)


@dataclass(frozen=True)
class Validation:
    record: ValidationRecord
    table: str        # validation.md
    out: Path


def validate_run(measured: str | Path, step_model: str, out: str | Path | None = None,
                 step_overhead_ms: float = 0.0, ranges=None, host_defaults: str | None = None) -> Validation:
    """Simulate the measured run's workload with the same scheduler settings and KV capacity, timing
    each step with `step_model`; write OUT (default MEASURED/validation): validation.json,
    validation.md, simulated_requests.parquet and step_predictions.parquet.
    `ranges(trace, model, config)`, when given, returns the ranges block of replications
    (experiments.replications.replicate_ranges); the record then says how often the measured
    values fall inside the intervals; a block holding `replica_quantiles` (a DataFrame) has it written to
    OUT/ranges_percentiles.parquet. `host_defaults` (--host-defaults: auto, none or an engine) adds an
    engine's published host terms to the step model (experiments.host_defaults); auto adds the
    engine of the run's scheduler for a run that engine served (ENGINE_SERVED_SOURCES), and the
    record's `host_defaults` says what was added."""

    run = load_measured_run(measured)
    served_by = run.meta.scheduler if run.meta.source in ENGINE_SERVED_SOURCES else None
    (model,), added = resolve_step_models([step_model], host_defaults, served_by)
    config = sim_config_for(run, step_overhead_ms, front_end(model))
    # the replications first: their worker processes start before the plain run's logs are held
    block = ranges(run.trace, model, config) if ranges is not None else None
    result = simulate(run.trace, model, config)
    predicted = predict_steps(model, run.steps)
    step_level = step_level_error(model, run.steps, predicted, noise_floor=step_noise_floor(run))
    record = compare(run, result.requests, RunStats.from_summary(clean_json(result.summary)), step_level,
                     step_model=step_model, step_matched=step_matched_errors(run, model, step_level, config))
    front_ms = mean_front_end_ms(front_end(model), run.trace, result.requests, config.front_end_seed)
    record = replace(record, step_split=step_split(model, run.steps, front_ms), slowed_repeats=slowed_repeats(run),
                     beyond_fitted=beyond_fitted(model, run.steps), profile_speed_probe_ms=profile_probes(model),
                     host_defaults=None if added is None else added.to_dict())
    series = timeseries_block(run.path, run.meta.to_dict(), result.steps, result.requests, config.kv_blocks,
                              config.block_size)
    if series is not None:
        record = replace(record, timeseries=series[0])
    quantiles = None
    if block is not None:
        block["coverage"] = coverage_block(run.stats, block["stats"], run.repeat_stats)
        quantiles = block.pop("replica_quantiles", None)   # a table: stored beside validation.json, named in it
        if quantiles is not None:
            block["replica_quantiles_file"] = RANGES_PERCENTILES
        record = replace(record, ranges=block)
    table = format_table(record)
    out = Path(out) if out else Path(measured) / "validation"
    with atomic_output_dir(out) as staging:
        atomic_write_json(staging / "validation.json", record.to_dict())
        atomic_write_bytes(staging / "validation.md", (table + "\n").encode())
        atomic_write_parquet(result.requests, staging / "simulated_requests.parquet")
        steps = run.steps[[c for c in run.steps.columns if c not in LIST_COLUMNS]]
        steps = steps.rename(columns={"duration_ms": "measured_ms"}).assign(predicted_ms=predicted)
        atomic_write_parquet(steps, staging / "step_predictions.parquet")
        if quantiles is not None:
            atomic_write_parquet(quantiles, staging / RANGES_PERCENTILES)
        if series is not None:
            atomic_write_parquet(series[1], staging / TIMESERIES_FILE)
    return Validation(record, table, out)
