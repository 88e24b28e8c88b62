"""Where the simulations of a sweep run: this process, a local process pool, or Ray tasks.

Every backend calls `on_result(point, row)` in the driver as each point finishes, in whatever order
they finish; rows do not depend on the backend (each simulation is deterministic).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from experiments.sweep.config import SweepPoint
from experiments.sweep.runner import SweepContext, run_point

BACKENDS = ("local", "ray")
OnResult = Callable[[SweepPoint, dict], None]

_worker_context: SweepContext | None = None   # set once in each pool worker


def run_local(points: Sequence[SweepPoint], context: SweepContext, workers: int, on_result: OnResult) -> None:
    """workers == 1: in this process; more: a pool of that many processes (spawned, so nothing is inherited)."""
    if workers <= 1:
        for point in points:
            on_result(point, run_point(point, context))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_worker, initargs=(context,))
    try:
        futures = {pool.submit(_run_in_worker, point): point for point in points}
        for future in as_completed(futures):
            on_result(futures[future], future.result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)   # on an interrupt, queued points are dropped


def _init_worker(context: SweepContext) -> None:
    global _worker_context
    _worker_context = context


def _run_in_worker(point: SweepPoint) -> dict:
    return run_point(point, _worker_context)


def run_ray(points: Sequence[SweepPoint], context: SweepContext, workers: int, on_result: OnResult,
            address: str | None = None) -> None:
    """One Ray task per point. `address` joins a running cluster (whose nodes have stepcal installed);
    without it a local cluster of `workers` CPUs is started for the run and stopped after it."""
    try:
        import ray
    except ImportError:
        from simulator.errors import InputError
        raise InputError("--backend ray needs Ray: pip install 'stepcal[ray]'") from None
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=2)(run_point)
        context_ref = ray.put(context)   # shipped to each node once, not once per task
        pending = {task.remote(point, context_ref): point for point in points}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                on_result(pending.pop(ref), ray.get(ref))
    finally:
        if started:
            ray.shutdown()
