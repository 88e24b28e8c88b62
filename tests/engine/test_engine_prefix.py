"""The paged engine reuses cached prefix blocks for real: a hit changes which K/V are computed,
never what a request generates, and the engine reuses exactly what the simulator says it does.

Tolerances: where a run computes the same tensors in the same shapes as its reference, outputs
are compared with torch.equal. Where a cache hit, a preemption or another batch changes the
shapes a token's K/V are computed in (a 22-token chunk over a 48-token cached prefix instead of a
70-token prompt; GEMMs over other rows), fp32 sums round differently, so logits are compared with
allclose at atol = rtol = 1e-5 (observed differences: about 2e-6) and tokens exactly.
"""
import numpy as np
import pytest
import torch

from stepcal.core.model_spec import PRESETS
from stepcal.core.run_meta import RunMeta
from stepcal.core.trace import Trace
from stepcal.profiler.engine import Engine, EngineConfig
from stepcal.profiler.engine.engine import prompt_tokens
from stepcal.profiler.engine.measure import _run_setting, engine_meta
from stepcal.profiler.engine.paged import PagedKVCache, token_slots
from stepcal.profiler.model import build_model
from stepcal.simulator.request import make_requests
from stepcal.simulator.schedulers import SchedulerConfig
from stepcal.simulator.simulation import SimConfig, Simulation
from stepcal.simulator.step_model import ConstStepModel
from tests.simulator.factories import make_trace, random_trace

FP32 = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(scope="module", params=["tiny", "tiny-moe"])
def model(request):
    torch.set_num_threads(1)
    return build_model(PRESETS[request.param], seed=3)


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return build_model(PRESETS["tiny"], seed=3)


def prefix_trace(arrivals, prompts, outputs, ids) -> Trace:
    return Trace.from_arrays(np.asarray(arrivals, dtype=float), np.asarray(prompts), np.asarray(outputs),
                             prefix_hash_ids=ids, prefix_block_tokens=16, source="test")


def serve(model, trace, scheduler="vllm", **kw):
    config_kw = {k: kw.pop(k) for k in ("max_num_seqs", "max_num_batched_tokens", "chunk_size") if k in kw}
    engine = Engine(model, trace, EngineConfig(scheduler=scheduler, keep_outputs=True,
                                               scheduler_config=SchedulerConfig(**config_kw), **kw))
    return engine, engine.run()


def assert_same_outputs(run, reference, exact: bool, name: str) -> None:
    assert run.tokens == reference.tokens, name
    for rid, logits in reference.last_logits.items():
        if exact:
            assert torch.equal(run.last_logits[rid], logits), (name, rid)
        else:
            torch.testing.assert_close(run.last_logits[rid], logits, **FP32, msg=f"{name}: request {rid}")


# Two requests sharing a 48-token prefix (three 16-token trace blocks), then different tokens.
SHARED = dict(prompts=[60, 70], outputs=[5, 6], ids=[[1, 2, 3, 4], [1, 2, 3, 5, 6]])


def test_a_cache_hit_changes_no_token(model):
    together, later = [0.0, 0.0], [0.0, 30.0]    # later: the second arrives after the first finished
    runs = {}
    for name, arrivals, caching, copies in [("off", together, False, None), ("off, later", later, False, None),
                                            ("same step", together, True, True), ("same step, gather", together, True, False),
                                            ("later", later, True, True), ("later, gather", later, True, False)]:
        _, runs[name] = serve(model, prefix_trace(arrivals, **SHARED), prefix_caching=caching, kv_read_copies=copies)
    for name, run in runs.items():
        assert run.requests["num_cached_tokens"].tolist() == ([0, 48] if "off" not in name else [0, 0]), name
        assert run.steps["num_tokens"].sum() == 60 + 70 + 5 + 6 - 2 - (48 if "off" not in name else 0), name
        assert_same_outputs(run, runs["off"], exact=False, name=name)
    # the hit is read from blocks written in the very step it is admitted in, or cached since
    assert runs["same step"].steps["num_seqs"].iloc[0] == 2 and runs["later"].steps["num_seqs"].iloc[0] == 1
    # reading through copies or gathering every step: the same bits
    assert_same_outputs(runs["same step, gather"], runs["same step"], exact=True, name="gather")
    assert_same_outputs(runs["later, gather"], runs["later"], exact=True, name="gather")
    summary = runs["later"].summary
    assert summary["prefix_caching"] is True and summary["prefix_hit_rate"] == pytest.approx(48 / 130)


def test_recompute_after_preemption_under_caching_gives_the_same_tokens(tiny):
    trace = prefix_trace([0.0] * 3, [40, 40, 40], [20, 20, 20], [[1, 2, 3], [1, 2, 4], [1, 2, 5]])
    engine, tight = serve(tiny, trace, kv_blocks=13, block_size=8, prefix_caching=True)
    assert tight.summary["num_preemptions"] == 1
    # the preempted request came back on its own cached blocks: more reuse than first admissions had
    assert engine.kv.num_hit_tokens > tight.requests["num_cached_tokens"].sum() == 64
    _, roomy = serve(tiny, trace, block_size=8, prefix_caching=True)
    _, uncached = serve(tiny, trace, block_size=8, prefix_caching=False)
    assert roomy.summary["num_preemptions"] == uncached.summary["num_preemptions"] == 0
    assert_same_outputs(tight, roomy, exact=False, name="preempted vs not")
    assert_same_outputs(tight, uncached, exact=False, name="preempted vs no caching")


# A small prefix tree: a shared 32-token system prompt, conversations extending each other.
TREE = dict(prompts=[60, 70, 40, 90, 30, 95], outputs=[5, 6, 9, 4, 7, 3],
            ids=[[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 7], [1, 2, 3, 4, 8, 9], [10, 11], [1, 2, 3, 5, 6, 12]])


@pytest.mark.parametrize("arrivals, scheduler, kv_blocks, max_tokens", [
    ([0.0, 100.0, 200.0, 300.0, 400.0, 500.0], "vllm", None, None),   # one at a time: the order cannot differ
    ([0.0] * 6, "vllm", 24, 64),          # together, chunked: hits within a step, evictions
    ([0.0] * 6, "sarathi", 14, None),     # together, a cache too small to keep every prefix
])
def test_the_engine_reuses_what_the_simulator_reuses(tiny, arrivals, scheduler, kv_blocks, max_tokens):
    """Arrivals at one instant or far apart leave nothing to the virtual clock's measured step
    times, so the engine and the simulator see the same events in the same order."""
    trace = prefix_trace(arrivals, **TREE)
    sched = SchedulerConfig(max_num_batched_tokens=max_tokens) if max_tokens else SchedulerConfig()
    _, run = serve(tiny, trace, scheduler, kv_blocks=kv_blocks, block_size=8, prefix_caching=True,
                   **({"max_num_batched_tokens": max_tokens} if max_tokens else {}))
    sim = Simulation(trace, ConstStepModel(1.0), SimConfig(scheduler=scheduler, scheduler_config=sched, block_size=8,
                                                           kv_blocks=kv_blocks, prefix_caching=True)).run()
    cached = run.requests["num_cached_tokens"].tolist()
    assert cached == sim.requests["num_cached_tokens"].tolist() and sum(cached) > 0
    assert run.steps["num_tokens"].tolist() == sim.steps["num_tokens"].tolist()
    for key in ("num_preemptions", "num_prefix_evictions", "num_cached_tokens", "prefix_hit_rate"):
        assert run.summary[key] == sim.summary[key], key
    if kv_blocks is not None:
        assert run.summary["num_prefix_evictions"] > 0


def reference_generate(model, prompt: list[int], num_new_tokens: int):
    """Greedy decoding of one sequence over a contiguous KVCache (the engine's former path):
    its tokens and the logits the last one was drawn from."""
    cache = model.new_cache()
    logits = model.forward_step([torch.tensor(prompt)], [cache], [True])[0]
    tokens = [int(logits.argmax())]
    while len(tokens) < num_new_tokens:
        logits = model.forward_step([torch.tensor(tokens[-1:])], [cache], [True])[0]
        tokens.append(int(logits.argmax()))
    return tokens, logits


@pytest.mark.parametrize("read_copies", [True, False])
def test_without_caching_the_paged_engine_computes_what_contiguous_caches_compute(model, read_copies):
    """Each request alone, its prompt in one step: the shapes of the reference, so the same bits."""
    trace = make_trace([0.0, 0.0, 0.001, 0.002, 0.003, 0.004], [37, 5, 64, 20, 1, 50], [6, 9, 4, 12, 5, 7])
    engine, run = serve(model, trace, "static", max_num_seqs=1, prefix_caching=False, kv_read_copies=read_copies)
    for request in engine.requests:
        prompt = engine.token_ids[request.request_id][:request.num_prompt_tokens]
        tokens, logits = reference_generate(model, prompt, request.num_output_tokens)
        assert run.tokens[request.request_id] == tokens
        assert torch.equal(run.last_logits[request.request_id], logits)


def test_prompt_tokens_follow_the_prefix_ids():
    ids = [[7, 8, 9], [7, 8, 10], []]
    trace = prefix_trace([0.0] * 3, [40, 35, 20], [1, 1, 1], ids)
    requests, _ = make_requests(trace, 16, None)
    tokens = {rid: np.array(t) for rid, t in prompt_tokens(requests, trace, seed=5, vocab_size=2048).items()}
    assert (tokens[0][:32] == tokens[1][:32]).all()               # ids 7, 8: the same 32 tokens
    assert (tokens[0][32:35] != tokens[1][32:35]).any()           # ids 9 and 10 differ
    plain = make_trace([0.0] * 3, [40, 35, 20], [1, 1, 1])        # no ids: the tokens of before
    before = prompt_tokens(requests, plain, seed=5, vocab_size=2048)
    expected = {r.request_id: np.random.default_rng([5, r.request_id]).integers(0, 2048, r.num_prompt_tokens).tolist()
                for r in requests}
    assert before == expected
    assert tokens[2].tolist() == expected[2]                      # a request without ids keeps its own
    partial = prefix_trace([0.0], [20], [1], [[7, 11]])           # block 7 in full, 4 tokens of block 11
    (request,), _ = make_requests(partial, 16, None)
    assert prompt_tokens([request], partial, seed=5, vocab_size=2048)[0][:16] == tokens[0][:16].tolist()


def test_token_slots_follow_the_block_tables():
    tables = [[5, 2, 9], [0, 3]]
    # sequence 0: tokens 6..9 (blocks 2 at 6, 7 and 9 at 8, 9 with 4-token blocks); sequence 1: token 4
    slots = token_slots(tables, np.array([6, 4]), np.array([4, 1]), block_size=4)
    assert slots.tolist() == [2 * 4 + 2, 2 * 4 + 3, 9 * 4 + 0, 9 * 4 + 1, 3 * 4 + 0]
    with pytest.raises(RuntimeError, match=r"sequences \[1\]"):
        token_slots(tables, np.array([0, 4]), np.array([1, 5]), block_size=4)


def test_the_pool_grows_keeping_its_blocks(tiny):
    pool = PagedKVCache.for_model(tiny, block_size=4, max_blocks=1000, read_copies=False)
    pool.reserve(3)
    pool.data.normal_()
    kept = pool.data.clone()
    pool.reserve(200)
    assert pool.num_blocks == 200 and torch.equal(pool.data[:, :len(kept[0])], kept)
    with pytest.raises(ValueError, match="outside the pool"):
        pool.reserve(1001)


def test_the_measured_run_records_prefix_caching():
    spec = PRESETS["tiny"]
    meta = {s: engine_meta(spec, EngineConfig(scheduler=s), device="cpu", dtype="float32", num_threads=1,
                           trace_source="t", repeats=1, fingerprint={}).prefix_caching for s in ("vllm", "sarathi")}
    assert meta == {"vllm": True, "sarathi": False}
    assert engine_meta(spec, EngineConfig(scheduler="vllm", prefix_caching=False), device="cpu", dtype="float32",
                       num_threads=1, trace_source="t", repeats=1, fingerprint={}).prefix_caching is False
    # runs written before the key existed ran without prefix caching, even under vllm
    assert _run_setting(RunMeta.from_dict({"scheduler": "vllm"}), "prefix_caching") is False
    assert _run_setting(RunMeta.from_dict({"scheduler": "vllm", "prefix_caching": True}), "prefix_caching") is True


# -- clients: closed-loop turns and timeouts (as the simulator's, simulator.client) ------------------
def session_trace(**columns) -> Trace:
    """Session 5: turn 0 (40 tokens), turn 1 a second after it finished, whose prompt extends turn 0's
    (ids 1 2 then its own); request 2 alone."""
    return Trace.from_arrays(np.array([0.0, 0.0, 0.0]), np.array([40, 60, 16]), np.array([4, 3, 2]),
                             prefix_hash_ids=[[1, 2, 3], [1, 2, 4, 5], []], prefix_block_tokens=16,
                             source="test", session_id=np.array([5, 5, 6]), turn=np.array([0, 1, 0]),
                             think_time_s=np.array([np.nan, 1.0, np.nan]), **columns)


def test_a_closed_loop_turn_is_served_a_think_time_after_the_previous_answer(tiny):
    _, run = serve(tiny, session_trace(), prefix_caching=True)
    req = run.requests.set_index("request_id")
    assert req.loc[1, "arrival_s"] == pytest.approx(req.loc[0, "finish_s"] + 1.0)
    assert req.loc[1, "num_cached_tokens"] == 32          # turn 0's two full blocks
    sim = Simulation(session_trace(), ConstStepModel(1.0), SimConfig(prefix_caching=True)).run()
    assert sim.requests["num_cached_tokens"].tolist() == run.requests["num_cached_tokens"].tolist()


def test_the_engine_aborts_a_request_its_client_gave_up_on(tiny):
    # one request at a time: request 2 waits behind request 0 and gives up (its deadline passes during
    # the first step); request 0 finishes well within its 10 s
    trace = session_trace(timeout_s=np.array([10.0, np.nan, 1e-4]))
    engine, run = serve(tiny, trace, max_num_seqs=1, prefix_caching=True, timeout_s=None)
    req = run.requests.set_index("request_id")
    assert req["timed_out"].tolist() == [False, False, True] and run.summary["num_timeouts"] == 1
    assert np.isnan(req.loc[2, "first_token_s"])
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    assert all(r.status.name in ("FINISHED", "ABORTED") for r in engine.requests)
    assert (req["finish_s"].notna() ^ req["timed_out"]).all()


def test_the_next_turn_reuses_the_answer_as_the_simulator_says(model):
    """One session of three turns: each turn's prompt quotes the previous answer, so with caching the
    next turn reuses the previous turn's prompt and answer blocks; engine and simulator agree, and
    the tokens are those of a run without caching."""
    from stepcal.core.workload import load_workload
    trace = load_workload("poisson:rate=1,n=1,system=40,turns=fixed:3,think=1,prompt=fixed:20,"
                          "output=fixed:40,seed=2")
    engine, on = serve(model, trace, prefix_caching=True)
    _, off = serve(model, trace, prefix_caching=False)
    assert on.tokens == off.tokens
    sim = Simulation(trace, ConstStepModel(1.0), SimConfig(prefix_caching=True)).run()
    cached = on.requests["num_cached_tokens"].tolist()
    assert cached == sim.requests["num_cached_tokens"].tolist()
    prompts = on.requests["num_prompt_tokens"].tolist()
    # turn k's KV (prompt + all answer tokens but the last) in full 16-token blocks is reused by turn k+1
    assert cached[1:] == [(p + 40 - 1) // 16 * 16 for p in prompts[:-1]]
    # each answer is what the next turn's prompt quotes, and each prompt starts with the previous one
    ids = on.requests["request_id"].tolist()
    for turn, following, prompt in zip(ids, ids[1:], prompts):
        stream = engine.token_ids[following]
        assert on.tokens[turn] == stream[prompt:prompt + 40]
        assert engine.token_ids[turn][:prompt] == stream[:prompt]


def test_a_read_copy_is_allocated_for_its_whole_request_at_once(tiny):
    pool = PagedKVCache.for_model(tiny, block_size=4, max_blocks=100, read_copies=True)
    table = list(range(7))
    pool.step_kv([0], [table], [0], [10], max_tokens=[25])          # the prefill of a 10 + 16 token request
    copy = pool.read_copies[0]
    keys = copy.k
    assert copy.capacity == 25
    for s in range(10, 25):                                          # its decodes, as the forward pass leaves them
        copy.length = s
        pool.step_kv([0], [table], [s], [1], max_tokens=[25])
    assert copy.k is keys                                            # never copied again
    pool.step_kv([1], [list(range(7, 14))], [0], [10])               # no length given (a held batch): the step's
    assert pool.read_copies[1].capacity == 10                        # tokens, grown by doubling from there


def test_the_engine_never_grows_a_read_copy(tiny, monkeypatch):
    from stepcal.profiler.model import KVCache
    grown, reserve = [], KVCache.reserve

    def spy(cache, num_tokens):
        if num_tokens > cache.capacity:
            grown.append((cache.capacity, num_tokens))
        reserve(cache, num_tokens)
    monkeypatch.setattr(KVCache, "reserve", spy)
    trace = random_trace(12, rate=200.0, max_prompt=40, max_output=12)
    _, run = serve(tiny, trace, "sarathi", chunk_size=16, kv_read_copies=True)
    assert run.summary["num_finished"] == 12 and not grown
