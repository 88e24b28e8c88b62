"""Fixtures of the profiler tests: one torch thread, so timings and tests behave on a busy 2-core box."""
import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    from stepcal.profiler.timing import torch_threads
    with torch_threads(1):
        yield
