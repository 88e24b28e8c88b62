"""The request path before the scheduler (simulator.frontend): a constant delay as before, a seeded
log-normal per request, and a part per stream active at the request's arrival."""
import numpy as np
import pytest

from stepcal.core.errors import InputError
from stepcal.simulator.frontend import FrontEnd, standard_normals
from stepcal.simulator.ranges import replicate
from stepcal.simulator.simulation import SimConfig, simulate
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel
from tests.simulator.factories import make_trace, random_trace

MODEL = LinearStepModel(10.0, 0.0, 0.0)    # every step 10 ms
LOADED = LinearStepModel(4.0, 0.02, 0.0005)


def by_id(result):
    return result.requests.set_index("request_id")


def test_a_constant_front_end_shifts_entries_exactly_as_a_shifted_trace():
    """The constant case is the simulator's old request path: each request enters at arrival + c,
    to the bit, so its scheduling is that of a trace whose arrivals were shifted by c."""
    trace = random_trace(300, seed=3, rate=12.0, max_prompt=600, max_output=80)
    c_ms = 37.5
    delayed = simulate(trace, LOADED, SimConfig(front_end=FrontEnd(median_ms=c_ms)))
    shifted_trace = make_trace(trace.arrival_s + c_ms / 1000.0, trace.num_prompt_tokens, trace.num_output_tokens)
    shifted = simulate(shifted_trace, LOADED, SimConfig())
    assert delayed.requests["first_token_s"].tolist() == shifted.requests["first_token_s"].tolist()
    assert delayed.requests["finish_s"].tolist() == shifted.requests["finish_s"].tolist()
    assert delayed.steps["duration_ms"].tolist() == shifted.steps["duration_ms"].tolist()
    assert delayed.requests["arrival_s"].tolist() == trace.arrival_s.tolist()   # TTFT counts from the send


def test_a_zero_front_end_and_a_sigma_without_median_change_nothing():
    trace = random_trace(200, seed=4, rate=10.0, max_prompt=400, max_output=60)
    plain = simulate(trace, LOADED, SimConfig())
    for fe in (FrontEnd(), FrontEnd(sigma=0.7)):
        assert simulate(trace, LOADED, SimConfig(front_end=fe)).requests.equals(plain.requests)


def test_draws_depend_on_id_and_seed_only():
    ids = np.arange(1000, dtype=np.int64)
    z = standard_normals(ids, seed=5)
    assert standard_normals(ids[::-1], seed=5).tolist() == z[::-1].tolist()       # not on order
    assert standard_normals(ids[500:], seed=5).tolist() == z[500:].tolist()        # not on the others
    assert not np.array_equal(standard_normals(ids, seed=6), z)
    # a standard normal: mean 0, sd 1, within a few standard errors over 1000 draws
    many = standard_normals(np.arange(100_000, dtype=np.int64), seed=0)
    assert abs(many.mean()) < 0.02 and abs(many.std() - 1.0) < 0.02
    assert np.mean(many > 1.6449) == pytest.approx(0.05, abs=0.005)


def test_a_lognormal_front_end_is_seeded():
    trace = random_trace(300, seed=2, rate=8.0, max_prompt=300, max_output=40)
    config = SimConfig(front_end=FrontEnd(median_ms=30.0, sigma=0.6))
    a, b = simulate(trace, MODEL, config), simulate(trace, MODEL, config)
    assert a.requests.equals(b.requests)
    from dataclasses import replace
    c = simulate(trace, MODEL, replace(config, front_end_seed=1))
    assert not np.array_equal(a.requests["ttft_ms"].to_numpy(), c.requests["ttft_ms"].to_numpy())
    # the per-request delays spread TTFT: its P90/P50 ratio is far above the constant front end's
    constant = simulate(trace, MODEL, SimConfig(front_end=FrontEnd(median_ms=30.0)))
    spread = a.summary["ttft_ms"]["p90"] / a.summary["ttft_ms"]["p50"]
    assert spread > 1.3 > constant.summary["ttft_ms"]["p90"] / constant.summary["ttft_ms"]["p50"]


def test_replications_draw_other_front_end_delays():
    trace = random_trace(150, seed=1, rate=8.0, max_prompt=300, max_output=40)
    config = SimConfig(front_end=FrontEnd(median_ms=30.0, sigma=0.6))
    summaries = replicate(trace, MODEL, config, 3, seed=10)
    p90s = [s["ttft_ms"]["p90"] for s in summaries]
    assert len(set(p90s)) == 3
    assert replicate(trace, MODEL, config, 3, seed=10) == summaries


def test_the_per_stream_term_delays_each_request_by_the_streams_active_at_its_arrival():
    """Steps of 10 ms; request 0 arrives alone and decodes for a second; requests 1-3 arrive 2.5 ms
    into a step while 1, 2 and 3 others are active; request 4 arrives after all have finished. With
    50 ms per active stream their entries move by 50, 100, 150 and 0 ms, whole steps, so TTFT moves by
    exactly that."""
    arrivals = [0.0, 0.1025, 0.2025, 0.3025, 3.0025]
    trace = make_trace(arrivals, [16] * 5, [100, 100, 100, 100, 5])
    without = by_id(simulate(trace, MODEL, SimConfig(scheduler="vllm")))
    with_load = by_id(simulate(trace, MODEL, SimConfig(scheduler="vllm", front_end=FrontEnd(per_stream_ms=50.0))))
    assert without.loc[1:3, "ttft_ms"].tolist() == pytest.approx([17.5] * 3)   # to the step end, plus the prefill step
    extra_ms = (with_load["ttft_ms"] - without["ttft_ms"]).tolist()
    assert extra_ms == pytest.approx([0.0, 50.0, 100.0, 150.0, 0.0], abs=1e-6)
    assert with_load.loc[0, "finish_s"] < arrivals[4]


@pytest.mark.parametrize("router", ["round-robin", "least-tokens"])
def test_a_load_dependent_front_end_gives_the_same_logs_step_by_step(router):
    trace = random_trace(400, seed=7, rate=15.0, max_prompt=500, max_output=60)
    fe = FrontEnd(median_ms=5.0, sigma=0.4, per_prompt_token_ms=0.002, per_stream_ms=1.5)
    fast = simulate(trace, LOADED, SimConfig(front_end=fe, num_replicas=2, router=router))
    slow = simulate(trace, LOADED, SimConfig(front_end=fe, num_replicas=2, router=router, fast_path=False))
    assert fast.requests.equals(slow.requests)
    assert fast.summary["ttft_ms"]["p50"] > simulate(trace, LOADED, SimConfig(num_replicas=2, router=router)
                                                     ).summary["ttft_ms"]["p50"]


def test_closed_loop_turns_pass_the_front_end_and_count_as_streams():
    trace = make_trace([0.0, 0.5, 0.0425], [32, 64, 16], [5, 3, 2], session_id=[7, 7, 8],
                       turn=[0, 1, 0], think_time_s=[np.nan, 2.0, np.nan])
    plain = by_id(simulate(trace, MODEL, SimConfig()))
    constant = by_id(simulate(trace, MODEL, SimConfig(front_end=FrontEnd(median_ms=20.0))))
    # turn 1 is sent 2 s after turn 0 finished, and waits 20 ms before the scheduler sees it
    assert constant.loc[1, "arrival_s"] == pytest.approx(constant.loc[0, "finish_s"] + 2.0)
    assert constant.loc[1, "ttft_ms"] == pytest.approx(plain.loc[1, "ttft_ms"] + 20.0)
    loaded = SimConfig(front_end=FrontEnd(median_ms=20.0, per_stream_ms=7.0))
    fast, slow = simulate(trace, MODEL, loaded), simulate(trace, MODEL, replace_fast(loaded))
    assert fast.requests.equals(slow.requests)
    req = by_id(fast)
    # turn 0 enters at 20 ms and runs steps 20-70 ms. Request 2, sent at 42.5 ms with turn 0 active,
    # waits 20 + 7 ms, enters at 69.5 ms, is prefilled in the step 70-80 ms: TTFT 37.5 ms. Turn 1 is
    # sent at 2.07 s when nothing is active: 20 ms, as with the constant front end.
    assert req.loc[0, "finish_s"] == pytest.approx(0.07)
    assert req.loc[2, "ttft_ms"] == pytest.approx(37.5)
    assert req.loc[1, "ttft_ms"] == pytest.approx(constant.loc[1, "ttft_ms"])


def replace_fast(config):
    from dataclasses import replace
    return replace(config, fast_path=False)


def test_a_timeout_on_the_request_path_ends_the_stream():
    trace = make_trace([0.0, 0.01], [16, 16], [50, 5], timeout_s=[0.05, 10.0])
    result = by_id(simulate(trace, MODEL, SimConfig(front_end=FrontEnd(median_ms=80.0, per_stream_ms=1.0))))
    assert bool(result.loc[0, "timed_out"]) and result.loc[1, "finish_s"] > 0


def test_host_terms_carry_the_front_end_and_read_old_meta():
    old = HostTerms.from_dict({"per_step_ms": 1.0, "per_seq_ms": 0.0, "per_token_ms": 0.0, "per_request_ms": 12.0})
    assert old.front_end == FrontEnd(median_ms=12.0)
    new = HostTerms(0.5, 0.01, 0.0, 12.0, per_request_sigma=0.4, per_prompt_token_ms=0.003, per_stream_ms=2.0)
    assert HostTerms.from_dict(new.to_dict()) == new
    assert HostTermsModel(LOADED, new).front_end == FrontEnd(12.0, 0.4, 0.003, 2.0)
    with pytest.raises(InputError, match="per_request_sigma"):
        HostTerms.from_dict({"per_request_sigma": -0.1})
    with pytest.raises(InputError, match="per_stream_ms"):
        FrontEnd(per_stream_ms=float("nan"))
