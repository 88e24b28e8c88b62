"""Closed-loop sessions and client timeouts in the simulator."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepcal.core.errors import InputError
from stepcal.simulator.schedulers import SCHEDULERS, SchedulerConfig
from stepcal.simulator.simulation import SimConfig, Simulation, simulate
from stepcal.simulator.step_model import LinearStepModel
from tests.simulator.factories import make_trace

MODEL = LinearStepModel(10.0, 0.0, 0.0)   # every step 10 ms


def by_id(result):
    return result.requests.set_index("request_id")


def test_a_closed_loop_turn_is_sent_a_think_time_after_the_previous_answer():
    # session 7: turn 0 at 0 s, turn 1 two seconds after turn 0 finished; request 2 is on its own
    trace = make_trace([0.0, 0.5, 0.1], [32, 64, 16], [5, 3, 2], session_id=[7, 7, 8],
                       turn=[0, 1, 0], think_time_s=[np.nan, 2.0, np.nan])
    result = simulate(trace, MODEL, SimConfig(scheduler="vllm"))
    req = by_id(result)
    assert req.loc[1, "arrival_s"] == pytest.approx(req.loc[0, "finish_s"] + 2.0)
    assert req.loc[2, "arrival_s"] == pytest.approx(0.1)
    assert req["finish_s"].notna().all()
    assert req.loc[1, "ttft_ms"] == pytest.approx(10.0)   # alone: one 10 ms prefill step


def test_turns_follow_the_turn_column_not_the_row_order():
    trace = make_trace([0.0, 0.0, 0.0], [16, 16, 16], [2, 2, 2], session_id=[1, 1, 1],
                       turn=[2, 0, 1], think_time_s=[1.0, np.nan, 1.0])
    req = by_id(simulate(trace, MODEL, SimConfig()))
    assert req.loc[1, "arrival_s"] == 0.0
    assert req.loc[2, "arrival_s"] == pytest.approx(req.loc[1, "finish_s"] + 1.0)
    assert req.loc[0, "arrival_s"] == pytest.approx(req.loc[2, "finish_s"] + 1.0)


def test_a_request_that_outlives_its_timeout_is_aborted_and_frees_its_blocks():
    # one long request hogs the replica; the second gives up while waiting, the first while decoding
    trace = make_trace([0.0, 0.01], [64, 64], [100, 5], timeout_s=[0.5, 0.05])
    sim = Simulation(trace, MODEL, SimConfig(scheduler="vllm", kv_blocks=12, block_size=16,
                                             scheduler_config=SchedulerConfig(max_num_seqs=1)))
    result = sim.run()
    req = by_id(result)
    assert req["timed_out"].tolist() == [True, True]
    assert req["finish_s"].isna().all()
    assert result.summary["num_timeouts"] == 2 and result.summary["num_finished"] == 0
    assert sim.replicas[0].kv.num_free_blocks == 12
    # the decode stopped at the first step boundary after 0.5 s: no step after that
    steps = result.steps
    assert steps["start_s"].max() < 0.5 + 1e-9


def test_the_timeout_flag_applies_where_the_trace_gives_none():
    trace = make_trace([0.0, 0.0], [16, 16], [50, 50], timeout_s=[np.nan, 10.0])
    result = simulate(trace, MODEL, SimConfig(scheduler="sarathi", timeout_s=0.2, scheduler_config=SchedulerConfig(max_num_seqs=1)))
    req = by_id(result)
    assert req.loc[0, "timed_out"] and not req.loc[1, "timed_out"]


def test_a_request_finishing_in_the_step_that_spans_its_deadline_counts_as_timed_out():
    trace = make_trace([0.0], [16], [3], timeout_s=[0.025])   # steps end at 10, 20, 30 ms
    result = simulate(trace, MODEL, SimConfig())
    assert result.requests["timed_out"].tolist() == [True]
    assert result.summary["num_finished"] == 0


@pytest.mark.parametrize("columns, message", [
    (dict(turn=[0, 1]), "column turn needs a session_id column"),
    (dict(session_id=[1, 1], turn=[0, 0]), "session 1 has turn 0 twice"),
    (dict(session_id=[1, 2], think_time_s=[np.nan, 1.0]), "think_time_s is given for the first turn of session 2"),
    (dict(session_id=[1, 1], think_time_s=[np.nan, -1.0]), "think_time_s must be non-negative"),
    (dict(timeout_s=[0.0, 1.0]), "timeout_s must be positive"),
])
def test_bad_session_columns_are_refused(columns, message):
    with pytest.raises(InputError, match=message):
        make_trace([0.0, 1.0], [10, 10], [1, 1], **columns)


@st.composite
def session_workloads(draw):
    n = draw(st.integers(2, 16))
    sessions = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    think = [draw(st.sampled_from([np.nan, 0.0, 0.05, 0.3])) for _ in range(n)]
    first_seen = set()
    for i, s in enumerate(sessions):   # the first turn of a session is open loop
        if s not in first_seen:
            think[i] = np.nan
            first_seen.add(s)
    timeouts = [draw(st.sampled_from([np.nan, 0.05, 0.2, 1.0])) for _ in range(n)]
    prompts = draw(st.lists(st.integers(1, 80), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    gaps = draw(st.lists(st.floats(0.0, 0.1), min_size=n, max_size=n))
    need = max(-(-(p + o - 1) // 8) for p, o in zip(prompts, outputs))
    config = SimConfig(scheduler=draw(st.sampled_from(sorted(SCHEDULERS))), block_size=8,
                       kv_blocks=need + draw(st.integers(0, need)), num_replicas=draw(st.integers(1, 2)),
                       router=draw(st.sampled_from(["round-robin", "least-tokens"])),
                       prefix_caching=draw(st.booleans()),
                       scheduler_config=SchedulerConfig(max_num_seqs=draw(st.integers(1, 4)),
                                                        max_num_batched_tokens=draw(st.integers(8, 64)),
                                                        chunk_size=draw(st.integers(1, 16))))
    trace = make_trace(np.cumsum(gaps), prompts, outputs, session_id=sessions, think_time_s=think,
                       timeout_s=timeouts)
    model = LinearStepModel(draw(st.floats(1, 20)), draw(st.floats(0, 0.2)), 0.0)
    return trace, config, model


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(session_workloads())
def test_sessions_and_timeouts_keep_the_invariants(workload):
    trace, config, model = workload
    sim = Simulation(trace, model, config)
    result = sim.run()
    req = result.requests
    timed_out = req["timed_out"].to_numpy() if "timed_out" in req else np.zeros(len(req), bool)
    # every request ends exactly one way, and nothing is left holding blocks
    assert (req["finish_s"].notna().to_numpy() ^ timed_out).all()
    assert all(rep.kv.num_free_blocks == rep.kv.num_blocks for rep in sim.replicas)
    assert result.summary["num_timeouts"] == int(timed_out.sum())
    # a closed-loop turn is sent after the previous turn ended
    for request in sim.requests:
        turn = request.next_turn
        if turn is not None and request.finish_s is not None:
            assert turn.arrival_s == pytest.approx(request.finish_s + turn.think_time_s)
        elif turn is not None:   # timed out: the client moved on at its deadline
            assert turn.arrival_s == pytest.approx(request.arrival_s + request.timeout_s + turn.think_time_s)
    slow = simulate(trace, model, SimConfig(**{**config.__dict__, "fast_path": False}))
    assert slow.requests.equals(req) and slow.steps.equals(result.steps)
