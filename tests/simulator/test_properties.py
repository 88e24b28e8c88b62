"""Property tests over random traces and configurations (hypothesis)."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepcal.simulator.kv_cache import BlockManager
from stepcal.simulator.schedulers import SCHEDULERS, SchedulerConfig
from stepcal.simulator.simulation import SimConfig, Simulation, simulate
from stepcal.simulator.step_model import LinearStepModel
from tests.simulator.factories import make_trace


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 25))
    gaps = draw(st.lists(st.floats(0.0, 0.2), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    block_size = draw(st.sampled_from([1, 4, 16]))
    need = max(-(-(p + o - 1) // block_size) for p, o in zip(prompts, outputs))
    kv_blocks = need + draw(st.integers(0, 3 * need))          # always room for the largest request
    config = SimConfig(
        scheduler=draw(st.sampled_from(sorted(SCHEDULERS))), block_size=block_size, kv_blocks=kv_blocks,
        num_replicas=draw(st.integers(1, 3)), router=draw(st.sampled_from(["round-robin", "least-tokens"])),
        scheduler_config=SchedulerConfig(max_num_seqs=draw(st.integers(1, 8)),
                                         max_num_batched_tokens=draw(st.integers(8, 256)),
                                         chunk_size=draw(st.integers(1, 64))),
        step_overhead_ms=draw(st.sampled_from([0.0, 0.5])))
    model = LinearStepModel(draw(st.floats(0.5, 20)), draw(st.floats(0, 0.1)), draw(st.floats(0, 0.01)))
    return make_trace(np.cumsum(gaps), prompts, outputs), config, model


class _CheckedBlockManager(BlockManager):
    """Asserts the capacity bound on every allocation."""

    def allocate(self, request, num_new_tokens, hit=None):
        ok = super().allocate(request, num_new_tokens, hit)
        assert 0 <= self.num_free_blocks <= self.num_blocks
        return ok

    def grow_to(self, request, num_tokens):
        super().grow_to(request, num_tokens)
        assert 0 <= self.num_free_blocks <= self.num_blocks


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_invariants(workload):
    trace, config, model = workload
    sim = Simulation(trace, model, config)
    for replica in sim.replicas:
        checked = _CheckedBlockManager(replica.kv.num_blocks, replica.kv.block_size)
        replica.kv = replica.scheduler.kv = checked
    result = sim.run()
    req, steps = result.requests, result.steps
    # every request finishes once, with exactly its output tokens
    assert len(req) == len(trace) and req["finish_s"].notna().all()
    assert sorted(req["request_id"]) == sorted(trace.request_id.tolist())
    for r in sim.requests:
        assert r.num_generated_tokens == r.num_output_tokens
    # all KV blocks are free at the end
    assert all(rep.kv.num_free_blocks == rep.kv.num_blocks for rep in sim.replicas)
    # time never goes back: per request, and per replica's steps
    assert (req["first_token_s"] >= req["arrival_s"]).all() and (req["finish_s"] >= req["first_token_s"]).all()
    for _, s in steps.groupby("replica"):
        start = s["start_s"].to_numpy()
        end = start + s["duration_ms"].to_numpy() / 1000
        assert (np.diff(start) > 0).all() and (start[1:] >= end[:-1] - 1e-9).all()
    # work is conserved: computed tokens = prompt + output - 1, plus whatever preemption recomputed
    assert steps["num_tokens"].sum() >= (req["num_prompt_tokens"] + req["num_output_tokens"] - 1).sum()
    # the same inputs give the same logs, and the fast path changes nothing
    again = simulate(trace, model, config)
    slow = simulate(trace, model, SimConfig(**{**config.__dict__, "fast_path": False}))
    for other in (again, slow):
        assert other.requests.equals(req) and other.steps.equals(steps) and other.summary == result.summary
