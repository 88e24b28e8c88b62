"""A local Ray cluster of 2 CPUs for the tests that compare Ray with the local pool, started once per
session; the tests skip where ray is not installed or cannot start here. Import the fixture by name:
`from tests.experiments.ray_cluster import ray_cluster  # noqa: F401`."""
import importlib.util
import os
import sys

import pytest

from tests.conftest import REPO_ROOT

HAS_RAY = importlib.util.find_spec("ray") is not None


@pytest.fixture(scope="session")
def ray_cluster():
    if not HAS_RAY:
        pytest.skip("needs ray (pip install 'stepcal[ray]')")
    import ray
    if ray.is_initialized():   # each test module that imports the fixture has its own: the first one starts Ray
        yield ray
        return
    # Ray's workers import the tasks' functions by module name, the tests' helpers too (pytest imports a
    # test module by its own name, from the directory it put on sys.path): give them the driver's path
    path = os.pathsep.join(dict.fromkeys([str(REPO_ROOT), *(p for p in sys.path if p and os.path.isdir(p))]))
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
    except Exception as error:   # e.g. a sandbox without the shared memory or ports Ray needs
        pytest.skip(f"ray cannot start a local cluster here: {error}")
    yield ray
    ray.shutdown()
