"""Fixtures of the profiler tests: one torch thread, so timings and tests behave on a busy 2-core box."""
import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    import torch
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
