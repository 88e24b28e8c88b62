"""The level a calibration leaves: host terms only add time, and the base's scale takes away at most
half, so a base that prices the calibration run far too high keeps the rest of its excess, and
--ranges draws each replication's level with it (Scatter.bias_cv)."""
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from stepcal.core.errors import InputError
from stepcal.experiments.calibration import SUMMARY_OBJECTIVE, calibrate
from stepcal.experiments.cli import main
from stepcal.experiments.validation.measured import sim_config_for
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.simulation import simulate
from stepcal.simulator.step_model import LinearStepModel
from tests.experiments.simulated_truth import served_as


def test_the_level_left_adds_to_the_runs_level_in_quadrature():
    device = Scatter(cv=0.05, rho=0.5, run_cv=0.03, model_level_repeats=2)
    both = replace(device, bias_cv=0.04)
    assert both.level_sigma == pytest.approx(math.hypot(device.level_sigma, math.sqrt(math.log1p(0.04 ** 2))))
    assert Scatter().level_sigma == 0.0 and Scatter().is_zero
    assert not Scatter(bias_cv=0.04).is_zero
    with pytest.raises(InputError, match="bias_cv must be a non-negative number, got -0.1"):
        Scatter(bias_cv=-0.1)


def _run_at(measured, step_ms):
    """The measured workload served at a constant step time (simulated: no timing of this machine's)."""
    truth = simulate(measured.trace, LinearStepModel(step_ms, 0.0, 0.0), sim_config_for(measured))
    return served_as(measured, truth)


def _added_ms(terms, steps) -> float:
    return terms.per_step_ms + terms.per_seq_ms * steps["num_seqs"].mean() + terms.per_token_ms * steps["num_tokens"].mean()


def test_a_base_too_slow_for_the_run_is_scaled_down(measured):
    step_ms = 2.0     # the truth's step time: the same load on any machine
    run = _run_at(measured, step_ms)
    slow = calibrate(run, LinearStepModel(1.3 * step_ms, 0.0, 0.0), max_simulations=60, uncertainty=False,
                     step_log=False)
    # the scale takes the excess away, and no step time is added beside it
    assert slow.terms.base_scale == pytest.approx(1 / 1.3, rel=0.01)
    assert _added_ms(slow.terms, run.steps) == 0.0 and slow.terms.per_request_ms < 0.02 * step_ms
    assert slow.bias_cv < 0.01
    # a base that is too fast gets its gap as terms, and no scale
    fast = calibrate(run, LinearStepModel(0.6 * step_ms, 0.0, 0.0), max_simulations=120, uncertainty=False,
                     step_log=False)
    assert fast.terms.per_step_ms > 0 and fast.terms.base_scale == 1.0 and fast.bias_cv < 0.05


def test_a_base_too_slow_beyond_the_scales_reach_keeps_the_rest_as_the_level_left(measured):
    step_ms = 2.0
    run = _run_at(measured, step_ms)
    slow = calibrate(run, LinearStepModel(2.6 * step_ms, 0.0, 0.0), max_simulations=60, uncertainty=False,
                     step_log=False)
    # halved, the base is still 1.3x the run: nothing more to take away
    assert slow.terms.base_scale == pytest.approx(0.5, abs=0.005)
    assert _added_ms(slow.terms, run.steps) == 0.0 and slow.terms.per_request_ms < 0.02 * step_ms
    # the level is the summary statistics' (the TTFT slope, a shape, stays out of it)
    logs = [math.log1p(slow.errors_after[key]) for key in SUMMARY_OBJECTIVE if slow.errors_after[key] is not None]
    assert slow.bias_cv == pytest.approx(abs(np.mean(logs))) and slow.bias_cv > 0.15


def test_calibrate_stores_the_level_left_and_ranges_draw_it(measured, tmp_path, capsys):
    step_ms = float(measured.steps["duration_ms"].mean())
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(measured.path), "--step-model", f"const:{4 * step_ms:.4f}",
                 "--max-simulations", "30", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "level left at this run:" in printed and "x the base tables' step times" in printed
    assert "  0 (held at 0: the base's step times are scaled down instead) ms per step\n" in printed
    meta = json.loads((out / "meta.json").read_text())
    assert meta["host_terms"]["base_scale"] == pytest.approx(0.5, abs=0.005)   # as far down as it goes
    bias = meta["calibration"]["bias_cv"]
    # one repeat measures no device scatter: the block holds the level left alone
    assert bias > 0.3 and meta["scatter"] == {"cv": 0.0, "rho": 0.0, "run_cv": 0.0, "bias_cv": bias}
    v = tmp_path / "v"
    assert main(["validate", "--measured", str(measured.path), "--step-model", str(out), "--ranges", "6",
                 "--quiet", "--out", str(v)]) == 0
    ranges = json.loads((v / "validation.json").read_text())["ranges"]
    assert ranges["scatter_bias_cv"] == bias
    p50 = ranges["stats"]["ttft_ms"]["p50"]
    assert p50["low"] < p50["median"] < p50["high"]
