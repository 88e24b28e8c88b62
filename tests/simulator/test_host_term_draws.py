"""--ranges draws calibrated host terms from the covariance of their fit (simulator.step_model.TermUncertainty)."""
import json

import numpy as np
import pytest

from stepcal.core.batch import StepBatch
from stepcal.core.errors import InputError
from stepcal.experiments.step_models import resolve_step_model
from stepcal.simulator.ranges import draw_bias, replicate, term_names, with_bias
from stepcal.simulator.simulation import SimConfig, simulate
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel, TermUncertainty
from tests.simulator.factories import random_trace

TERMS = HostTerms(per_step_ms=1.0, per_seq_ms=0.05, per_token_ms=0.002)
# per step and per sequence trade off, as a fit at one load makes them
COVARIANCE = TermUncertainty(("per_step_ms", "per_seq_ms"), ((0.04, -0.003), (-0.003, 0.0004)))


def _model(uncertainty=COVARIANCE) -> HostTermsModel:
    return HostTermsModel(LinearStepModel(2.0, 0.05, 0.001), TERMS, uncertainty)


def test_draws_have_the_fits_covariance():
    z = np.random.default_rng(1).standard_normal((20000, 2))
    draws = np.array([[d["per_step_ms"], d["per_seq_ms"]] for d in map(COVARIANCE.draw, z)])
    assert np.cov(draws.T) == pytest.approx(np.asarray(COVARIANCE.covariance), rel=0.05, abs=2e-5)


def test_host_terms_are_named_after_the_tables_terms_and_drawn_per_replication():
    model = _model()
    assert term_names(model) == ["host:per_step_ms", "host:per_seq_ms"]
    z = draw_bias(model, seed=3)
    drawn = with_bias(model, z)
    expected = COVARIANCE.draw(np.array([z["host:per_step_ms"], z["host:per_seq_ms"]]))
    assert drawn.step_shift_ms == pytest.approx((expected["per_step_ms"], expected["per_seq_ms"], 0.0))
    batch = StepBatch.of([0, 1, 2], [1, 1, 30], [10, 20, 0])
    undrawn = model.step_ms(batch)
    assert drawn.step_ms(batch) == pytest.approx(
        max(undrawn + expected["per_step_ms"] + 3 * expected["per_seq_ms"], 0.05 * undrawn))


def test_step_terms_trade_off_below_zero_but_the_step_is_held_up():
    # per step pushed far below zero, per sequence up: the step keeps the trade, but never falls under
    # 5% of its undrawn time; the front end's delay is clipped at zero on its own
    uncertainty = TermUncertainty(("per_step_ms", "per_seq_ms", "per_request_ms"),
                                  ((1.0, 0.0, 0.0), (0.0, 0.01, 0.0), (0.0, 0.0, 4.0)))
    model = HostTermsModel(LinearStepModel(2.0, 0.05, 0.001), HostTerms(1.0, 0.05, 0.0, per_request_ms=3.0), uncertainty)
    drawn = with_bias(model, {"host:per_step_ms": -1.5, "host:per_seq_ms": 2.0, "host:per_request_ms": -5.0})
    assert drawn.step_shift_ms == pytest.approx((-1.5, 0.2, 0.0))
    assert drawn.terms.per_step_ms == 1.0 and drawn.terms.per_request_ms == 0.0
    small, large = StepBatch.of([0], [1], [10]), StepBatch.of(list(range(20)), [1] * 20, [10] * 20)
    assert drawn.step_ms(small) == pytest.approx(model.step_ms(small) - 1.5 + 0.2)
    assert drawn.step_ms(large) == pytest.approx(model.step_ms(large) - 1.5 + 0.2 * 20)
    sunk = with_bias(model, {"host:per_step_ms": -10.0})
    assert sunk.step_ms(small) == pytest.approx(0.05 * model.step_ms(small))
    features = large.features()
    assert sunk.features_ms(features)[0] == pytest.approx(sunk.step_ms(large))


def test_without_uncertainty_or_spread_the_terms_are_kept():
    for kept in (with_bias(_model(None), {"host:per_step_ms": 2.0}),
                 with_bias(_model(), {"host:per_step_ms": 2.0}, spread_scale=0.0)):
        assert kept.terms == TERMS and not hasattr(kept, "step_shift_ms")
    assert term_names(_model(None)) == []


def test_zero_spread_replications_equal_the_plain_run_and_spread_widens_them():
    trace = random_trace(120, seed=5, rate=6.0, max_prompt=400, max_output=60)
    config = SimConfig(kv_blocks=400, record_batches=False)
    plain = simulate(trace, _model(), config).summary
    assert all(s == plain for s in replicate(trace, _model(), config, 3, seed=2, spread_scale=0.0))
    tpot = [s["tpot_ms"]["p50"] for s in replicate(trace, _model(), config, 6, seed=2)]
    assert max(tpot) > min(tpot)


def test_standard_errors_alone_are_independent_terms():
    u = TermUncertainty.from_std_err({"per_step_ms": 0.2, "per_seq_ms": None, "per_token_ms": 0.001})
    assert u.names == ("per_step_ms", "per_token_ms")
    assert np.asarray(u.covariance) == pytest.approx(np.diag([0.04, 1e-6]))


def _tables(tmp_path, uncertainty: dict):
    meta = {"kind": "builtin", "step_model": "linear:2,0.05,0.001", "host_terms": TERMS.to_dict(),
            "calibration": {"uncertainty": uncertainty}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    return str(tmp_path)


def test_calibrated_tables_carry_their_covariance_or_standard_errors(tmp_path):
    matrix = [list(row) for row in COVARIANCE.covariance]
    model = resolve_step_model(_tables(tmp_path, {"covariance": {"names": list(COVARIANCE.names), "matrix": matrix}}))
    assert model.uncertainty == COVARIANCE
    model = resolve_step_model(_tables(tmp_path, {"std_err": {"per_step_ms": 0.2}}))
    assert model.uncertainty.names == ("per_step_ms",)
    assert resolve_step_model(_tables(tmp_path, {})).uncertainty is None


@pytest.mark.parametrize("covariance", [
    {"names": ["per_step_ms"], "matrix": [[1.0, 0.0]]},
    {"names": ["per_step_ms"], "matrix": [["x"]]},
    {"names": ["bogus"], "matrix": [[1.0]]},
    {"matrix": [[1.0]]},
])
def test_a_bad_covariance_names_the_file(tmp_path, covariance):
    with pytest.raises(InputError, match=r"meta.json: calibration.uncertainty"):
        resolve_step_model(_tables(tmp_path, {"covariance": covariance}))


def test_the_base_scale_multiplies_the_bases_times_before_the_terms_are_added():
    base = LinearStepModel(2.0, 0.05, 0.001)
    model = HostTermsModel(base, HostTerms(per_step_ms=1.0, per_seq_ms=0.05, base_scale=0.5))
    batch = StepBatch.of([0, 1, 2], [1, 1, 30], [10, 20, 0])
    assert model.step_ms(batch) == pytest.approx(0.5 * base.step_ms(batch) + 1.0 + 3 * 0.05)
    kv = np.array([10, 200])
    assert model.decode_run_ms(kv, 3) == pytest.approx(0.5 * np.asarray(base.decode_run_ms(kv, 3)) + 1.0 + 2 * 0.05)
    assert HostTerms.from_dict({"per_step_ms": 1.0}).base_scale == 1.0   # a meta.json from before the scale
    with pytest.raises(InputError, match="base_scale must be > 0, got 0"):
        HostTerms(base_scale=0)
    with pytest.raises(InputError, match="base_scale must be a finite number >= 0"):
        HostTerms(base_scale=float("inf"))


def test_a_drawn_base_scale_moves_with_its_error_and_is_held_up():
    uncertainty = TermUncertainty(("base_scale", "per_request_ms"), ((0.0004, 0.0), (0.0, 1.0)))
    model = HostTermsModel(LinearStepModel(2.0, 0.05, 0.001), HostTerms(per_request_ms=3.0, base_scale=0.8), uncertainty)
    assert term_names(model) == ["host:base_scale", "host:per_request_ms"]
    drawn = with_bias(model, {"host:base_scale": 1.5, "host:per_request_ms": 0.5})
    assert drawn.terms.base_scale == pytest.approx(0.8 + 1.5 * 0.02) and drawn.terms.per_request_ms == 3.5
    batch = StepBatch.of([0], [1], [10])
    assert drawn.step_ms(batch) == pytest.approx(0.83 * LinearStepModel(2.0, 0.05, 0.001).step_ms(batch))
    sunk = with_bias(model, {"host:base_scale": -100.0})
    assert sunk.terms.base_scale == pytest.approx(0.05 * 0.8)
