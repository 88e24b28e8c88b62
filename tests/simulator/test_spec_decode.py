"""Speculative decoding in the vllm and sarathi schedulers: budget, trimming, lookahead slots,
rollback, the bonus token, determinism, and the acceptance models."""
import numpy as np
import pytest

from stepcal.core.errors import InputError
from stepcal.simulator.kv_cache import BlockManager, blocks_for
from stepcal.simulator.request import Status
from stepcal.simulator.schedulers import SchedulerConfig, make_scheduler
from stepcal.simulator.simulation import SimConfig, simulate
from stepcal.simulator.spec_decode import (
    METHODS,
    AcceptanceModel,
    SpecDecodeConfig,
    parse_spec_decode,
    rates_for_mean_length,
    verify_feature_row,
)
from stepcal.simulator.step_model import ConstStepModel
from tests.simulator.factories import make_request, random_trace


def spec(method="eagle", k=3, rates=(0.8, 0.6, 0.5), seed=0):
    return SpecDecodeConfig(method, k, AcceptanceModel(tuple(rates)), seed)


def scheduler(name="vllm", num_blocks=1000, block_size=16, **config):
    kv = BlockManager(num_blocks, block_size)
    return make_scheduler(name, kv, SchedulerConfig(**config)), kv


def step_once(sched, now=0.0):
    step = sched.schedule(now)
    sched.on_step_done(step, now + 0.01)
    return step


def decoding(sched, prompt=20, output=50):
    """A request past its prefill (one token emitted), in `sched`."""
    request = make_request(0, prompt, output)
    sched.add(request)
    while not request.num_generated_tokens:   # the prefill, maybe in chunks
        step_once(sched)
    assert request.num_generated_tokens == 1
    return request


def test_cli_methods_match_the_library():
    from stepcal.experiments.commands.spec_flags import SPEC_METHODS
    assert SPEC_METHODS == METHODS


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
def test_a_decode_brings_one_plus_k_tokens_and_reserves_k_lookahead_slots(name):
    sched, _ = scheduler(name, spec_decode=spec(k=3), block_size=4)
    request = decoding(sched)
    step = sched.schedule(0.02)
    assert step.batch.q_lens.tolist() == [4] and step.draft_lens.tolist() == [3]
    assert not step.is_pure_decode
    # the last token, 3 drafts and 3 lookahead slots for the next drafts
    assert request.num_blocks == blocks_for(request.num_computed_tokens + 4 + 3, 4)


def test_ngram_reserves_no_lookahead_slots():
    sched, _ = scheduler(spec_decode=spec("ngram", k=3), block_size=4)
    request = decoding(sched)
    sched.schedule(0.02)
    assert request.num_blocks == blocks_for(request.num_computed_tokens + 4, 4)


def test_drafts_are_trimmed_to_the_token_budget():
    sched, _ = scheduler(spec_decode=spec(k=5), max_num_batched_tokens=3)
    decoding(sched)
    step = sched.schedule(0.02)
    assert step.batch.num_tokens == 3 and step.draft_lens.tolist() == [2]


def test_drafts_never_exceed_the_outputs_left_less_one():
    sched, _ = scheduler(spec_decode=spec(k=5, rates=(1.0,)))
    request = decoding(sched, output=4)   # 3 tokens left: at most 2 drafts
    step = sched.schedule(0.02)
    assert step.draft_lens.tolist() == [2]
    sched.on_step_done(step, 0.03)
    assert request.status is Status.FINISHED and request.num_generated_tokens == 4


@pytest.mark.parametrize("prompt, drafts", [(14, 1), (15, 0)])
def test_drafts_are_trimmed_when_the_kv_cache_runs_short_before_anyone_is_preempted(prompt, drafts):
    # a cache of 16 slots (4 blocks of 4), all held after the prefill; the last token is fed at slot
    # `prompt`, and what is left after it holds the drafts (no lookahead slot)
    sched, kv = scheduler(spec_decode=spec(k=3), num_blocks=4, block_size=4)
    request = decoding(sched, prompt=prompt, output=20)
    assert kv.num_free_blocks == 0
    step = sched.schedule(0.02)
    assert step.draft_lens.tolist() == [drafts] and step.batch.q_lens.tolist() == [1 + drafts]
    assert sched.num_preemptions == 0 and request.status is Status.RUNNING


def test_rejected_drafts_roll_back_and_only_the_recovered_token_is_emitted():
    sched, kv = scheduler(spec_decode=spec(k=3, rates=(0.0,)), block_size=4)
    request = decoding(sched)
    computed, blocks = request.num_computed_tokens, request.num_blocks
    step_once(sched, 0.02)
    assert request.num_computed_tokens == computed + 1 and request.num_generated_tokens == 2
    assert request.num_blocks >= blocks   # the rejected slots stay held, to be overwritten
    assert sched.verifier.num_accepted_tokens == 0 and sched.verifier.num_draft_tokens == 3


def test_all_drafts_accepted_add_the_bonus_token():
    sched, _ = scheduler(spec_decode=spec(k=3, rates=(1.0,)))
    request = decoding(sched)
    computed = request.num_computed_tokens
    step_once(sched, 0.02)
    assert request.num_computed_tokens == computed + 4 and request.num_generated_tokens == 5
    assert sched.verifier.accepted_per_position == [1, 1, 1]


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
def test_every_request_emits_exactly_its_tokens_and_frees_its_blocks(name):
    sched, kv = scheduler(name, spec_decode=spec(k=4), num_blocks=80, block_size=4, max_num_seqs=3,
                          max_num_batched_tokens=32, chunk_size=16)
    requests = [make_request(i, prompt=5 + 7 * i, output=1 + 9 * i) for i in range(6)]
    for r in requests:
        sched.add(r)
    now = 0.0
    while sched.has_work():
        now += 0.01
        step = sched.schedule(now)
        assert step.batch.num_tokens <= 16 if name == "sarathi" else 32
        sched.on_step_done(step, now + 0.01)
    for r in requests:
        assert r.status is Status.FINISHED and r.num_generated_tokens == r.num_output_tokens
        assert r.num_computed_tokens == r.num_prompt_tokens + r.num_output_tokens - 1
    assert kv.num_free_blocks == kv.num_blocks and sched.num_outstanding_tokens == 0


def test_schedulers_without_spec_decode_refuse_it():
    for name in ("static", "continuous", "slo"):
        with pytest.raises(InputError, match="--spec-decode"):
            scheduler(name, spec_decode=spec())


def _sim(trace, spec_decode, fast_path=True):
    config = SimConfig(scheduler="vllm", scheduler_config=SchedulerConfig(spec_decode=spec_decode),
                       kv_blocks=4000, fast_path=fast_path)
    return simulate(trace, ConstStepModel(10.0), config)


def test_runs_are_deterministic_and_the_seed_matters():
    trace = random_trace(60, seed=3, max_prompt=300, max_output=120)
    a, b = _sim(trace, spec(seed=1)), _sim(trace, spec(seed=1))
    assert a.requests.equals(b.requests) and a.summary["spec_decode"] == b.summary["spec_decode"]
    c = _sim(trace, spec(seed=2))
    assert c.summary["spec_decode"]["num_accepted_tokens"] != a.summary["spec_decode"]["num_accepted_tokens"]
    slow = _sim(trace, spec(seed=1), fast_path=False)
    assert slow.requests.equals(a.requests)


def test_a_requests_acceptances_do_not_depend_on_its_batch():
    from stepcal.core.trace import Trace
    alone = Trace.from_arrays(np.array([0.0]), np.array([40]), np.array([180]), source="test")
    crowd = random_trace(30, seed=6, max_prompt=50, max_output=200)
    both = Trace.from_arrays(np.concatenate([alone.arrival_s, crowd.arrival_s + 0.001]),
                             np.concatenate([alone.num_prompt_tokens, crowd.num_prompt_tokens]),
                             np.concatenate([alone.num_output_tokens, crowd.num_output_tokens]), source="test")
    config = SimConfig(scheduler="vllm", scheduler_config=SchedulerConfig(spec_decode=spec()), kv_blocks=4000)
    from stepcal.simulator.simulation import Simulation
    runs = []
    for trace in (alone, both):
        sim = Simulation(trace, ConstStepModel(10.0), config)
        sim.run()
        runs.append(sim.requests[0].num_accepted_tokens)
    assert runs[0] == runs[1] and runs[0] > 0


def test_tpot_counts_output_tokens():
    # every draft passes: 1 + 4 tokens per 10 ms step after the first token
    trace = random_trace(1, seed=0)
    from stepcal.core.trace import Trace
    one = Trace.from_arrays(np.array([0.0]), np.array([100]), np.array([41]), source="test")
    result = _sim(one, spec(k=4, rates=(1.0,)))
    assert result.requests["tpot_ms"].iloc[0] == pytest.approx(10.0 / 5)
    assert result.summary["spec_decode"]["acceptance_length"] == pytest.approx(5.0)
    assert len(trace) == 1


def test_a_mean_acceptance_length_is_met_on_a_long_run():
    model = rates_for_mean_length(2.36, 2)
    assert model.mean_acceptance_length(2) == pytest.approx(2.36)
    trace = random_trace(200, seed=4, max_prompt=200, max_output=400)
    summary = _sim(trace, SpecDecodeConfig("eagle", 2, model)).summary["spec_decode"]
    assert summary["acceptance_length"] == pytest.approx(2.36, abs=0.03)
    per_pos = summary["num_accepted_tokens_per_pos"]
    assert per_pos[0] >= per_pos[1] > 0


def test_fixed_rates_give_their_expected_acceptance_length():
    trace = random_trace(200, seed=7, max_prompt=200, max_output=400)
    summary = _sim(trace, spec(k=3, rates=(0.8, 0.6, 0.5))).summary["spec_decode"]
    assert summary["expected_acceptance_length"] == pytest.approx(1 + 0.8 + 0.48 + 0.24)
    assert summary["acceptance_length"] == pytest.approx(2.52, abs=0.04)


def test_spec_decode_takes_fewer_steps_and_lowers_tpot():
    trace = random_trace(40, seed=8, max_prompt=200, max_output=200)
    off, on = _sim(trace, None), _sim(trace, spec(k=3))
    assert on.summary["num_steps"] < off.summary["num_steps"]
    assert on.summary["tpot_ms"]["mean"] < off.summary["tpot_ms"]["mean"]
    assert on.summary["mean_tokens_per_step"] > off.summary["mean_tokens_per_step"]
    assert off.summary["spec_decode"] is None


def test_a_verify_step_counts_its_requests_as_decodes():
    row = verify_feature_row(np.array([4, 1, 30]), np.array([100, 50, 0]), np.array([3, 0, 0]))
    num_seqs, num_tokens, num_decode, kv_sum_dec, kv_max_dec, prefill_tokens, _, kv_sum = row
    assert (num_seqs, num_tokens, num_decode, prefill_tokens, kv_sum) == (3, 35, 2, 30, 150)
    assert (kv_sum_dec, kv_max_dec) == (103 + 50, 103)


@pytest.mark.parametrize("text, acceptance, message", [
    ("eagle:0", "mean:2", "k must be in 1..128"),
    ("eagle:129", "mean:2", "k must be in 1..128"),
    ("medusa:2", "mean:2", "unknown method"),
    ("eagle:x", "mean:2", "expected METHOD:k"),
    ("eagle:2", "rates:0.5,0.7", "must not rise"),
    ("eagle:2", "rates:1.5", r"in \[0, 1\]"),
    ("eagle:2", "rates:-0.1", r"in \[0, 1\]"),
    ("eagle:2", "mean:3.5", r"\[1, k \+ 1\]"),
    ("eagle:2", "mean:0.5", r"\[1, k \+ 1\]"),
    ("eagle:2", "median:2", "expected rates"),
    ("eagle:2", None, "needs --acceptance"),
])
def test_bad_spec_decode_input_is_one_line(text, acceptance, message):
    with pytest.raises(InputError, match=message) as info:
        parse_spec_decode(text, acceptance)
    assert "\n" not in str(info.value)


def _acceptance_trace(tmp_path, rows, k=2):
    path = tmp_path / "accepted.csv"
    path.write_text("request_id,accepted\n" + "".join(f"{rid},{counts}\n" for rid, counts in rows))
    return parse_spec_decode(f"eagle:{k}", f"trace:{path}")


def test_an_acceptance_trace_is_replayed_round_by_round_and_cycles(tmp_path):
    config = _acceptance_trace(tmp_path, [(0, "2 0 1"), (1, "0")])
    sched, _ = scheduler(spec_decode=config)
    request = decoding(sched, output=40)
    emitted = []
    for step in range(5):
        before = request.num_generated_tokens
        step_once(sched, 0.02 * (step + 2))
        emitted.append(request.num_generated_tokens - before)
    assert emitted == [3, 1, 2, 3, 1]
    summary = sched.verifier.summary()
    assert summary["acceptance"].startswith("trace:") and summary["num_accepted_tokens"] == 2 + 0 + 1 + 2 + 0
    # the trace's own conditional rates: 3 rounds, 2 with >= 1 accepted, 1 of them with 2
    assert summary["acceptance_rates"] == pytest.approx([2 / 4, 1 / 2])


def test_an_acceptance_trace_must_cover_the_simulated_requests(tmp_path):
    from stepcal.core.trace import Trace
    config = _acceptance_trace(tmp_path, [(0, "1 1")])
    trace = Trace.from_arrays(np.array([0.0, 0.1]), np.array([10, 10]), np.array([20, 20]), source="test")
    sim_config = SimConfig(scheduler="vllm", scheduler_config=SchedulerConfig(spec_decode=config), kv_blocks=100)
    with pytest.raises(InputError, match="no accepted counts for request 1"):
        simulate(trace, ConstStepModel(10.0), sim_config)


@pytest.mark.parametrize("body, message", [
    ("request_id,accepted\n0,1 3\n", r"in 0\.\.2"),
    ("request_id,accepted\n0,1 -1\n", r"in 0\.\.2"),
    ("request_id,accepted\n0,x\n", "must be integers"),
    ("request_id,accepted\n0,\n", "no accepted counts"),
    ("request_id,accepted\n0,1\n0,2\n", "twice"),
    ("id,counts\n0,1\n", "needs the columns"),
])
def test_bad_acceptance_traces_name_the_file_and_row(tmp_path, body, message):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(InputError, match=message) as info:
        parse_spec_decode("eagle:2", f"trace:{path}")
    assert str(path) in str(info.value)
    with pytest.raises(InputError, match="cannot read"):
        parse_spec_decode("eagle:2", f"trace:{tmp_path / 'missing.csv'}")


def test_an_unlimited_cache_leaves_room_for_the_lookahead_slots():
    from stepcal.core.trace import Trace
    trace = Trace.from_arrays(np.arange(8) * 0.001, np.full(8, 16), np.full(8, 33), source="test")
    for spec_decode, preemptions in ((None, 0), (spec(k=3, rates=(0.5,)), 0)):
        config = SimConfig(scheduler="vllm", scheduler_config=SchedulerConfig(spec_decode=spec_decode), block_size=16)
        result = simulate(trace, ConstStepModel(10.0), config)
        assert result.summary["num_preemptions"] == preemptions
    assert result.summary["kv_blocks"] == 8 * blocks_for(16 + 33 - 1 + 3, 16)


def test_rates_fitted_to_counters_are_conditional_and_never_rise():
    from stepcal.simulator.spec_decode_fit import fitted_rates
    assert fitted_rates(100, [80, 48, 24]) == pytest.approx((0.8, 0.6, 0.5))
    # 40 of 80 at position 2 then 36 of 40 at 3 rises: pooled to 76 / 120 for both
    assert fitted_rates(100, [80, 40, 36]) == pytest.approx((0.8, 76 / 120, 76 / 120))
    # pooling can cascade back to the first position
    assert fitted_rates(100, [40, 30, 28]) == pytest.approx((98 / 170,) * 3)
    assert fitted_rates(10, [5, 0, 0]) == pytest.approx((0.5, 0.0, 0.0))


def test_counters_of_one_run_give_back_its_acceptance(tmp_path):
    trace = random_trace(200, seed=9, max_prompt=200, max_output=300)
    first = _sim(trace, spec(k=3, rates=(0.8, 0.6, 0.5))).summary
    path = tmp_path / "summary.json"
    import json
    path.write_text(json.dumps(first))
    fitted = parse_spec_decode("eagle:3", f"counters:{path}")
    assert fitted.acceptance.rates == pytest.approx((0.8, 0.6, 0.5), abs=0.03)
    second = _sim(random_trace(200, seed=10, max_prompt=200, max_output=300), fitted).summary["spec_decode"]
    assert second["acceptance_length"] == pytest.approx(first["spec_decode"]["acceptance_length"], rel=0.03)


@pytest.mark.parametrize("body, message", [
    ('{"num_drafts": 10}', "needs num_drafts and num_accepted_tokens_per_pos"),
    ('{"num_drafts": 0, "num_accepted_tokens_per_pos": [1]}', "positive integer"),
    ('{"num_drafts": 10, "num_accepted_tokens_per_pos": [5, 7]}', "exceeds the rounds"),
    ("not json", "not valid JSON"),
])
def test_bad_counters_are_one_line(tmp_path, body, message):
    path = tmp_path / "counters.json"
    path.write_text(body)
    with pytest.raises(InputError, match=message):
        parse_spec_decode("eagle:2", f"counters:{path}")
