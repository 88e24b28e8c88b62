"""`stepcal profile --budget-s S --for-trace TRACE`: the campaign spends its budget where the trace's
steps land; a bad trace is refused before anything is written."""
import json

import numpy as np
import pandas as pd
import pytest

from stepcal.experiments.budget.trace_weights import WEIGHT_FLOOR, candidate_weights, step_op_shapes
from tests.experiments.replay_profiles import gemm_replay_campaign

M = [*range(1, 33), 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
# few requests with 2-4 token prompts: nearly every step is a decode of at most 8 sequences
SMALL_DECODES = "poisson:rate=2,n=40,prompt=uniform:2:4,output=uniform:50:100"


@pytest.fixture
def campaign(tmp_path):
    return gemm_replay_campaign(tmp_path, M)


def _budget(tmp_path, campaign, fraction: float) -> str:
    assert campaign("full") == 0
    return f"{fraction * json.loads((tmp_path / 'full' / 'meta.json').read_text())['replay']['measure_s']:.6f}"


def _rows(path) -> pd.DataFrame:
    return pd.read_parquet(path / "profile.parquet").set_index("point_key").sort_index()


def _weighting(path) -> dict:
    return json.loads((path / "meta.json").read_text())["budget"]["weighting"]


def test_a_trace_of_small_decodes_draws_the_points_to_small_m(tmp_path, campaign, capsys):
    budget_s = _budget(tmp_path, campaign, 0.1)
    assert campaign("plain", "--budget-s", budget_s) == 0
    assert campaign("traced", "--budget-s", budget_s, "--for-trace", SMALL_DECODES) == 0
    plain, traced = _rows(tmp_path / "plain"), _rows(tmp_path / "traced")
    assert (traced["m"] <= 8).mean() > (plain["m"] <= 8).mean()
    assert np.log(traced["m"]).mean() < np.log(plain["m"]).mean()
    assert _weighting(tmp_path / "plain") == {"kind": "uniform"}
    weighting = _weighting(tmp_path / "traced")
    assert weighting["kind"] == "for-trace" and weighting["trace"] == SMALL_DECODES and weighting["num_steps"] > 0
    assert "(for-trace weighting)" in capsys.readouterr().err


def test_a_traced_campaign_is_deterministic(tmp_path, campaign):
    budget_s = _budget(tmp_path, campaign, 0.15)
    for out in ("one", "two"):
        assert campaign(out, "--budget-s", budget_s, "--for-trace", SMALL_DECODES) == 0
    pd.testing.assert_series_equal(_rows(tmp_path / "one")["time_ms"], _rows(tmp_path / "two")["time_ms"])


@pytest.mark.parametrize("extra, message", [
    (("--budget-s", "1", "--for-trace", "no/such/trace.csv"), "--for-trace: 'no/such/trace.csv'"),
    (("--budget-s", "1", "--for-trace", SMALL_DECODES, "--trace-step-model", "table"), "--trace-step-model"),
    (("--for-trace", SMALL_DECODES), "give --budget-s too"),
])
def test_a_bad_trace_is_one_line_and_writes_nothing(tmp_path, campaign, capsys, extra, message):
    assert campaign("out", *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "out").exists()


def test_each_step_counts_for_the_candidate_nearest_its_op_shape():
    candidates = pd.DataFrame({
        "op": ["attn_decode"] * 3 + ["attn_prefill"] * 2,
        "num_seqs": [1, 8, 64, 1, 4], "decode_kv_sum": [512, 4096, 32768, 0, 0],
        "prefill_tokens": [0, 0, 0, 256, 4096], "kv_sum": [512, 4096, 32768, 0, 0]})
    # decodes only: batches of 7-9 sequences with about 500 tokens of KV each
    steps = pd.DataFrame({"num_seqs": [7, 8, 9], "num_tokens": [7, 8, 9], "num_decode": [7, 8, 9],
                          "decode_kv_sum": [3500, 4000, 4500], "prefill_tokens": [0, 0, 0],
                          "kv_sum": [3500, 4000, 4500]})
    assert step_op_shapes(steps, "attn_prefill").empty
    weights = candidate_weights(candidates, steps)
    # all three steps land on the middle decode candidate: 3 over the op's mean of 1, plus the floor
    np.testing.assert_allclose(weights, [WEIGHT_FLOOR, 3 + WEIGHT_FLOOR, WEIGHT_FLOOR, 1, 1])
