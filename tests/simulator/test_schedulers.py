"""Each policy's defining behaviour, driven by hand (no event loop)."""
import pytest

from stepcal.core.errors import InputError
from stepcal.simulator.request import Status
from stepcal.simulator.schedulers import SCHEDULERS, make_scheduler
from tests.simulator.factories import make_request, make_scheduler_with_kv, run_to_completion


def test_registry_matches_cli_choices():
    from stepcal.experiments.commands.flags import SCHEDULER_NAMES
    assert tuple(SCHEDULERS) == SCHEDULER_NAMES
    with pytest.raises(InputError, match="--scheduler"):
        make_scheduler("fifo", None)


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_every_request_emits_exactly_its_tokens(name):
    sched, kv = make_scheduler_with_kv(name, num_blocks=60, block_size=4, max_num_seqs=3,
                                       max_num_batched_tokens=32, chunk_size=16)
    requests = [make_request(i, prompt=5 + 7 * i, output=1 + 3 * i) for i in range(6)]
    batches = run_to_completion(sched, requests)
    for r in requests:
        assert r.status is Status.FINISHED and r.num_generated_tokens == r.num_output_tokens
        assert r.num_computed_tokens == r.num_prompt_tokens + r.num_output_tokens - 1
        assert r.first_token_s is not None and r.finish_s >= r.first_token_s
    assert kv.num_free_blocks == kv.num_blocks
    assert all(len(b) <= 3 for b in batches)


def test_static_batches_run_to_completion_before_new_ones_join():
    sched, _ = make_scheduler_with_kv("static", max_num_seqs=2)
    batches = run_to_completion(sched, [make_request(0, 8, 3), make_request(1, 4, 1), make_request(2, 6, 2)])
    # batch 1 = requests 0 and 1 (prefill together), 0 decodes alone after 1 finishes; only then 2 starts
    assert batches == [[(0, 8, 0), (1, 4, 0)], [(0, 1, 8)], [(0, 1, 9)], [(2, 6, 0)], [(2, 1, 6)]]


def test_continuous_prefills_first_in_their_own_steps():
    sched, _ = make_scheduler_with_kv("continuous", max_num_batched_tokens=10)
    sched.add(make_request(0, 6, 3))
    s1 = sched.schedule(0.0)
    sched.on_step_done(s1, 1.0)
    sched.add(make_request(1, 5, 2))
    sched.add(make_request(2, 5, 2))   # 5 + 5 fits the budget of 10: both prefill together
    s2 = sched.schedule(1.0)
    assert list(s2.batch.request_ids) == [1, 2] and s2.batch.q_lens.tolist() == [5, 5]   # no decode of 0 mixed in
    assert not s2.is_pure_decode
    sched.on_step_done(s2, 2.0)
    s3 = sched.schedule(2.0)
    assert list(s3.batch.request_ids) == [0, 1, 2] and s3.batch.q_lens.tolist() == [1, 1, 1]
    assert s3.is_pure_decode and [r.request_id for r in s3.requests] == [0, 1, 2]


def test_vllm_token_budget_chunks_prompts_running_first():
    sched, _ = make_scheduler_with_kv("vllm", max_num_batched_tokens=8)
    batches = run_to_completion(sched, [make_request(0, 10, 2), make_request(1, 3, 1)])
    assert batches[0] == [(0, 8, 0)]                    # chunk of 8, the budget
    assert batches[1] == [(0, 2, 8), (1, 3, 0)]          # rest of 0, then 1 takes 3 of the 6 left
    assert batches[2] == [(0, 1, 10)]


def test_sarathi_is_decode_first_with_fixed_chunks():
    sched, _ = make_scheduler_with_kv("sarathi", chunk_size=4)
    sched.add(make_request(0, 2, 5))
    step = sched.schedule(0.0)
    sched.on_step_done(step, 0.1)                       # 0 now decodes
    sched.add(make_request(1, 9, 1))
    batches = []
    while sched.has_work() and len(batches) < 4:
        step = sched.schedule(0.2)
        batches.append(list(zip(step.batch.request_ids, step.batch.q_lens.tolist())))
        sched.on_step_done(step, 0.3)
    assert batches[:3] == [[(0, 1), (1, 3)], [(0, 1), (1, 3)], [(0, 1), (1, 3)]]  # 1 decode + 3-token chunks


def test_preemption_takes_the_newest_and_recomputes():
    # 3 blocks of 4 tokens: requests 0 and 1 fill them, growth forces a preemption
    sched, kv = make_scheduler_with_kv("vllm", num_blocks=3, block_size=4)
    r0, r1 = make_request(0, 4, 6), make_request(1, 4, 6)
    batches = run_to_completion(sched, [r0, r1])
    assert r1.num_preemptions >= 1 and r0.num_preemptions == 0
    recompute = [b for b in batches if (1, 4 + 1, 0) in b or any(rid == 1 and s == 0 and q > 4 for rid, q, s in b)]
    assert recompute, "request 1 re-prefilled its prompt plus generated tokens"
    assert kv.num_free_blocks == 3


def test_slo_policy_ranks_by_urgency_and_switches_modes():
    sched, _ = make_scheduler_with_kv("slo", max_num_batched_tokens=64, chunk_size=8)
    sched.add(make_request(0, 8, 1, arrival_s=0.8))                        # throughput, waited 0.2 s
    sched.add(make_request(1, 8, 1, arrival_s=0.95, priority=1))           # latency-sensitive, waited 0.05 s
    b = sched.schedule(1.0).batch
    assert b.request_ids[0] == 1          # score 1 + 0.05/1 beats 0 + 0.2/10
    old = make_request(9, 8, 1, arrival_s=-11.0)
    assert sched.score(old, 1.0) > sched.score(make_request(8, 8, 1, arrival_s=1.0, priority=1), 1.0)
    assert sched.mode == "eager" and b.num_tokens == 8
    for i in range(2, 12):
        sched.add(make_request(i, 8, 1, arrival_s=0.0))
    b = sched.schedule(2.0).batch         # a long queue that has waited: batch mode, the full budget
    assert sched.mode == "batch" and sched.num_mode_switches == 1 and b.num_tokens > 8
    assert sched.max_seqs_now > sched.settings.base_num_seqs


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_a_step_names_who_it_preempted_once_and_its_requests_in_batch_order(name):
    # 4 blocks of 4 tokens: three requests cannot all grow, so the newest are preempted and recomputed
    sched, _ = make_scheduler_with_kv(name, num_blocks=4, block_size=4, chunk_size=16, max_num_batched_tokens=16)
    requests = [make_request(i, prompt=4, output=6) for i in range(3)]
    for r in requests:
        sched.add(r)
    now, reported = 0.0, []
    while sched.has_work():
        step = sched.schedule(now)
        assert [r.request_id for r in step.requests] == list(step.batch.request_ids)
        assert step.is_pure_decode == bool(step.batch.is_pure_decode and all(
            r.num_pending_tokens == 1 for r in step.requests))
        assert not set(map(id, step.preempted)) & set(map(id, step.requests))
        reported += [r.request_id for r in step.preempted]
        now += 0.01
        sched.on_step_done(step, now)
    assert len(reported) == sched.num_preemptions == sum(r.num_preemptions for r in requests) > 0
