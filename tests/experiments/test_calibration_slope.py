"""The request search matches TTFT's slope on the prompt's tokens among light-load arrivals: what a
prompt token costs, which TTFT quantiles mix with the per-request time and the queue (issue 16)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.validation.calibration import OBJECTIVE, calibrate
from experiments.validation.request_stats import (
    SLOPE_KEY,
    LoadGroups,
    measured_group_stats,
    pooled_bootstrap_log_covariance,
    repeat_groups,
)
from simulator.step_model import HostTerms, HostTermsModel, LinearStepModel
from tests.experiments.test_calibrate import synthetic_run


def _log(ttft_ms, prompt, arrival_s, finish_s) -> pd.DataFrame:
    n = len(ttft_ms)
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": arrival_s, "finish_s": finish_s,
                         "ttft_ms": ttft_ms, "tpot_ms": np.ones(n), "e2e_ms": np.asarray(ttft_ms) + 10.0,
                         "num_prompt_tokens": prompt})


def test_the_slope_is_taken_over_the_light_load_arrivals_only():
    """Requests one at a time (light) cost 0.04 ms a token over 2 ms; those sent in a burst (heavy)
    queue behind each other, which must not tilt the slope."""
    rng = np.random.default_rng(0)
    light_prompt = rng.integers(32, 512, 40).astype(float)
    light = _log(2.0 + 0.04 * light_prompt, light_prompt, np.arange(40.0), np.arange(40.0) + 0.5)
    # the burst arrives while a long request (itself alone at its arrival: light) is still running
    long = _log([2.0 + 0.04 * 100], [100.0], [99.0], [106.0])
    burst_prompt = rng.integers(32, 512, 40).astype(float)
    burst = _log(500.0 - 0.5 * burst_prompt, burst_prompt, 100.0 + np.arange(40) * 1e-3, np.full(40, 105.0))
    log = pd.concat([light, long.assign(request_id=40), burst.assign(request_id=burst.request_id + 41)],
                    ignore_index=True)
    stats = measured_group_stats([log], repeat_groups([log]))
    assert stats[SLOPE_KEY] == pytest.approx(0.04, rel=1e-9)
    # undefined where the prompts do not vary: no statistic rather than a division by zero
    flat = _log(np.full(10, 5.0), np.full(10, 128.0), np.arange(10.0), np.arange(10.0) + 0.5)
    assert measured_group_stats([flat], repeat_groups([flat]))[SLOPE_KEY] is None


def test_the_slope_has_a_bootstrap_variance(measured):
    log = measured.requests
    variance = np.diag(pooled_bootstrap_log_covariance([log], [LoadGroups.of(log)], [SLOPE_KEY, ("ttft_ms", "p50")]))
    assert np.all(np.isfinite(variance)) and np.all(variance > 0)


def test_the_request_search_prices_a_prompt_token_from_the_slope():
    """A run whose prefill costs 0.02 ms a token more than the base, with a 3 ms request path: the
    search finds the per-token term (the slope is in its objective and in the record) and not a
    per-request term that would take the prefill's place."""
    from simulator.workload import load_workload
    base = LinearStepModel(1.0, 0.01, 0.0005)
    truth = HostTerms(per_step_ms=0.3, per_token_ms=0.02, per_request_ms=3.0)
    trace = load_workload("poisson:rate=15,n=200,prompt=uniform:32:1024,output=uniform:8:64", seed=2)
    run = synthetic_run(trace, HostTermsModel(base, truth), front_end_seed=5)
    assert SLOPE_KEY in OBJECTIVE and run.steps is not None
    result = calibrate(run, base, max_simulations=150, uncertainty=False, step_log=False)
    record = result.to_dict()
    assert f"{SLOPE_KEY[0]}.{SLOPE_KEY[1]}" in record["errors_after"]
    assert abs(record["errors_after"][f"{SLOPE_KEY[0]}.{SLOPE_KEY[1]}"]) < 0.05
    assert result.terms.per_token_ms == pytest.approx(0.02, rel=0.25)
    assert result.terms.per_request_ms == pytest.approx(3.0, rel=0.3)
