"""The noise that sizes a calibration's uncertainty: the device's step scatter, not the workload's
variety, scaled up by the fit's misfit."""
import numpy as np
import pytest

from stepcal.experiments.calibration import calibrate
from stepcal.experiments.calibration.uncertainty import _misfit_ratio
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel
from tests.experiments.test_calibrate import two_repeat_run

SCATTER = Scatter(cv=0.08, rho=0.8)


BASE = LinearStepModel(2.0, 0.01, 0.0005)
TRUTH = HostTerms(per_step_ms=1.0, per_request_ms=3.0)


@pytest.fixture(scope="module")
def run():
    from stepcal.core.workload import load_workload
    trace = load_workload("poisson:rate=20,n=200,prompt=uniform:32:256,output=uniform:8:64", seed=4)
    # two repeats of the same requests, each with the device's step scatter drawn from its own seed
    return two_repeat_run(trace, HostTermsModel(BASE, TRUTH), seeds=(11, 12), scatter=SCATTER)[0]


def test_the_device_s_scatter_sizes_the_uncertainty_and_the_truth_lies_within_it(run):
    # 150 simulations, about 7 s: with 60 the search stops short, and the misfit ratio (about 50) says so
    result = calibrate(run, BASE, max_simulations=150, scatter=SCATTER)
    record = result.to_dict()["uncertainty"]
    assert record["noise"] == "scatter" and "step scatter" in record["method"]
    assert record["misfit_ratio"] >= 1.0
    for name in ("per_step_ms", "per_request_ms"):
        err = result.std_err[name]
        assert err is not None and err > 0, name
        assert abs(getattr(result.terms, name) - getattr(TRUTH, name)) < 3 * err, name


def test_the_noise_grows_with_the_scatter_and_shrinks_with_the_repeats(run):
    """The statistics' noise is the scatter's effect on them: about four times the variance for twice
    the cv, and half for the mean of two repeats against one. A run without scatter is bootstrapped."""
    from dataclasses import replace

    from stepcal.experiments.calibration import SUMMARY_OBJECTIVE
    from stepcal.experiments.calibration.objective import _Fit
    from stepcal.experiments.calibration.uncertainty import _noise_covariance

    def variances(scatter, measured):
        fit = _Fit(measured, BASE, scatter)

        def log_stats(terms, seed=0, scattered=False):
            stats = fit.stats(terms, seed, scattered)
            return np.log([stats[k] for k in SUMMARY_OBJECTIVE])
        covariance, source = _noise_covariance(fit, TRUTH, list(SUMMARY_OBJECTIVE), log_stats)
        return np.diag(covariance), source
    small, source = variances(Scatter(cv=0.04, rho=0.8), run)
    large, _ = variances(Scatter(cv=0.08, rho=0.8), run)
    one_repeat, _ = variances(Scatter(cv=0.08, rho=0.8), replace(run, later_requests=(), num_repeats=1))
    assert source == "scatter"
    assert 2.5 < np.median(large / small) < 6.0
    assert one_repeat == pytest.approx(2 * large)
    assert variances(None, run)[1] == "bootstrap"


def test_a_scatter_of_zero_cv_falls_back_to_the_bootstrap(run):
    """A device measured without step scatter has no noise to simulate: the requests are bootstrapped."""
    result = calibrate(run, BASE, max_simulations=20, scatter=Scatter(cv=0.0, rho=0.0))
    assert result.to_dict()["uncertainty"]["noise"] == "bootstrap"


def test_misfit_ratio_scales_only_when_the_residual_exceeds_the_noise():
    noise = np.full(8, 1e-4)
    assert _misfit_ratio(np.full(8, 0.005), noise, 4) == 1.0           # within the noise
    assert _misfit_ratio(np.full(8, 0.03), noise, 4) == pytest.approx(8 * 0.03 ** 2 / 4 / 1e-4)
    assert _misfit_ratio(np.full(4, 0.03), noise[:4], 4) == 1.0        # no degrees of freedom left
    assert _misfit_ratio(np.full(8, 0.03), np.zeros(8), 4) == 1.0      # no noise measured
