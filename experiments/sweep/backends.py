"""Where the simulations of a sweep run: this process, a local process pool, or Ray tasks
(experiments.backends: one task per point, the SweepContext shipped to each worker once).

`on_result(point, row)` is called in the driver as each point finishes, in whatever order they finish;
rows do not depend on the backend (each simulation is deterministic).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from stepcal.experiments.backends import BACKENDS, open_runner
from stepcal.experiments.sweep.config import SweepPoint
from stepcal.experiments.sweep.runner import SweepContext, run_point

__all__ = ["BACKENDS", "run_points"]

OnResult = Callable[[SweepPoint, dict], None]


def run_points(points: Sequence[SweepPoint], context: SweepContext, on_result: OnResult, *, backend: str = "local",
               workers: int = 1, address: str | None = None) -> None:
    """local: workers == 1 in this process, more in a pool of spawned processes (nothing inherited);
    ray: one Ray task per point, on the cluster at `address` or on a local one of `workers` CPUs."""
    with open_runner(run_point, context, backend=backend, workers=workers, address=address) as runner:
        for index, row in runner.as_completed(points):
            on_result(points[index], row)
