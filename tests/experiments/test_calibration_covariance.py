"""calibrate stores the covariance of its terms; --ranges draws them from it."""
import numpy as np
import pytest

from stepcal.experiments.calibration import calibrate
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel, TermUncertainty
from tests.experiments.test_calibrate import synthetic_run


@pytest.fixture(scope="module")
def result():
    from stepcal.core.workload import load_workload
    base = LinearStepModel(2.0, 0.01, 0.0005)
    trace = load_workload("poisson:rate=20,n=150,prompt=uniform:32:256,output=uniform:8:64", seed=4)
    run = synthetic_run(trace, HostTermsModel(base, HostTerms(per_step_ms=1.0, per_seq_ms=0.1)), front_end_seed=5)
    return calibrate(run, base, max_simulations=60)


def test_the_covariance_matches_the_standard_errors(result):
    covariance = result.covariance
    names, matrix = covariance["names"], np.asarray(covariance["matrix"])
    assert names and set(names) <= set(result.std_err)
    assert matrix.shape == (len(names), len(names))
    assert matrix == pytest.approx(matrix.T)
    assert np.sqrt(np.diag(matrix)) == pytest.approx([result.std_err[n] for n in names])
    assert all(result.std_err[n] is not None for n in names)


def test_meta_json_carries_the_covariance_that_ranges_draws(result):
    block = result.to_dict()["uncertainty"]
    assert block["covariance"] == result.covariance
    uncertainty = TermUncertainty(tuple(block["covariance"]["names"]),
                                  tuple(map(tuple, block["covariance"]["matrix"])))
    assert uncertainty.names == tuple(result.covariance["names"])
