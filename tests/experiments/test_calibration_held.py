"""Tables that price the host path from a profile (a `host` term over num_seqs) get no per-sequence
correction from calibrate: a run at low load cannot tell it from a per-step one."""
from __future__ import annotations

import json

import pytest

from stepcal.costmodel.tables import load_step_model
from stepcal.experiments.calibration import calibrate, held_terms
from stepcal.experiments.cli import main
from stepcal.experiments.validation.measured import sim_config_for
from stepcal.simulator.simulation import simulate
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel
from tests.costmodel.conftest import make_step_log
from tests.costmodel.test_host_term import _fit, _profile
from tests.experiments.simulated_truth import served_as


@pytest.fixture(scope="module")
def profiled_tables(tmp_path_factory):
    """Tables of the profiler's own steps plus its host op: T_step = step + host."""
    tmp = tmp_path_factory.mktemp("profiled")
    out, meta = _fit(tmp, _profile(tmp), ops="step,host")
    assert meta["t_step_terms"] == ["step", "host"]
    return out


def test_only_tables_with_a_profiled_host_term_hold_the_per_sequence_term(profiled_tables, tmp_path):
    assert set(held_terms(load_step_model(profiled_tables))) == {"per_seq_ms"}
    # a calibrated model's own terms are HostTerms, not table terms: its base decides
    assert set(held_terms(HostTermsModel(load_step_model(profiled_tables), HostTerms()))) == {"per_seq_ms"}
    assert held_terms(LinearStepModel(1.0, 0.01, 0.001)) == {}
    # tables trained on engine step logs hold the host time inside `step`: their host term is not added
    log = tmp_path / "steps.parquet"
    make_step_log().to_parquet(log, index=False)
    from_logs = load_step_model(_fit(tmp_path, _profile(tmp_path), log, ops="step,host", name="from_logs")[0])
    assert [term.name for term in from_logs.terms] == ["step"] and held_terms(from_logs) == {}


def test_calibration_of_profiled_tables_fits_no_per_sequence_term(profiled_tables, measured):
    """A run whose steps cost more than the tables per step and per sequence: the fit puts the gap
    in the terms it may search, leaves per_seq_ms at zero, gives it no standard error and no row in
    the covariance that --ranges draws, and says why."""
    base = load_step_model(profiled_tables)
    truth = HostTermsModel(base, HostTerms(per_step_ms=0.4, per_seq_ms=0.05, per_request_ms=0.2))
    simulated = simulate(measured.trace, truth, sim_config_for(measured))
    run = served_as(measured, simulated)
    result = calibrate(run, base, max_simulations=150, step_log=False)
    assert result.terms.per_seq_ms == 0.0 and result.terms.per_step_ms > 0.2
    assert result.loss_after < result.loss_before / 10
    assert "per_seq_ms" not in result.std_err and "per_seq_ms" not in result.covariance.get("names", [])
    assert result.to_dict()["held_terms"] == held_terms(base)
    # a linear base has no host profile: the same run may still be fitted with a per-sequence term
    assert calibrate(run, LinearStepModel(1.0, 0.01, 0.001), max_simulations=30, uncertainty=False).held == {}


def test_calibrate_cli_says_which_term_it_held(profiled_tables, measured, tmp_path, capsys):
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(measured.path), "--step-model", str(profiled_tables),
                 "--max-simulations", "30", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ms per sequence" in printed and "not fitted: the base tables' host term" in printed
    meta = json.loads((out / "meta.json").read_text())
    assert meta["host_terms"]["per_seq_ms"] == 0.0
    assert set(meta["calibration"]["held_terms"]) == {"per_seq_ms"}
