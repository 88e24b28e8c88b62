"""experiments.backends: every backend runs function(task, shared) for each task and gives the same results,
put back in the order of the tasks."""
import os

import pytest

from stepcal.core.errors import InputError
from stepcal.experiments.backends import BACKENDS, InlineRunner, open_runner, ordered
from tests.experiments.ray_cluster import ray_cluster  # noqa: F401  (a fixture)


def scaled(task: int, shared: dict) -> tuple[int, int]:
    """What the task computes from the shared part, and the process that ran it."""
    return task * shared["factor"], os.getpid()


def refuse_odd(task: int, shared: dict) -> int:
    if task % 2:
        raise InputError(f"task {task}: odd")
    return task


def run_all(function, tasks, **settings) -> list:
    with open_runner(function, {"factor": 3}, **settings) as runner:
        return ordered(runner.as_completed(tasks), len(tasks))


def test_a_local_pool_gives_the_inline_results_in_task_order_from_other_processes():
    tasks = list(range(12))
    inline = run_all(scaled, tasks)
    pooled = run_all(scaled, tasks, workers=2)
    assert [value for value, _ in pooled] == [value for value, _ in inline] == [3 * t for t in tasks]
    assert {pid for _, pid in inline} == {os.getpid()}
    assert os.getpid() not in {pid for _, pid in pooled}


def test_ordered_calls_back_once_per_finished_task():
    calls = []
    results = ordered(iter([(2, "c"), (0, "a"), (1, "b")]), 3, on_each=lambda: calls.append(1))
    assert results == ["a", "b", "c"] and len(calls) == 3


def test_an_error_in_a_pooled_task_reaches_the_caller_as_itself():
    with pytest.raises(InputError, match="task 1: odd"):
        run_all(refuse_odd, [0, 1, 2], workers=2)


@pytest.mark.parametrize("settings, message", [
    ({"backend": "dask"}, "--backend must be one of local, ray"),
    ({"workers": 0}, "--workers must be at least 1"),
    ({"address": "auto"}, "--ray-address needs --backend ray"),
])
def test_bad_settings_are_refused_by_flag(settings, message):
    with pytest.raises(InputError, match=message):
        open_runner(scaled, {}, **settings)


def test_one_local_worker_runs_inline():
    with open_runner(scaled, {"factor": 1}) as runner:
        assert isinstance(runner, InlineRunner)
    assert BACKENDS == ("local", "ray")


def test_a_program_read_from_stdin_pools_by_fork_instead_of_hanging(tmp_path):
    """`python -` has no file for a spawned worker to re-run: the worker died at start and the pool
    waited for ever. The pool now forks there; the same tasks give the same results."""
    import subprocess
    import sys
    from pathlib import Path
    program = ("from stepcal.experiments.backends import open_runner, ordered, usable_start_method\n"
               "from tests.experiments.test_backends import scaled\n"
               "print(usable_start_method('spawn'))\n"
               "with open_runner(scaled, {'factor': 3}, workers=2) as runner:\n"
               "    print([v for v, _ in ordered(runner.as_completed(list(range(6))), 6)])\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-"], input=program, capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["fork", "[0, 3, 6, 9, 12, 15]"]


def test_a_program_with_a_file_keeps_spawn():
    from stepcal.experiments.backends import usable_start_method
    assert usable_start_method("spawn") == "spawn" and usable_start_method("fork") == "fork"


@pytest.mark.slow   # starting a local Ray cluster takes several seconds
def test_ray_gives_the_local_results_in_task_order_and_one_line_input_errors(ray_cluster, monkeypatch):  # noqa: F811
    tasks = list(range(8))
    on_ray = run_all(scaled, tasks, backend="ray", workers=2)

    def cancel(*args, **kwargs):   # Ray 2.60 aborts the driver when a cancel races the task's completion
        raise AssertionError("tasks left pending after an error must not be cancelled")
    monkeypatch.setattr(ray_cluster, "cancel", cancel)
    with pytest.raises(InputError) as refused:
        run_all(refuse_odd, [0, 3, 4, 6], backend="ray", workers=2)
    assert [value for value, _ in on_ray] == [3 * t for t in tasks]
    assert os.getpid() not in {pid for _, pid in on_ray}
    assert str(refused.value) == "task 3: odd"
    assert ray_cluster.is_initialized()   # a cluster the runner joined is left running
