"""The request path (simulator.frontend) in a disaggregated deployment: paid once, before the prefill pool."""
import pytest

from stepcal.simulator.disaggregation import DisaggConfig, DisaggSimulation, PoolConfig
from stepcal.simulator.frontend import FrontEnd
from stepcal.simulator.step_model import ConstStepModel
from tests.simulator.factories import make_trace, random_trace

CONST_10 = ConstStepModel(10.0)


def run(trace, front_end=None, **kw):
    config = DisaggConfig(PoolConfig(1), PoolConfig(1), kv_bytes_per_token=0, kv_transfer_alpha_ms=1.0,
                          front_end=front_end or FrontEnd(), **kw)
    return DisaggSimulation(trace, CONST_10, CONST_10, config).run()


def test_a_zero_front_end_changes_nothing():
    trace = random_trace(120, seed=5, rate=15.0, max_prompt=400, max_output=60)
    plain = DisaggSimulation(trace, CONST_10, CONST_10, DisaggConfig(kv_bytes_per_token=1000)).run()
    zero = DisaggSimulation(trace, CONST_10, CONST_10,
                            DisaggConfig(kv_bytes_per_token=1000, front_end=FrontEnd(0.0, 0.7, 0.0, 0.0))).run()
    assert plain.requests.equals(zero.requests) and plain.steps.equals(zero.steps)


def test_isolated_requests_are_delayed_by_exactly_their_path():
    """Requests 10 s apart never meet: each one's TTFT grows by median + per prompt token x prompt."""
    prompts = [40, 300, 1000]
    trace = make_trace([0.0, 10.0, 20.0], prompts, [4, 4, 4])
    front = FrontEnd(median_ms=5.0, per_prompt_token_ms=0.01)
    bare, delayed = run(trace), run(trace, front)
    added_ms = delayed.requests["ttft_ms"] - bare.requests["ttft_ms"]
    assert added_ms.tolist() == pytest.approx([5.0 + 0.01 * p for p in prompts])
    # the path delays the request's entry, not its decode: TPOT is unchanged
    assert delayed.requests["tpot_ms"].tolist() == pytest.approx(bare.requests["tpot_ms"].tolist())


def test_the_load_part_counts_streams_active_in_both_pools():
    """Timeline (10 ms steps, 1 ms transfer): request 0 is sent at 0 with nothing active, prefilled 0-10,
    decodes 11-31. Request 1, sent at 1 ms while request 0 is active (in the decode pool from 11 ms), waits
    20 ms on the path: prefill 21-31, decode from 32, TTFT 31 ms. Request 2, sent at 1 s when both are
    done, has no wait: TTFT 11 ms as request 0's."""
    trace = make_trace([0.0, 0.001, 1.0], [100, 100, 100], [3, 3, 3])
    log = run(trace, FrontEnd(per_stream_ms=20.0)).requests
    assert log["ttft_ms"].tolist() == pytest.approx([11.0, 31.0, 11.0])
    assert log["prefill_end_s"].tolist() == pytest.approx([0.010, 0.031, 1.010])


def test_a_one_token_request_stops_counting_when_the_prefill_pool_answers_it():
    """Request 0 has one output token: done at 10 ms. Request 1, sent at 15 ms, sees no active stream."""
    trace = make_trace([0.0, 0.015], [100, 100], [1, 3])
    log = run(trace, FrontEnd(per_stream_ms=50.0)).requests
    assert log["ttft_ms"].tolist() == pytest.approx([10.0, 11.0])


def test_a_spread_front_end_keeps_the_draws_of_the_aggregated_simulation():
    """Same request ids and seed: the same log-normal draw per request as an aggregated run's."""
    from stepcal.simulator.simulation import SimConfig, simulate
    trace = make_trace([0.0, 10.0, 20.0, 30.0], [50, 60, 70, 80], [2, 2, 2, 2])
    front = FrontEnd(median_ms=8.0, sigma=0.6)
    bare, delayed = run(trace, front_end=None), run(trace, front, front_end_seed=7)
    agg_bare = simulate(trace, CONST_10, SimConfig())
    agg = simulate(trace, CONST_10, SimConfig(front_end=front, front_end_seed=7))
    disagg_added = delayed.requests["ttft_ms"] - bare.requests["ttft_ms"]
    agg_added = agg.requests["ttft_ms"] - agg_bare.requests["ttft_ms"]
    assert disagg_added.tolist() == pytest.approx(agg_added.tolist())
    assert disagg_added.std() > 0
