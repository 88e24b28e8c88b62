"""The request search matches TTFT's slope on the prompt's tokens among light-load arrivals: what a
prompt token costs, which TTFT quantiles mix with the per-request time and the queue; and TPOT's slope
on the requests decoding alongside: what a sequence costs a step, which they mix with the per-step
time."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stepcal.experiments.calibration import OBJECTIVE, calibrate
from stepcal.experiments.calibration.request_stats import (
    PREFILL_SLOPE_KEY,
    SLOPE_KEY,
    STREAM_SLOPE_KEY,
    TPOT_SLOPE_KEY,
    LoadGroups,
    decoding_alongside,
    measured_group_stats,
    pooled_bootstrap_log_covariance,
    prefill_tokens_alongside,
    repeat_groups,
)
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel
from tests.experiments.test_calibrate import synthetic_run


def _log(ttft_ms, prompt, arrival_s, finish_s) -> pd.DataFrame:
    n = len(ttft_ms)
    first_token_s = np.asarray(arrival_s, dtype=float) + np.asarray(ttft_ms, dtype=float) / 1000.0
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": arrival_s, "first_token_s": first_token_s,
                         "finish_s": finish_s,
                         "ttft_ms": ttft_ms, "tpot_ms": np.ones(n), "e2e_ms": np.asarray(ttft_ms) + 10.0,
                         "num_prompt_tokens": prompt, "num_output_tokens": np.full(n, 11)})


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


@pytest.mark.parametrize("varied_prompts", [True, False])
def test_the_stream_slope_is_what_one_more_active_stream_adds_to_ttft(varied_prompts):
    """TTFT of 5 ms, 0.7 ms per stream active at arrival and 0.02 ms per prompt token: the slope on the
    streams is 0.7 whether the prompts vary (taken beside them) or not (taken alone)."""
    rng = np.random.default_rng(3)
    arrival_s = np.arange(200) * 0.1
    finish_s = arrival_s + rng.uniform(0.05, 1.5, 200)    # overlaps of 0 to about 14 streams
    active = np.array([np.sum((arrival_s < a) & (finish_s > a)) for a in arrival_s])
    prompt = rng.integers(32, 1024, 200).astype(float) if varied_prompts else np.full(200, 512.0)
    log = _log(5.0 + 0.7 * active + 0.02 * prompt, prompt, arrival_s, finish_s)
    assert np.ptp(active) >= 5
    assert measured_group_stats([log], repeat_groups([log]))[STREAM_SLOPE_KEY] == pytest.approx(0.7, rel=1e-9)


def test_the_slope_has_a_bootstrap_variance(measured):
    log = measured.requests
    keys = [SLOPE_KEY, TPOT_SLOPE_KEY, STREAM_SLOPE_KEY, ("ttft_ms", "p50")]
    variance = np.diag(pooled_bootstrap_log_covariance([log], [LoadGroups.of(log)], keys))
    assert np.all(np.isfinite(variance)) and np.all(variance > 0)


def test_the_request_search_prices_a_prompt_token_from_the_slope():
    """A run whose prefill costs 0.02 ms a token more than the base, with a 3 ms request path: the
    search finds the per-token term (the slope is in its objective and in the record) and not a
    per-request term that would take the prefill's place."""
    from stepcal.core.workload import load_workload
    base = LinearStepModel(1.0, 0.01, 0.0005)
    truth = HostTerms(per_step_ms=0.3, per_token_ms=0.02, per_request_ms=3.0)
    trace = load_workload("poisson:rate=15,n=200,prompt=uniform:32:1024,output=uniform:8:64", seed=2)
    run = synthetic_run(trace, HostTermsModel(base, truth), front_end_seed=5)
    assert SLOPE_KEY in OBJECTIVE and run.steps is not None
    result = calibrate(run, base, max_simulations=150, uncertainty=False, step_log=False)
    record = result.to_dict()
    assert f"{SLOPE_KEY[0]}.{SLOPE_KEY[1]}" in record["errors_after"]
    # matched among TPOT's two slopes: within 6.5% here (5% with TTFT's and TPOT's on the streams only)
    assert abs(record["errors_after"][f"{SLOPE_KEY[0]}.{SLOPE_KEY[1]}"]) < 0.1
    assert result.terms.per_token_ms == pytest.approx(0.02, rel=0.25)
    assert result.terms.per_request_ms == pytest.approx(3.0, rel=0.3)


def test_the_requests_decoding_alongside_each_one():
    """A decodes over [0, 10] s, B over [5, 15] (each half alongside the other), C over [20, 30] alone
    but for D over [25, 26]; E never decodes (finished with its first token)."""
    first = np.array([0.0, 5.0, 20.0, 25.0, 40.0])
    finish = np.array([10.0, 15.0, 30.0, 26.0, 40.0])
    np.testing.assert_allclose(decoding_alongside(first, finish)[:4], [0.5, 0.5, 0.1, 1.0])
    assert np.isnan(decoding_alongside(first, finish)[4])


def test_the_tpot_slope_is_what_one_more_stream_adds():
    """TPOT 10 ms plus 0.3 ms per request decoding alongside, over a queue of overlapping requests."""
    rng = np.random.default_rng(1)
    arrival = np.sort(rng.uniform(0.0, 60.0, 120))
    first = arrival + 0.05
    finish = first + rng.uniform(1.0, 4.0, 120)
    alongside = decoding_alongside(first, finish)
    log = _log(np.full(120, 50.0), rng.integers(32, 512, 120).astype(float), arrival, finish)
    log["tpot_ms"] = 10.0 + 0.3 * alongside
    stats = measured_group_stats([log], repeat_groups([log]))
    assert np.ptp(alongside) > 2 and stats[TPOT_SLOPE_KEY] == pytest.approx(0.3, rel=1e-9)


def test_the_prefill_tokens_each_request_decodes_alongside():
    """A decodes over [0, 10] s in 4 steps: B's first token at 5 s (100 tokens) and C's at 10 s (50) fall
    in it, D's at 12 s does not. B over [5, 15] in 2 steps sees C and D (50 + 30). C and D see none
    after their own; E has no decode step (one output token); F never got a first token."""
    first = np.array([0.0, 5.0, 10.0, 12.0, 20.0, np.nan])
    finish = np.array([10.0, 15.0, 11.0, 13.0, 20.0, np.nan])
    prompt = np.array([10.0, 100.0, 50.0, 30.0, 70.0, 40.0])
    output = np.array([5, 3, 2, 2, 1, 4])
    got = prefill_tokens_alongside(first, finish, prompt, output)
    np.testing.assert_allclose(got[:4], [150.0 / 4, 80.0 / 2, 0.0, 0.0])
    assert np.isnan(got[4]) and np.isnan(got[5])


def test_the_prefill_slope_is_what_a_prefill_token_adds_to_the_steps_it_rides_in():
    """TPOT 10 ms, plus 0.3 ms per request decoding alongside and 0.012 ms per prompt token prefilled
    during the decode per step: the prefill slope is 0.012 though the two counts rise together; with
    no prefill cost it is not positive (None)."""
    rng = np.random.default_rng(3)
    arrival = np.sort(rng.uniform(0.0, 60.0, 200))
    first = arrival + 0.05
    finish = first + rng.uniform(1.0, 4.0, 200)
    log = _log(np.full(200, 50.0), np.full(200, 256.0), arrival, finish)
    log["num_output_tokens"] = rng.integers(8, 64, 200)
    alongside = decoding_alongside(first, finish)
    prefill = prefill_tokens_alongside(first, finish, log["num_prompt_tokens"], log["num_output_tokens"])
    assert np.corrcoef(alongside, prefill)[0, 1] > 0.2
    log["tpot_ms"] = 10.0 + 0.3 * alongside + 0.012 * prefill
    stats = measured_group_stats([log], repeat_groups([log]))
    assert stats[PREFILL_SLOPE_KEY] == pytest.approx(0.012, rel=1e-9) and stats[SLOPE_KEY] is None
    log["tpot_ms"] = 10.0 + 0.3 * alongside
    assert measured_group_stats([log], repeat_groups([log]))[PREFILL_SLOPE_KEY] is None


def test_the_request_search_prices_a_sequence_from_the_tpot_slope():
    """A run whose steps cost 0.15 ms a sequence more than the base, with a 2 ms request path: the search
    puts a clear part of it on the per-sequence term, which a per-step one would mimic at the
    calibration load only (without the TPOT slope, this budget found 0.03 ms per sequence)."""
    from stepcal.core.workload import load_workload
    base = LinearStepModel(1.0, 0.01, 0.0005)
    truth = HostTerms(per_step_ms=0.1, per_seq_ms=0.15, per_request_ms=2.0)
    trace = load_workload("poisson:rate=15,n=200,prompt=uniform:32:1024,output=uniform:8:64", seed=2)
    run = synthetic_run(trace, HostTermsModel(base, truth), front_end_seed=5)
    assert TPOT_SLOPE_KEY in OBJECTIVE
    result = calibrate(run, base, max_simulations=150, uncertainty=False, step_log=False)
    record = result.to_dict()
    assert abs(record["errors_after"][f"{TPOT_SLOPE_KEY[0]}.{TPOT_SLOPE_KEY[1]}"]) < 0.15
    assert 0.4 * 0.15 < result.terms.per_seq_ms < 1.5 * 0.15


class _SlopeFit:
    """What the gap starts read of a fit: a measured slope, the simulated one (TTFT's and TPOT's on the
    streams alongside; TPOT's on the prefills alongside only where `prefill` gives (measured,
    simulated)), its noise, and the sequences and tokens of the steps a request's TPOT sees."""

    def __init__(self, measured: float, simulated: float, std_err: float | None, mean_batch: float = 1.0,
                 prefill: tuple[float, float] | None = None, mean_tokens: float = 1.0) -> None:
        self._measured, self._simulated, self._std_err, self._batch = measured, simulated, std_err, mean_batch
        self._prefill, self._tokens = prefill or (measured, measured), mean_tokens

    def measured(self, key):
        return self._prefill[0] if key == PREFILL_SLOPE_KEY else self._measured

    def stats(self, terms):
        return {SLOPE_KEY: self._simulated, TPOT_SLOPE_KEY: self._simulated, PREFILL_SLOPE_KEY: self._prefill[1]}

    def slope_std_err(self, key):
        return self._std_err

    def mean_batch(self):
        return self._batch

    def mean_step_tokens(self):
        return self._tokens


def test_a_slope_gap_within_the_noise_starts_no_per_token_term():
    from stepcal.experiments.calibration import GAP_STD_ERRS
    from stepcal.experiments.calibration.search import _slope_gap_ms
    assert _slope_gap_ms(_SlopeFit(0.05, 0.04, 0.002), HostTerms()) == pytest.approx(0.01)
    assert _slope_gap_ms(_SlopeFit(0.05, 0.05 - 0.9 * GAP_STD_ERRS * 0.002, 0.002), HostTerms()) == 0.0
    assert _slope_gap_ms(_SlopeFit(0.05, 0.04, None), HostTerms()) == pytest.approx(0.01)   # noise unknown


def test_the_measured_slope_has_a_standard_error(measured):
    from stepcal.experiments.calibration.objective import _Fit
    fit = _Fit(measured, LinearStepModel(1.0, 0.01, 0.0005))
    std_err = fit.slope_std_err(SLOPE_KEY)
    # no bound against the slope itself: both are timed on this machine, and on a noisy VM a run of
    # 40 requests once gave a standard error (0.028) above its slope (0.024)
    assert 0 < std_err < np.inf and fit.measured(SLOPE_KEY) is not None
    assert fit.mean_batch() > 1.0   # a request's own sequence, and at least some company in a real queue


def test_a_tpot_slope_gap_moves_step_time_to_the_sequences():
    """The first fit priced 1 ms per step and no sequence; TPOT rises 0.1 ms per stream more in the run
    than in its simulation, with five sequences in a request's steps: the extra start is 0.1 ms per
    sequence and 0.5 per step (the same TPOT at the calibration load). Within the noise: no start."""
    from stepcal.experiments.calibration import TERM_NAMES
    from stepcal.experiments.calibration.search import _tpot_gap_start
    scale = np.array([2.0, 0.5, 0.01, 10.0])
    x = np.array([1.0 / 2.0, 0.0, 0.0, 3.0 / 10.0])

    def step_terms(v):
        return HostTerms(**dict(zip(TERM_NAMES, v * scale)))
    start = _tpot_gap_start(_SlopeFit(0.4, 0.3, 0.01, 5.0), step_terms, x, scale)
    terms = step_terms(start)
    assert terms.per_seq_ms == pytest.approx(0.1) and terms.per_step_ms == pytest.approx(0.5)
    assert terms.per_request_ms == pytest.approx(3.0) and terms.per_token_ms == 0.0
    assert _tpot_gap_start(_SlopeFit(0.4, 0.39, 0.01, 5.0), step_terms, x, scale) is None
    # a prefill token costs 0.012 ms more than simulated, in steps of 50 tokens: 0.6 ms off the step
    start = _tpot_gap_start(_SlopeFit(0.4, 0.4, 0.001, 5.0, prefill=(0.042, 0.030), mean_tokens=50.0),
                            step_terms, x, scale)
    terms = step_terms(start)
    assert terms.per_token_ms == pytest.approx(0.012) and terms.per_step_ms == pytest.approx(0.4)
    assert terms.per_seq_ms == 0.0
