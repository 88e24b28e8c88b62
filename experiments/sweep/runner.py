"""One point of a sweep: simulate and flatten the summary into a row. Runs in any worker process."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass

from experiments.sweep.config import Slo, SweepConfig, SweepPoint
from simulator.measured_run import METRICS, STATS, RunStats

SUMMARY_SCALARS = ("num_requests", "num_finished", "duration_s", "throughput_rps", "output_tokens_per_s",
                   "num_preemptions", "num_steps")
WALL_COLUMN = "sim_wall_s"   # the one column that differs between runs of the same point


@dataclass(frozen=True)
class SweepContext:
    """What every worker needs, shipped once per worker: the base trace and the step models, loaded."""
    trace: object                 # simulator.trace.Trace, cut but not rescaled
    step_models: dict             # spec -> StepTimeModel
    block_size: int
    kv_blocks: int | None
    router: str
    step_overhead_ms: float
    slos: tuple[Slo, ...]


def build_context(config: SweepConfig) -> SweepContext:
    from experiments.step_models import resolve_step_model
    from simulator.workload import load_workload
    trace = load_workload(config.trace, trace_format=config.trace_format, num_requests=config.num_requests,
                          duration_s=config.duration_s, seed=config.seed, arg_name=f"{config.path}: trace")
    models = {spec: resolve_step_model(spec) for spec in dict.fromkeys(p.step_model for p in config.points)}
    return SweepContext(trace, models, config.block_size, config.kv_blocks, config.router, config.step_overhead_ms,
                        config.slos)


def point_key(point: SweepPoint, config: SweepConfig) -> str:
    """A name for the point's stored result; it changes when anything the result depends on changes."""
    identity = {**asdict(point), "shared": config.shared()}
    identity.pop("index")
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def run_point(point: SweepPoint, context: SweepContext) -> dict:
    """Simulate one point; the row holds the point's settings, the summary and each SLO's attainment."""
    import numpy as np

    from experiments.step_models import front_end
    from simulator.metrics import slo_summary
    from simulator.schedulers import SchedulerConfig
    from simulator.simulation import SimConfig, Simulation
    from simulator.workload import mean_rate_rps, rescale_rate

    trace = context.trace if point.rate_rps is None else rescale_rate(context.trace, point.rate_rps)
    defaults = SchedulerConfig()
    scheduler_config = SchedulerConfig(max_num_seqs=point.max_num_seqs or defaults.max_num_seqs,
                                       max_num_batched_tokens=point.max_batched_tokens,
                                       chunk_size=point.chunk_size or defaults.chunk_size)
    config = SimConfig(scheduler=point.scheduler, scheduler_config=scheduler_config, block_size=context.block_size,
                       kv_blocks=context.kv_blocks, num_replicas=point.num_replicas, router=context.router,
                       step_overhead_ms=context.step_overhead_ms, record_batches=False,
                       front_end=front_end(context.step_models[point.step_model]))
    wall0 = time.perf_counter()
    result = Simulation(trace, context.step_models[point.step_model], config).run()
    row = {**asdict(point), "rate_rps": point.rate_rps if point.rate_rps is not None else mean_rate_rps(trace)}
    summary = result.summary
    row.update({name: summary[name] for name in SUMMARY_SCALARS})
    stats = RunStats.from_summary(summary)
    for name in METRICS:
        row.update({f"{name}_{stat}": stats.stat(name, stat) for stat in STATS})
    finished = result.requests["finish_s"].notna().to_numpy()
    for slo in context.slos:
        s = slo_summary(result.requests, finished, summary["duration_s"], slo.ttft_ms, slo.tpot_ms)
        row[f"slo_{slo.name}_attainment"] = s["slo_attainment"]
        row[f"slo_{slo.name}_goodput_rps"] = s["goodput_rps"]
    row[WALL_COLUMN] = time.perf_counter() - wall0
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}
