"""Replications of a simulation (ranges, issue 17) where the experiments need more than the summaries that
simulator.ranges.replicate returns: a replication's request log (each SLO of a sweep, the latency quantiles
behind the report's CDF bands), or one trace at many rates (capacity).

A replication is simulator.ranges.run_replication (what replicate runs, keeping the whole result): the
step model's error per term, the scatter and the front end drawn from its seed. A `ReplicaPool` holds what does not depend on the draw (the trace, the loaded step
model, the settings) once per worker process; a task ships only (seed, rate) and brings back what a
top-level function `keep(result)` keeps of the replication.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.ranges import run_replication

CDF_QUANTILES = np.round(np.linspace(0.0, 1.0, 101), 2)   # where each replication's latency CDF is kept
CDF_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")            # the report's CDF panels


def keep_summary(result) -> dict:
    return result.summary


def keep_summary_and_quantiles(result) -> tuple[dict, dict[str, list[float]]]:
    """The summary and, per CDF metric, the finished requests' latency at CDF_QUANTILES (None: no value)."""
    finished = result.requests["finish_s"].notna().to_numpy()
    quantiles = {}
    for metric in CDF_METRICS:
        values = result.requests[metric].to_numpy(dtype=np.float64)[finished]
        values = values[np.isfinite(values)]
        quantiles[metric] = (np.quantile(values, CDF_QUANTILES).tolist() if len(values)
                             else [None] * len(CDF_QUANTILES))
    return result.summary, quantiles


@dataclass(frozen=True)
class Shared:
    """What every replication of a run shares: the base trace (rescaled per task when a rate is given),
    the loaded step model and the simulation settings (with the scatter)."""
    trace: object
    model: object
    config: object


_shared: Shared | None = None    # set once in each pool worker


def _init_worker(shared: Shared) -> None:
    global _shared
    _shared = shared


def _run_task(keep: Callable, seed: int, rate_rps: float | None, shared: Shared | None = None):
    from simulator.workload import rescale_rate
    shared = shared or _shared
    trace = shared.trace if rate_rps is None else rescale_rate(shared.trace, rate_rps)
    return keep(run_replication(trace, shared.model, shared.config, seed))


class ReplicaPool:
    """Runs replications in this process (workers 1) or in a pool of spawned processes that each receive
    the Shared part once. Use as a context manager; `map` keeps the order of its tasks."""

    def __init__(self, trace, model, config, workers: int = 1) -> None:
        self.shared = Shared(trace, model, config)
        self.workers = workers
        self._pool = None
        self.num_simulations = 0

    def __enter__(self) -> ReplicaPool:
        if self.workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(self.shared,))
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def map(self, keep: Callable, seeds: Sequence[int], rate_rps: float | None = None) -> list:
        """keep(replication) for each seed, at `rate_rps` (None: the trace as it is)."""
        self.num_simulations += len(seeds)
        if self._pool is None:
            return [_run_task(keep, seed, rate_rps, self.shared) for seed in seeds]
        futures = [self._pool.submit(_run_task, keep, seed, rate_rps) for seed in seeds]
        return [future.result() for future in futures]


def quantile_frame(seeds: Sequence[int], quantiles: Sequence[dict[str, list]]):
    """Long table of the replications' latency quantiles: replication, seed, metric, quantile, value_ms."""
    import pandas as pd
    rows = [(i, seed, metric, float(q), value)
            for i, (seed, by_metric) in enumerate(zip(seeds, quantiles))
            for metric, values in by_metric.items() for q, value in zip(CDF_QUANTILES, values)]
    frame = pd.DataFrame(rows, columns=["replication", "seed", "metric", "quantile", "value_ms"])
    return frame.astype({"replication": "int64", "seed": "int64", "value_ms": "float64"})
