"""calibrate reads the step terms off a run's step log where it has one, and searches only the
request path on its request log."""
from __future__ import annotations

import json

import pytest

from stepcal.experiments.calibration import calibrate
from stepcal.experiments.calibration.step_log_terms import MIN_STEPS, step_log_terms
from stepcal.experiments.cli import main
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel
from tests.experiments.test_calibrate import synthetic_run

BASE = LinearStepModel(1.0, 0.02, 0.0005)
TRUTH = HostTerms(per_step_ms=0.45, per_seq_ms=0.03, per_token_ms=0.008, per_request_ms=2.0)
SHAPE = "prompt=lognormal:128:0.8,output=lognormal:32:0.8"


def _logged_run(rate: float, seed: int, terms: HostTerms = TRUTH, scatter: Scatter | None = None):
    """A run simulated with `terms` on BASE, its step log holding every batch's shape."""
    from dataclasses import replace

    from stepcal.core.workload import load_workload
    from stepcal.simulator.simulation import SimConfig, simulate
    trace = load_workload(f"poisson:rate={rate},n=200,{SHAPE}", seed=seed)
    run = synthetic_run(trace, HostTermsModel(BASE, terms), front_end_seed=5, scatter=scatter)
    config = SimConfig(scheduler="vllm", front_end=terms.front_end, front_end_seed=5, scatter=scatter,
                       scatter_seed=5, record_batches=True)
    return replace(run, steps=simulate(trace, HostTermsModel(BASE, terms), config).steps)


def test_the_step_log_gives_the_true_step_terms_within_their_standard_errors():
    """Steps timed with a 5% AR(1) scatter: the regression finds each term within three of its
    clustered standard errors, and prices the logged total as measured."""
    run = _logged_run(20, seed=1, scatter=Scatter(cv=0.05, rho=0.5))
    found = step_log_terms(run, BASE)
    assert found is not None and found.num_steps == len(run.steps) >= MIN_STEPS
    for name in ("per_step_ms", "per_seq_ms", "per_token_ms"):
        err = found.std_err[name]
        assert err is not None and err > 0, name
        assert abs(found.terms[name] - getattr(TRUTH, name)) < 3 * err, (name, found.terms[name], err)
    assert found.total_error_before < -0.2 and abs(found.total_error_after) < 0.01
    # a held term stays out of the regression, its standard error and its covariance
    held = step_log_terms(run, BASE, held=("per_seq_ms",))
    assert "per_seq_ms" not in held.terms and "per_seq_ms" not in held.std_err


def test_a_log_without_batch_shapes_or_too_short_is_not_regressed():
    from dataclasses import replace
    run = _logged_run(20, seed=1)
    assert step_log_terms(replace(run, steps=run.steps.drop(columns="q_lens")), BASE) is None
    assert step_log_terms(replace(run, steps=run.steps.head(MIN_STEPS - 1)), BASE) is None
    assert step_log_terms(replace(run, steps=run.steps.head(MIN_STEPS)), BASE) is not None


def test_step_terms_from_the_log_carry_to_three_times_the_load():
    """The scenario the request search needs three restarts for (test_calibrate's
    test_per_sequence_and_per_token_time_found_at_a_low_load_carries_to_three_times_it): read off
    the log, the step terms are the truth's, the request search finds the per-request time, and three
    times the load comes out within 5% where that test allows 15%."""
    from stepcal.core.workload import load_workload
    from stepcal.simulator.simulation import SimConfig, simulate
    low = _logged_run(20, seed=1)
    result = calibrate(low, BASE, max_simulations=60, uncertainty=False)
    assert result.to_dict()["step_terms_from"] == "step log"
    for name in ("per_step_ms", "per_seq_ms", "per_token_ms"):
        assert getattr(result.terms, name) == pytest.approx(getattr(TRUTH, name), rel=0.02), name
    assert result.terms.per_request_ms == pytest.approx(TRUTH.per_request_ms, rel=0.2)
    high = load_workload(f"poisson:rate=60,n=200,{SHAPE}", seed=2)
    config = SimConfig(scheduler="vllm", record_batches=False)
    true, fitted = (simulate(high, HostTermsModel(BASE, t), config).summary for t in (TRUTH, result.terms))
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        for stat in ("p50", "p90"):
            assert fitted[metric][stat] == pytest.approx(true[metric][stat], rel=0.05), (metric, stat)


def test_without_the_log_the_request_search_prices_the_step_terms():
    run = _logged_run(20, seed=1)
    result = calibrate(run, BASE, max_simulations=30, uncertainty=False, step_log=False)
    assert result.step_log == {} and result.to_dict()["step_terms_from"] == "request log"


def test_the_log_s_terms_get_the_request_fit_s_errors_and_keep_their_own():
    """What --ranges draws is sized as for the request search (the sandwich over every term, on the
    request statistics): the regression's clustered errors, kept in the step_log record, count only
    the log's scatter about its line."""
    run = _logged_run(20, seed=1, scatter=Scatter(cv=0.05, rho=0.5))
    result = calibrate(run, BASE, max_simulations=30)
    names = result.covariance["names"]
    assert names[:3] == ["per_step_ms", "per_seq_ms", "per_token_ms"] and "per_request_ms" in names
    matrix = result.covariance["matrix"]
    for i, name in enumerate(names):
        assert matrix[i][i] == pytest.approx(result.std_err[name] ** 2, rel=1e-9), name
    own = result.to_dict()["step_log"]["std_err"]
    assert set(own) == {"per_step_ms", "per_seq_ms", "per_token_ms"}
    assert all(own[name] < result.std_err[name] for name in own)   # the request statistics pin them less


def test_calibrate_cli_reads_a_measured_run_s_step_log(measured, tmp_path, capsys):
    """The engine's own run: its step log prices the step terms; --no-step-log searches them instead."""
    out, searched = tmp_path / "cal", tmp_path / "searched"
    assert main(["calibrate", "--measured", str(measured.path), "--step-model", "const:1",
                 "--max-simulations", "30", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"step terms from the step log: {len(measured.steps)} steps" in printed
    calibration = json.loads((out / "meta.json").read_text())["calibration"]
    assert calibration["step_terms_from"] == "step log" and calibration["step_log"]["num_steps"] == len(measured.steps)
    assert main(["calibrate", "--measured", str(measured.path), "--step-model", "const:1",
                 "--max-simulations", "30", "--no-step-log", "--quiet", "--out", str(searched)]) == 0
    calibration = json.loads((searched / "meta.json").read_text())["calibration"]
    assert calibration["step_terms_from"] == "request log" and calibration["step_log"] == {}


def test_a_base_too_slow_for_the_log_is_scaled_to_its_total_with_no_step_term():
    """The truth runs at 80% of BASE's times (a profile taken at a slower clock): terms only add time,
    so the regression's constant would go below zero; the base is scaled to the log's total instead."""
    run = _logged_run(20, seed=1, terms=HostTerms(base_scale=0.8, per_request_ms=2.0), scatter=Scatter(cv=0.05, rho=0.5))
    found = step_log_terms(run, BASE)
    assert found.total_error_before == pytest.approx(0.25, abs=0.01)
    assert found.base_scale == pytest.approx(0.8, abs=3 * found.base_scale_std_err)
    assert 0 < found.base_scale_std_err < 0.01 and abs(found.total_error_after) < 1e-9
    assert set(found.terms.values()) == {0.0} and found.to_dict()["base_scale"] == found.base_scale
    result = calibrate(run, BASE, max_simulations=60, uncertainty=False)
    assert result.terms.base_scale == found.base_scale and result.terms.per_step_ms == 0.0
    # a base that is too fast is priced with terms, unscaled
    assert step_log_terms(_logged_run(20, seed=1), BASE).base_scale == 1.0
