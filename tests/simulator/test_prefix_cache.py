"""Automatic prefix caching in the simulator: the block manager's policy, the schedulers'
use of it, and the properties the issue names."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepcal.core.workload.prefix_stats import unbounded_prefix_hits
from stepcal.simulator.kv_cache import BlockManager
from stepcal.simulator.prefix_cache import PrefixCachingBlockManager, make_block_manager
from stepcal.simulator.prefix_keys import block_keys, trace_prefix_keys
from stepcal.simulator.request import Request, Status
from stepcal.simulator.schedulers import SCHEDULERS, SchedulerConfig
from stepcal.simulator.simulation import SimConfig, Simulation, simulate
from stepcal.simulator.step_model import LinearStepModel
from tests.simulator.factories import make_trace

MODEL = LinearStepModel(1.0, 0.01, 0.0)


def request_with_keys(request_id: int, prompt: int, keys, output: int = 4) -> Request:
    return Request(request_id, 0.0, prompt, output, prefix_keys=np.asarray(keys, dtype=np.int64))


def admit(kv: PrefixCachingBlockManager, request: Request) -> int:
    """Admit a waiting request with its whole prompt, as a scheduler does; the cached tokens."""
    hit = kv.lookup(request)
    cached = len(hit.block_ids) * kv.block_size if hit else 0
    assert kv.allocate(request, request.num_pending_tokens - cached, hit)
    request.status = Status.RUNNING
    return cached


def finish(kv: PrefixCachingBlockManager, request: Request) -> None:
    request.num_computed_tokens = request.num_known_tokens
    request.status = Status.FINISHED
    kv.free(request)


# -- keys ---------------------------------------------------------------------------------------------
def test_block_keys_map_trace_blocks_onto_kv_blocks():
    # trace blocks of 32 tokens, KV blocks of 16: two KV blocks per trace id, the prompt's tail has none
    keys = block_keys(np.array([5, 9]), num_prompt_tokens=60, trace_block_tokens=32, block_size=16)
    assert keys.tolist() == [5 * 2 + 0, 5 * 2 + 1, 9 * 2 + 0]
    # KV blocks larger than trace blocks: a KV block is named by the last trace block it covers
    assert block_keys(np.array([1, 2, 3, 4]), 64, 16, 32).tolist() == [2, 4]
    # ids stopping short of the prompt: blocks past them get no key
    assert block_keys(np.array([7]), 100, 16, 16).tolist() == [7]


def test_equal_prefixes_get_equal_keys_whatever_the_trace_block_size():
    trace = make_trace([0, 1], [64, 40], [2, 2], prefix_hash_ids=[[10, 11], [10, 12]], prefix_block_tokens=32)
    first, second = trace_prefix_keys(trace, block_size=16)
    assert len(first) == 4 and len(second) == 2
    assert first[:2].tolist() == second[:2].tolist()   # the shared 32-token trace block
    assert first[2] != second[1] if len(second) > 2 else True
    assert trace_prefix_keys(make_trace([0], [10], [1]), 16) is None


# -- the manager's policy ----------------------------------------------------------------------------
def test_a_request_reuses_the_longest_cached_chain_and_computes_the_rest():
    kv = PrefixCachingBlockManager(num_blocks=20, block_size=4)
    first = request_with_keys(0, 16, [1, 2, 3, 4])
    assert admit(kv, first) == 0
    finish(kv, first)
    second = request_with_keys(1, 14, [1, 2, 9])   # shares two blocks, then differs
    assert admit(kv, second) == 8
    assert second.num_computed_tokens == 8 and second.num_cached_tokens == 8
    assert second.block_ids[:2].tolist() == first_blocks(kv, [1, 2])
    kv.check()


def first_blocks(kv: PrefixCachingBlockManager, keys) -> list:
    return [int(kv.block_of_key[k]) for k in keys]


def test_the_last_prompt_token_is_always_computed():
    kv = PrefixCachingBlockManager(num_blocks=20, block_size=4)
    first = request_with_keys(0, 8, [1, 2])
    admit(kv, first)
    finish(kv, first)
    again = request_with_keys(1, 8, [1, 2])   # the same prompt: 7 tokens could be reused, one block is
    assert admit(kv, again) == 4
    assert again.num_pending_tokens == 4


def test_shared_blocks_are_reference_counted():
    kv = PrefixCachingBlockManager(num_blocks=10, block_size=4)
    a = request_with_keys(0, 9, [1, 2])
    admit(kv, a)
    b = request_with_keys(1, 9, [1, 2])
    assert admit(kv, b) == 8                      # a is still running: its blocks are shared
    shared = first_blocks(kv, [1, 2])
    assert kv.ref_count[shared].tolist() == [2, 2]
    assert kv.num_free_blocks == 10 - 4           # a: 3 blocks, b: 1 of its own
    finish(kv, a)
    assert kv.ref_count[shared].tolist() == [1, 1] and kv.num_evictable == 0
    finish(kv, b)
    assert kv.num_evictable == 2 and kv.num_free_blocks == 10
    kv.check()


def test_keyless_free_blocks_are_used_before_cached_ones_are_evicted():
    kv = PrefixCachingBlockManager(num_blocks=6, block_size=4)
    a = request_with_keys(0, 9, [1, 2])           # 3 blocks, 2 keyed
    admit(kv, a)
    finish(kv, a)
    assert kv.num_evictable == 2 and kv.num_keyless_free == 4
    b = Request(1, 0.0, 16, 1)                    # 4 keyless blocks: takes the 4 free ones
    admit(kv, b)
    assert kv.num_evictions == 0 and kv.num_evictable == 2
    c = Request(2, 0.0, 4, 1)                     # one more: the pool must evict
    admit(kv, c)
    assert kv.num_evictions == 1
    kv.check()


def test_eviction_is_least_recently_freed_first_and_a_chain_loses_its_tail_first():
    kv = PrefixCachingBlockManager(num_blocks=6, block_size=4)
    old = request_with_keys(0, 9, [1, 2])
    admit(kv, old)
    finish(kv, old)                               # freed first: keys 2 then 1 in the LRU order
    new = request_with_keys(1, 9, [7, 8])
    admit(kv, new)
    finish(kv, new)
    filler = Request(2, 0.0, 8, 1)                # 2 keyless free blocks left: no eviction yet
    admit(kv, filler)
    taker = Request(3, 0.0, 4, 1)                 # evicts the oldest: the tail of the old chain
    admit(kv, taker)
    assert kv.block_of_key[2] == -1 and kv.block_of_key[1] >= 0 and kv.block_of_key[7] >= 0
    probe = request_with_keys(4, 9, [1, 2])
    hit = kv.lookup(probe)
    assert hit is not None and len(hit.block_ids) == 1
    kv.check()


def test_a_hit_on_a_free_block_takes_it_out_of_the_eviction_order():
    kv = PrefixCachingBlockManager(num_blocks=4, block_size=4)
    a = request_with_keys(0, 5, [1])
    admit(kv, a)
    finish(kv, a)
    b = request_with_keys(1, 5, [1])
    assert admit(kv, b) == 4
    assert kv.num_evictable == 0 and kv.num_free_blocks == 2
    c = Request(2, 0.0, 8, 1)                     # needs every free block: the hit block must stay
    admit(kv, c)
    assert kv.block_of_key[1] >= 0 and kv.num_evictions == 0
    kv.check()


def test_a_hit_that_does_not_fit_changes_nothing():
    kv = PrefixCachingBlockManager(num_blocks=4, block_size=4)
    a = request_with_keys(0, 9, [1, 2])
    admit(kv, a)
    finish(kv, a)
    hog = Request(1, 0.0, 4, 1)
    admit(kv, hog)                                # 1 free keyless block left, 2 evictable
    big = request_with_keys(2, 20, [1, 2])        # reuses 2 blocks, needs 3 more: does not fit
    hit = kv.lookup(big)
    assert not kv.allocate(big, big.num_pending_tokens - 8, hit)
    assert big.num_computed_tokens == 0 and big.block_ids is None and kv.num_evictable == 2
    kv.check()


def test_a_block_computed_twice_concurrently_stays_private():
    kv = PrefixCachingBlockManager(num_blocks=10, block_size=4)
    a = request_with_keys(0, 9, [1, 2])
    b = request_with_keys(1, 9, [1, 2])
    admit(kv, a)
    # b was looked up before a published its blocks: it computes its own copies
    assert kv.allocate(b, 9, None)
    assert kv.block_of_key[1] == a.block_ids[0]
    assert kv.key_of[b.block_ids[0]] == -1
    finish(kv, b)
    assert kv.num_evictable == 0                  # b's copies are plain free blocks
    kv.check()


def test_without_keys_it_allocates_as_the_counting_manager():
    counting, paged = BlockManager(8, 4), PrefixCachingBlockManager(8, 4)
    for kv in (counting, paged):
        r = Request(0, 0.0, 10, 5)
        assert kv.lookup(r) is None
        assert kv.allocate(r, 10) and kv.num_free_blocks == 5
        kv.grow_to(r, 14)
        assert kv.num_free_blocks == 4 and r.num_blocks == 4
        assert not kv.allocate(Request(1, 0.0, 20, 1), 20)
    assert sorted(r.block_ids.tolist()) == [0, 1, 2, 3]
    assert isinstance(make_block_manager(4, 4, False), BlockManager)
    assert isinstance(make_block_manager(4, 4, True), PrefixCachingBlockManager)


# -- in the simulator --------------------------------------------------------------------------------
def sequential_trace(prompts, ids, block_tokens=16, output=3):
    """Requests one second apart: each finishes before the next arrives."""
    return make_trace(np.arange(len(prompts), dtype=float), prompts, [output] * len(prompts),
                      prefix_hash_ids=ids, prefix_block_tokens=block_tokens)


def test_an_unbounded_cache_hits_what_the_trace_statistics_allow():
    # sequential requests, trace blocks = KV blocks, prompts one token past a block boundary
    rng = np.random.default_rng(3)
    ids, prompts, next_id = [], [], 1000
    for _ in range(30):
        shared = list(range(int(rng.integers(0, 6))))           # a chain of shared ids 0..k-1
        own = list(range(next_id, next_id + int(rng.integers(1, 4))))
        next_id += len(own)
        ids.append(shared + own)
        prompts.append(16 * len(ids[-1]) + 1)
    trace = sequential_trace(prompts, ids)
    result = simulate(trace, MODEL, SimConfig(scheduler="vllm", block_size=16))
    expected = unbounded_prefix_hits(trace)
    assert result.requests["num_cached_tokens"].tolist() == expected.tolist()
    assert result.summary["prefix_hit_rate"] == pytest.approx(expected.sum() / trace.num_prompt_tokens.sum())
    assert expected.sum() > 0


def test_caching_cuts_the_prefill_of_a_shared_prefix():
    trace = sequential_trace([16 * 20 + 5] * 2, [list(range(20)), list(range(20))])
    on = simulate(trace, MODEL, SimConfig(scheduler="sarathi", prefix_caching=True))
    off = simulate(trace, MODEL, SimConfig(scheduler="sarathi", prefix_caching=False))
    assert on.requests["num_cached_tokens"].tolist() == [0, 320]
    assert off.requests["num_cached_tokens"].tolist() == [0, 0]
    assert on.requests["ttft_ms"][1] < off.requests["ttft_ms"][1]
    assert on.steps["num_tokens"].sum() == off.steps["num_tokens"].sum() - 320
    assert off.summary["prefix_hit_rate"] is None and on.summary["prefix_caching"] is True


def test_prefix_caching_is_on_by_default_for_vllm_only():
    assert SimConfig(scheduler="vllm").uses_prefix_caching
    assert not SimConfig(scheduler="sarathi").uses_prefix_caching
    assert not SimConfig(scheduler="vllm", prefix_caching=False).uses_prefix_caching


def test_a_trace_without_ids_simulates_the_same_with_caching_on_or_off():
    trace = make_trace(np.linspace(0, 0.2, 40), np.arange(40) * 7 + 30, np.arange(40) % 9 + 50)
    sim = Simulation(trace, MODEL, SimConfig(kv_blocks=40, prefix_caching=True))
    assert type(sim.replicas[0].kv) is BlockManager   # nothing to reuse: the faster counting manager
    paged = PrefixCachingBlockManager(40, 16)           # ... gives the same as the paged one
    sim.replicas[0].kv = sim.replicas[0].scheduler.kv = paged
    on = sim.run()
    off = simulate(trace, MODEL, SimConfig(kv_blocks=40, prefix_caching=False))
    assert on.requests.equals(off.requests) and on.steps.equals(off.steps)
    assert on.summary["num_preemptions"] > 0          # the small cache was exercised


# -- properties ---------------------------------------------------------------------------------------
class _CheckedManager(PrefixCachingBlockManager):
    """Checks every invariant after every change."""

    def allocate(self, request, num_new_tokens, hit=None):
        before = request.num_output_tokens
        ok = super().allocate(request, num_new_tokens, hit)
        assert request.num_output_tokens == before
        self.check()
        return ok

    def grow_to(self, request, num_tokens):
        super().grow_to(request, num_tokens)
        self.check()

    def free(self, request):
        super().free(request)
        self.check()


@st.composite
def shared_prefix_workloads(draw):
    n = draw(st.integers(2, 20))
    block_tokens = draw(st.sampled_from([4, 8, 16]))
    num_prefixes = draw(st.integers(1, 3))
    ids, prompts, next_id = [], [], 100
    for _ in range(n):
        shared = [p * 10 + k for p in [draw(st.integers(0, num_prefixes - 1))] for k in range(draw(st.integers(0, 4)))]
        own = list(range(next_id, next_id + draw(st.integers(0, 3))))
        next_id += len(own)
        chain = shared + own
        prompts.append(max(1, block_tokens * len(chain) - draw(st.integers(0, block_tokens - 1))))
        ids.append(chain)
    outputs = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    gaps = draw(st.lists(st.floats(0.0, 0.3), min_size=n, max_size=n))
    block_size = draw(st.sampled_from([2, 4, 8, 16]))
    need = max(-(-(p + o - 1) // block_size) for p, o in zip(prompts, outputs))
    config = SimConfig(
        scheduler=draw(st.sampled_from(sorted(SCHEDULERS))), block_size=block_size,
        kv_blocks=need + draw(st.integers(0, 2 * need)), prefix_caching=True,
        num_replicas=draw(st.integers(1, 2)),
        scheduler_config=SchedulerConfig(max_num_seqs=draw(st.integers(1, 6)),
                                         max_num_batched_tokens=draw(st.integers(8, 128)),
                                         chunk_size=draw(st.integers(1, 32))))
    trace = make_trace(np.cumsum(gaps), prompts, outputs, prefix_hash_ids=ids, prefix_block_tokens=block_tokens)
    return trace, config


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_workloads())
def test_prefix_caching_invariants(workload):
    """Reference counts never go negative, nothing in use is evictable, blocks are conserved (checked
    after every change), a hit never changes a request's output, and the fast path changes nothing."""
    trace, config = workload
    sim = Simulation(trace, MODEL, config)
    for replica in sim.replicas:
        checked = _CheckedManager(replica.kv.num_blocks, replica.kv.block_size)
        replica.kv = replica.scheduler.kv = checked
    result = sim.run()
    req = result.requests
    assert req["finish_s"].notna().all()
    for r in sim.requests:
        assert r.num_generated_tokens == r.num_output_tokens
        assert 0 <= r.num_cached_tokens < r.num_prompt_tokens
        assert r.num_cached_tokens % config.block_size == 0
    for replica in sim.replicas:
        assert replica.kv.num_free_blocks == replica.kv.num_blocks
        assert (replica.kv.ref_count == 0).all()
    # every prompt token is either reused or computed (recomputes after preemption add more)
    computed = result.steps["num_tokens"].sum()
    assert computed >= (req["num_prompt_tokens"] + req["num_output_tokens"] - 1 - req["num_cached_tokens"]).sum()
    slow = simulate(trace, MODEL, SimConfig(**{**config.__dict__, "fast_path": False}))
    assert slow.requests.equals(req) and slow.steps.equals(result.steps)
