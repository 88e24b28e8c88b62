import numpy as np
import pandas as pd
import pytest

from stepcal.core.errors import InputError
from stepcal.core.metrics import distribution, request_metrics, summarize, weighted_percentiles
from stepcal.simulator.queueing import (
    erlang_c,
    md1_mean_wait_s,
    mg1_mean_wait_s,
    mm1_mean_wait_s,
    mmc_mean_wait_s,
)


def test_weighted_percentiles_equal_numpy_on_the_expanded_array():
    rng = np.random.default_rng(0)
    for _ in range(50):
        values = rng.normal(size=rng.integers(1, 30))
        weights = rng.integers(1, 6, size=len(values))
        expanded = np.repeat(values, weights)
        assert weighted_percentiles(values, weights) == np.percentile(expanded, [50, 90, 95, 99]).tolist()


def test_distribution_ignores_nan_and_is_order_independent():
    d = distribution(np.array([3.0, np.nan, 1.0, 2.0]))
    assert d == {"mean": 2.0, "p50": 2.0, "p90": 2.8, "p95": pytest.approx(2.9), "p99": pytest.approx(2.98)}
    assert distribution(np.array([np.nan]))["p99"] is None
    a = distribution(np.array([0.1, 0.2, 0.2, 0.3]), np.array([1, 1, 2, 1]))
    b = distribution(np.array([0.2, 0.3, 0.1, 0.2]), np.array([2, 1, 1, 1]))
    assert a == b


def test_request_metrics_definitions():
    m = request_metrics([0.0, 1.0], [0.5, 1.2], [2.5, 1.2], [5, 1])
    assert m["ttft_ms"].tolist() == pytest.approx([500.0, 200.0])
    assert m["tpot_ms"][0] == pytest.approx(500.0) and np.isnan(m["tpot_ms"][1])   # 1 token: no TPOT
    assert m["e2e_ms"].tolist() == pytest.approx([2500.0, 200.0])


def test_summary_counts_unfinished_as_slo_misses():
    req = pd.DataFrame({"arrival_s": [0.0, 0.0, 0.0], "first_token_s": [0.1, 0.1, np.nan],
                        "finish_s": [1.0, 0.5, np.nan], "num_output_tokens": [10, 5, 3],
                        "num_preemptions": [0, 1, 0]})
    req = req.assign(**request_metrics(req.arrival_s, req.first_token_s, req.finish_s, req.num_output_tokens))
    s = summarize(req, slo_ttft_ms=200, slo_tpot_ms=50)
    assert s["num_finished"] == 2 and s["duration_s"] == 1.0 and s["num_preemptions"] == 1
    # request 0: TPOT 100 ms misses; request 1: TPOT 100 ms misses too; 2 unfinished
    assert s["slo_attainment"] == 0.0
    s = summarize(req, slo_ttft_ms=200, slo_tpot_ms=150)
    assert s["slo_attainment"] == pytest.approx(2 / 3) and s["goodput_rps"] == pytest.approx(2.0)


def test_queueing_closed_forms():
    lam, s = 70.0, 0.01                       # rho = 0.7
    assert md1_mean_wait_s(lam, s) == pytest.approx(0.7 * s / (2 * 0.3))
    assert mm1_mean_wait_s(lam, s) == pytest.approx(0.7 * s / 0.3)
    assert mg1_mean_wait_s(lam, s, 0.5) == pytest.approx(1.25 * 0.7 * s / (2 * 0.3))
    assert mmc_mean_wait_s(lam, s, 1) == pytest.approx(mm1_mean_wait_s(lam, s))
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)      # textbook value: c=2, a=1
    assert mmc_mean_wait_s(2 * lam, s, 2) < mm1_mean_wait_s(lam, s)   # pooling helps
    with pytest.raises(InputError, match="stable"):
        md1_mean_wait_s(100.0, s)
