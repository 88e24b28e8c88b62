"""Generated reuse: shared system prompts and multi-turn sessions."""
import numpy as np
import pytest

from stepcal.core.errors import InputError
from stepcal.core.workload import load_workload, unbounded_prefix_hits
from stepcal.simulator.simulation import SimConfig, simulate
from stepcal.simulator.step_model import LinearStepModel

SMALL = "poisson:rate=2,n=3,system=40,turns=fixed:2,think=1,prompt=fixed:10,output=fixed:20,seed=0"


def by_session(trace):
    rows = {}
    for i in range(len(trace)):
        rows[(int(trace.session_id[i]), int(trace.turn[i]))] = i
    return rows


def test_ids_follow_the_system_prompt_and_each_sessions_history():
    trace = load_workload(SMALL)
    rows = by_session(trace)
    assert len(trace) == 6 and trace.prefix_block_tokens == 16
    first, second = rows[(0, 0)], rows[(0, 1)]
    # turn 0: 40 system + 10 user = 50 tokens; turn 1: + 20 answer + 10 user = 80 tokens
    assert trace.num_prompt_tokens[first] == 50 and trace.num_prompt_tokens[second] == 80
    ids0, ids1 = trace.prefix_hash_ids[first], trace.prefix_hash_ids[second]
    assert len(ids0) == 4 and len(ids1) == 5
    assert ids1[:3] == ids0[:3]            # the three full blocks of turn 0 are turn 1's first three
    assert ids0[3] not in ids1             # turn 0's partial block is its own
    other = trace.prefix_hash_ids[rows[(1, 0)]]
    assert other[:2] == ids0[:2] and other[2] != ids0[2]   # same system prompt, own history


def test_closed_loop_sessions_carry_think_times_and_open_loop_ones_arrival_times():
    closed = load_workload(SMALL)
    rows = by_session(closed)
    assert np.isnan(closed.think_time_s[rows[(0, 0)]]) and closed.think_time_s[rows[(0, 1)]] > 0
    opened = load_workload(SMALL.replace("think=1", "think=1,loop=open"))
    assert opened.think_time_s is None
    rows = by_session(opened)
    assert opened.arrival_s[rows[(0, 1)]] > opened.arrival_s[rows[(0, 0)]]


def test_every_turn_hits_the_previous_prompt_and_answer_in_an_unbounded_cache():
    trace = load_workload("poisson:rate=1,n=20,turns=uniform:2:4,think=2,prompt=uniform:20:90,"
                          "output=uniform:5:40,seed=4")
    hits = unbounded_prefix_hits(trace)
    rows = by_session(trace)
    for (session, turn), i in rows.items():
        if turn > 0:
            previous = rows[(session, turn - 1)]
            kv_tokens = trace.num_prompt_tokens[previous] + trace.num_output_tokens[previous] - 1
            assert hits[i] == kv_tokens // 16 * 16


def test_several_system_prompts_are_shared_by_their_users():
    trace = load_workload("poisson:rate=5,n=40,system=64:2,prompt=fixed:8,output=fixed:4,seed=1")
    assert trace.session_id is None   # one turn each: no session columns
    heads = {tuple(ids[:4]) for ids in trace.prefix_hash_ids}
    assert len(heads) == 2 and all(p == 72 for p in trace.num_prompt_tokens)


def test_caching_serves_the_sessions_history():
    trace = load_workload("poisson:rate=2,n=30,system=256,turns=fixed:3,think=0.5,prompt=fixed:64,"
                          "output=fixed:32,seed=2")
    model = LinearStepModel(5.0, 0.05, 0.0)
    on = simulate(trace, model, SimConfig(scheduler="vllm"))
    off = simulate(trace, model, SimConfig(scheduler="vllm", prefix_caching=False))
    assert on.summary["prefix_hit_rate"] > 0.5
    assert on.summary["ttft_ms"]["p50"] < off.summary["ttft_ms"]["p50"]
    assert on.requests["finish_s"].notna().all()


@pytest.mark.parametrize("spec, message", [
    ("poisson:rate=1,n=5,think=2,prompt=fixed:5,output=fixed:5", "give turns=DIST too"),
    ("poisson:rate=1,n=5,turns=lognormal:3:1,prompt=fixed:5,output=fixed:5", "turns= takes fixed:N or uniform"),
    ("poisson:rate=1,n=5,turns=fixed:2,loop=maybe,prompt=fixed:5,output=fixed:5", "loop= is closed"),
    ("poisson:rate=1,n=5,system=0,prompt=fixed:5,output=fixed:5", "must be a positive integer"),
])
def test_bad_session_specs_say_what_is_wrong(spec, message):
    with pytest.raises(InputError, match=message):
        load_workload(spec)


def test_a_turn_reuses_the_previous_answer_and_the_statistics_count_it():
    """Sessions far apart in time: with an unbounded cache each turn reuses the previous turn's
    prompt and all but the last token of its answer (in whole blocks), as vLLM caches generated
    blocks too; `trace stats` counts the same."""
    trace = load_workload("poisson:rate=0.01,n=3,system=40,turns=fixed:3,think=30,prompt=uniform:10:60,"
                          "output=uniform:20:70,seed=5")
    result = simulate(trace, LinearStepModel(5.0, 0.01, 0.0), SimConfig(scheduler="vllm"))
    req = result.requests.set_index("request_id")
    rows = by_session(trace)
    for (session, turn), i in rows.items():
        rid = int(trace.request_id[i])
        if turn == 0:
            continue
        previous = rows[(session, turn - 1)]
        kv_tokens = int(trace.num_prompt_tokens[previous] + trace.num_output_tokens[previous] - 1)
        assert req.loc[rid, "num_cached_tokens"] == kv_tokens // 16 * 16
    hits = unbounded_prefix_hits(trace)
    assert req["num_cached_tokens"].tolist() == [int(hits[np.flatnonzero(trace.request_id == r)[0]])
                                                 for r in req.index]
