"""Where independent tasks run: this process, a local process pool, or Ray tasks.

A task is `function(task, shared)`: `shared` (a sweep's loaded trace and step models, a simulation's
trace, step model and settings) goes to each worker once, and only the small `task` travels with each
call. `function` must be a module-level function (pool workers and Ray import it by name). Every
backend yields `(index, result)` as tasks finish, in whatever order they finish; `ordered` puts them
back in the order of the tasks, so callers get the same results whichever backend ran them.

    with open_runner(run_point, context, backend="ray", workers=4) as runner:
        for index, row in runner.as_completed(points):
            ...

Ray is imported only when the ray backend is chosen.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from stepcal.core.errors import InputError

BACKENDS = ("local", "ray")
# spawn: a worker inherits nothing but what it is sent; fork: a worker starts as a copy-on-write copy of
# this process (imports and loaded data shared with it, for free, until either side writes to them)
START_METHODS = ("spawn", "fork")

_worker: tuple[Callable, object] | None = None    # (function, shared), set once in each pool worker


class InlineRunner:
    """Runs each task in this process, one after the other."""

    def __init__(self, function: Callable, shared) -> None:
        self.function, self.shared = function, shared

    def as_completed(self, tasks: Sequence) -> Iterator[tuple[int, object]]:
        for index, task in enumerate(tasks):
            yield index, self.function(task, self.shared)

    def close(self) -> None:
        pass


class PoolRunner:
    """A pool of `workers` local processes that each receive `shared` once, when they start."""

    def __init__(self, function: Callable, shared, workers: int, start_method: str = "spawn") -> None:
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(start_method),
                                         initializer=_init_worker, initargs=(function, shared))

    def as_completed(self, tasks: Sequence) -> Iterator[tuple[int, object]]:
        futures = {self._pool.submit(_call_in_worker, task): index for index, task in enumerate(tasks)}
        for future in as_completed(futures):
            yield futures[future], future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)   # on an interrupt, queued tasks are dropped


def _init_worker(function: Callable, shared) -> None:
    global _worker
    _worker = (function, shared)


def _call_in_worker(task):
    function, shared = _worker
    return function(task, shared)


class RayRunner:
    """One Ray task per task. `address` joins a running cluster (whose nodes have stepcal installed);
    without it a local cluster of `workers` CPUs is started here and stopped by close()."""

    def __init__(self, function: Callable, shared, workers: int, address: str | None = None) -> None:
        try:
            import ray  # lazy: loads ray
        except ImportError:
            raise InputError("--backend ray needs Ray: pip install 'stepcal[ray]'") from None
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        self._remote = ray.remote(num_cpus=1, max_retries=2)(function)
        self._shared_ref = ray.put(shared)   # shipped to each node once, not once per task

    def as_completed(self, tasks: Sequence) -> Iterator[tuple[int, object]]:
        ray = self._ray
        pending = {self._remote.remote(task, self._shared_ref): index for index, task in enumerate(tasks)}
        # Tasks left pending by an error or an interrupt are not cancelled: ray.cancel racing a task's
        # completion aborts the driver (Ray 2.60: "Tried to complete task that was not pending", seen in
        # CI). A local cluster is stopped by close() anyway; on a joined one they finish, unread.
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError as error:
                    if isinstance(error.cause, InputError):   # one line for the person, as in this process
                        raise error.cause from None
                    raise
                yield pending.pop(ref), result

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


class open_runner:
    """The runner of `backend` as a context manager (closed on exit, also on an error or an interrupt):
    local with `workers` 1 runs in this process, more in a pool (`start_method`); ray in Ray tasks."""

    def __init__(self, function: Callable, shared, *, backend: str = "local", workers: int = 1,
                 address: str | None = None, start_method: str = "spawn") -> None:
        if backend not in BACKENDS:
            raise InputError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if workers < 1:
            raise InputError(f"--workers must be at least 1, got {workers}")
        if address and backend != "ray":
            raise InputError("--ray-address needs --backend ray")
        self._args = (function, shared, backend, workers, address, start_method)
        self.runner = None

    def __enter__(self):
        function, shared, backend, workers, address, start_method = self._args
        start_method = usable_start_method(start_method) if backend == "local" and workers > 1 else start_method
        if backend == "ray":
            self.runner = RayRunner(function, shared, workers, address)
        elif workers > 1 and start_method is not None:
            self.runner = PoolRunner(function, shared, workers, start_method)
        else:
            self.runner = InlineRunner(function, shared)
        return self.runner

    def __exit__(self, *exc) -> None:
        self.runner.close()


def usable_start_method(start_method: str) -> str | None:
    """`start_method`, unless spawned workers could not start here: a spawned worker re-runs this
    program's __main__ from its file, and a program read from standard input (`python -`) has none
    (its __file__ is '<stdin>'): the worker dies and the pool waits for ever. Then fork, which copies
    this process instead, where the platform has it; else None (run in this process)."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if start_method != "spawn" or main_file is None or os.path.exists(main_file):
        return start_method
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else None


def ordered(results: Iterator[tuple[int, object]], num_tasks: int, on_each: Callable[[], None] | None = None) -> list:
    """The results of `as_completed` in the order of their tasks; `on_each()` after each one finishes
    (a progress bar's step)."""
    by_index: list = [None] * num_tasks
    for index, result in results:
        by_index[index] = result
        if on_each is not None:
            on_each()
    return by_index
