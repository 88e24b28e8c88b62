"""Fixtures shared by the experiments tests."""
import pytest

from stepcal.experiments.cli import main

PAIRS_TRACE = "poisson:rate=30,n=30,prompt=uniform:8:60,output=uniform:2:12"


@pytest.fixture(scope="session")
def paired_runs(tmp_path_factory):
    """Measured runs served by the engine, all in one directory: a and b of two repeats (one pair
    each), single of one repeat and four of four (two pairs): the device's run-to-run speed pairs."""
    root = tmp_path_factory.mktemp("paired_runs")
    made = {}
    for name, repeats in (("a", 2), ("b", 2), ("single", 1), ("four", 4)):
        made[name] = root / name
        assert main(["measure", "--trace", PAIRS_TRACE, "--scheduler", "continuous", "--repeats", str(repeats),
                     "--quiet", "--out", str(made[name])]) == 0
    return made


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A continuous-batching run of 40 requests on the engine, loaded (calibration's tests)."""
    from stepcal.experiments.validation.measured import load_measured_run
    out = tmp_path_factory.mktemp("m") / "run"
    assert main(["measure", "--trace", "poisson:rate=30,n=40,prompt=uniform:8:80,output=uniform:2:16",
                 "--scheduler", "continuous", "--quiet", "--out", str(out)]) == 0
    return load_measured_run(out)
