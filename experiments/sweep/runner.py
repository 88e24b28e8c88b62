"""One point of a sweep: simulate and flatten the summary into a row. Runs in any worker process."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from stepcal.core.errors import InputError
from stepcal.core.measured_run import METRICS, STATS, RunStats
from stepcal.core.metrics import slo_summary
from stepcal.core.workload import load_workload, mean_rate_rps, rescale_rate
from stepcal.experiments.step_models import front_end, resolve_step_model
from stepcal.experiments.sweep.config import Slo, SweepConfig, SweepPoint, SweepRanges
from stepcal.simulator.ranges import ranges_block, replication_seeds, run_replication
from stepcal.simulator.request import kv_blocks_needed
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.schedulers import SchedulerConfig
from stepcal.simulator.simulation import SimConfig, Simulation

SUMMARY_SCALARS = ("num_requests", "num_finished", "duration_s", "throughput_rps", "output_tokens_per_s",
                   "num_preemptions", "num_steps")
WALL_COLUMN = "sim_wall_s"   # the one column that differs between runs of the same point (with ranges: all runs)
RANGE_SUFFIXES = ("median", "low", "high")   # with ranges: <column>.median / .low / .high over the replications


@dataclass(frozen=True)
class SweepContext:
    """What every worker needs, shipped once per worker: the base trace and the step models, loaded."""
    trace: object                 # core.trace.Trace, cut but not rescaled
    step_models: dict             # (spec, host-defaults engine or None) -> StepTimeModel
    block_size: int
    kv_blocks: int | None
    router: str
    step_overhead_ms: float
    slos: tuple[Slo, ...]
    ranges: SweepRanges | None = None


def build_context(config: SweepConfig) -> SweepContext:
    trace = load_workload(config.trace, trace_format=config.trace_format, num_requests=config.num_requests,
                          duration_s=config.duration_s, seed=config.seed, arg_name=f"{config.path}: trace")
    _check_kv_cache_holds(config, trace)
    # each step model with each engine's published host terms (experiments.host_defaults), once
    models = {key: resolve_step_model(*key) for key in dict.fromkeys((p.step_model, p.host_defaults)
                                                                     for p in config.points)}
    return SweepContext(trace, models, config.block_size, config.kv_blocks, config.router, config.step_overhead_ms,
                        config.slos, config.ranges)


def _check_kv_cache_holds(config: SweepConfig, trace) -> None:
    """Every request fits a cache of kv_blocks blocks (the simulator's check, named by the config's keys:
    a sweep has no --skip-oversize). Rates rescale arrivals only, so one check holds for every point."""
    if config.kv_blocks is None or len(trace) == 0:
        return
    need = kv_blocks_needed(trace, config.block_size)
    row = int(need.argmax())
    if need[row] > config.kv_blocks:
        raise InputError(f"{config.path}: kv_blocks = {config.kv_blocks} blocks of block_size = {config.block_size} "
                         f"tokens cannot hold request {int(trace.request_id[row])} (row {row}) of the trace, which "
                         f"needs {int(need[row])}; raise kv_blocks")


def point_key(point: SweepPoint, config: SweepConfig) -> str:
    """A name for the point's stored result; it changes when anything the result depends on changes.
    A point without host defaults is named as before they were an axis, so that stored sweeps resume."""
    identity = {**asdict(point), "shared": config.shared()}
    identity.pop("index")
    if identity["host_defaults"] is None:
        identity.pop("host_defaults")
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def run_point(point: SweepPoint, context: SweepContext) -> dict:
    """Simulate one point; the row holds the point's settings, the summary and each SLO's attainment, and
    with ranges each of those figures' median and 90% interval over the replications."""


    trace = context.trace if point.rate_rps is None else rescale_rate(context.trace, point.rate_rps)
    defaults = SchedulerConfig()
    scheduler_config = SchedulerConfig(max_num_seqs=point.max_num_seqs or defaults.max_num_seqs,
                                       max_num_batched_tokens=point.max_batched_tokens,
                                       chunk_size=point.chunk_size or defaults.chunk_size)
    model = context.step_models[(point.step_model, point.host_defaults)]
    config = SimConfig(scheduler=point.scheduler, scheduler_config=scheduler_config, block_size=context.block_size,
                       kv_blocks=context.kv_blocks, num_replicas=point.num_replicas, router=context.router,
                       step_overhead_ms=context.step_overhead_ms, record_batches=False,
                       front_end=front_end(model))
    wall0 = time.perf_counter()
    result = Simulation(trace, model, config).run()
    row = {**asdict(point), "rate_rps": point.rate_rps if point.rate_rps is not None else mean_rate_rps(trace)}
    row.update(figure_columns(result, context.slos))
    if context.ranges is not None:
        row.update(range_columns(trace, model, config, context.ranges, context.slos))
    row[WALL_COLUMN] = time.perf_counter() - wall0
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}


def figure_columns(result, slos: tuple[Slo, ...]) -> dict:
    """A run's figure columns: the summary's scalars, each latency statistic, each SLO's attainment and goodput."""
    summary = result.summary
    row = {name: summary[name] for name in SUMMARY_SCALARS}
    stats = RunStats.from_summary(summary)
    for name in METRICS:
        row.update({f"{name}_{stat}": stats.stat(name, stat) for stat in STATS})
    finished = result.requests["finish_s"].notna().to_numpy()
    for slo in slos:
        s = slo_summary(result.requests, finished, summary["duration_s"], slo.ttft_ms, slo.tpot_ms)
        row[f"slo_{slo.name}_attainment"] = s["slo_attainment"]
        row[f"slo_{slo.name}_goodput_rps"] = s["goodput_rps"]
    return row


def range_columns(trace, model, config, ranges: SweepRanges, slos: tuple[Slo, ...]) -> dict:
    """<figure>.median / .low / .high over the point's replications, run one after the other here:
    the sweep's backend already spreads the points over its workers."""

    config = replace(config, scatter=Scatter(ranges.scatter_cv, ranges.scatter_rho, ranges.scatter_run_cv))
    rows = [figure_columns(run_replication(trace, model, config, seed), slos)
            for seed in replication_seeds(ranges.num_replications, ranges.seed)]
    block = ranges_block(rows)
    return {f"{name}.{suffix}": (None if block.get(name) is None else block[name][suffix])
            for name in rows[0] for suffix in RANGE_SUFFIXES}
