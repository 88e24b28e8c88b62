import numpy as np
import pandas as pd
import pytest

from stepcal.core.errors import InputError
from stepcal.core.model_spec import PRESETS
from stepcal.simulator.disaggregation import DisaggConfig, DisaggSimulation, PoolConfig
from stepcal.simulator.schedulers import SchedulerConfig
from stepcal.simulator.step_model import ConstStepModel, LinearStepModel
from tests.simulator.factories import make_trace, random_trace

CONST_10 = ConstStepModel(10.0)


def config(prefill=1, decode=1, **kw) -> DisaggConfig:
    decode_pool = kw.pop("decode_pool", None) or PoolConfig(decode)
    return DisaggConfig(PoolConfig(prefill), decode_pool, **kw)


def run(trace, cfg, prefill_model=CONST_10, decode_model=CONST_10):
    return DisaggSimulation(trace, prefill_model, decode_model, cfg).run()


def test_transfer_is_alpha_plus_prompt_kv_bytes_over_bandwidth():
    spec = PRESETS["llama-3-8b"]
    assert spec.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    cfg = config(kv_bytes_per_token=spec.kv_bytes_per_token, kv_transfer_alpha_ms=0.5, kv_transfer_gb_per_s=25)
    assert cfg.transfer_ms(1000) == pytest.approx(0.5 + 131072 * 1000 / 25e9 * 1000)   # 5.74 ms


def test_one_request_timeline_by_hand():
    """prefill 0-10 ms, transfer 1 + 100·1000 B / 1 GB/s = 1.1 ms, then two decode steps of 10 ms."""
    cfg = config(kv_bytes_per_token=1000, kv_transfer_alpha_ms=1.0, kv_transfer_gb_per_s=1.0)
    log = run(make_trace([0.0], [100], [3]), cfg).requests.iloc[0]
    assert log["prefill_end_s"] == pytest.approx(0.010)
    assert log["kv_transfer_ms"] == pytest.approx(1.1)
    assert log["kv_ready_s"] == pytest.approx(0.0111)
    assert log["ttft_ms"] == pytest.approx(11.1)        # prefill + transfer (+ an empty decode queue)
    assert log["finish_s"] == pytest.approx(0.0311)
    assert log["tpot_ms"] == pytest.approx(10.0)


def test_ttft_includes_the_decode_queue():
    """Two requests prefilled together; the decode pool runs one at a time, so the second waits there."""
    decode_pool = PoolConfig(1, scheduler_config=SchedulerConfig(max_num_seqs=1))
    cfg = config(decode_pool=decode_pool, kv_bytes_per_token=1000, kv_transfer_alpha_ms=1.0, kv_transfer_gb_per_s=1.0)
    log = run(make_trace([0.0, 0.0], [100, 100], [3, 3]), cfg).requests
    assert log["prefill_end_s"].tolist() == pytest.approx([0.010, 0.010])
    assert log["ttft_ms"].tolist() == pytest.approx([11.1, 31.1])
    assert log["finish_s"].tolist() == pytest.approx([0.0311, 0.0511])


def test_a_one_token_request_is_answered_by_the_prefill_pool():
    log = run(make_trace([0.0, 0.0], [50, 50], [1, 2]), config(kv_bytes_per_token=1000)).requests
    assert log["ttft_ms"][0] == pytest.approx(10.0) and log["finish_s"][0] == pytest.approx(0.010)
    assert log["replica"].isna().tolist() == [True, False] and log["replica"][1] == 0
    default = DisaggConfig()
    assert np.isnan(log["kv_transfer_ms"][0])
    assert log["kv_transfer_ms"][1] == pytest.approx(default.kv_transfer_alpha_ms
                                                     + 1000 * 50 / (default.kv_transfer_gb_per_s * 1e9) * 1000)


def test_decode_runs_give_the_same_logs_as_one_step_at_a_time():
    """Transfers land in the middle of planned decode runs; cutting them back must change nothing."""
    trace = random_trace(300, seed=4, rate=20.0, max_prompt=800, max_output=200)
    model = LinearStepModel(5.0, 0.02, 0.0003)
    kw = dict(prefill=2, decode=3, kv_bytes_per_token=PRESETS["llama-3-8b"].kv_bytes_per_token,
              kv_transfer_alpha_ms=0.5, kv_transfer_gb_per_s=10.0, slo_ttft_ms=200.0, slo_tpot_ms=30.0)
    fast = run(trace, config(**kw), model, model)
    slow = run(trace, config(fast_path=False, **kw), model, model)
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    pd.testing.assert_frame_equal(fast.steps, slow.steps)
    assert fast.summary == slow.summary
    assert fast.summary["num_finished"] == 300 and (fast.steps["pool"] == "decode").sum() > 300
    decode_steps = fast.steps[fast.steps["pool"] == "decode"]
    assert decode_steps["prefill_tokens"].sum() == 0   # no preemption here: the decode pool only decodes
    assert fast.summary["num_replicas"] == 5 and fast.summary["num_decode_replicas"] == 3


def test_every_output_token_is_computed_once_in_the_right_pool():
    trace = random_trace(80, seed=1, rate=10.0, max_prompt=400, max_output=50)
    result = run(trace, config(2, 2, kv_bytes_per_token=4096))
    steps = result.steps
    prefill, decode = steps[steps["pool"] == "prefill"], steps[steps["pool"] == "decode"]
    assert prefill["num_tokens"].sum() == trace.num_prompt_tokens.sum()
    assert decode["num_tokens"].sum() == (trace.num_output_tokens - 1).sum()
    log = result.requests
    assert (log["first_token_s"] >= log["kv_ready_s"].fillna(log["prefill_end_s"])).all()
    assert (log["kv_ready_s"].dropna() > log["prefill_end_s"][log["kv_ready_s"].notna()]).all()


def test_least_tokens_router_is_supported_without_decode_runs():
    trace = random_trace(60, seed=2, rate=15.0, max_prompt=300, max_output=40)
    pool = PoolConfig(2, router="least-tokens")
    result = run(trace, DisaggConfig(PoolConfig(1), pool, kv_bytes_per_token=1024))
    assert result.summary["num_finished"] == 60
    assert set(result.requests["replica"].dropna()) == {0, 1}


@pytest.mark.parametrize("kw,needle", [({"kv_transfer_gb_per_s": 0.0}, "--kv-transfer-gbps"),
                                       ({"decode": 0}, "decode pool")])
def test_bad_config_is_an_input_error(kw, needle):
    with pytest.raises(InputError, match=needle):
        config(**kw)


def test_sessions_and_timeouts_are_refused_in_disaggregated_pools():
    trace = make_trace([0.0, 1.0], [10, 10], [2, 2], timeout_s=[1.0, np.nan])
    with pytest.raises(InputError, match="column timeout_s: closed-loop sessions and client timeouts"):
        DisaggSimulation(trace, CONST_10, CONST_10, config())
