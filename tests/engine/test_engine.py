"""The engine is the ground truth: these tests prove its KV caches, masks and bookkeeping."""
import numpy as np
import pytest
import torch

from stepcal.core.model_spec import PRESETS
from stepcal.profiler.engine import Engine, EngineConfig
from stepcal.profiler.model import build_model
from stepcal.simulator.schedulers import SchedulerConfig
from tests.simulator.factories import make_trace


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return build_model(PRESETS["tiny"], seed=3)


@pytest.fixture(scope="module")
def trace():
    # prompts that need several chunks, arrivals close enough to batch
    return make_trace([0.0, 0.0, 0.001, 0.002, 0.003, 0.004], [37, 5, 64, 20, 1, 50], [6, 9, 4, 12, 5, 7])


def serve(model, trace, scheduler, **kw):
    config_kw = {k: kw.pop(k) for k in ("max_num_seqs", "max_num_batched_tokens", "chunk_size") if k in kw}
    return Engine(model, trace, EngineConfig(scheduler=scheduler, keep_outputs=True,
                                             scheduler_config=SchedulerConfig(**config_kw), **kw)).run()


def test_tokens_and_logits_do_not_depend_on_batching_chunking_or_preemption(model, trace):
    alone = serve(model, trace, "static", max_num_seqs=1)          # each request alone, prompt in one step
    assert all(len(alone.tokens[i]) == n for i, n in zip(range(6), [6, 9, 4, 12, 5, 7]))
    variants = {
        "batched": serve(model, trace, "continuous"),
        "chunked by 7": serve(model, trace, "sarathi", chunk_size=7),
        "chunked by 1": serve(model, trace, "vllm", max_num_batched_tokens=1),
        "slo": serve(model, trace, "slo", chunk_size=16),
        "preempted": serve(model, trace, "vllm", kv_blocks=10, block_size=8),
    }
    assert variants["preempted"].summary["num_preemptions"] > 0
    assert (variants["chunked by 7"].steps["num_seqs"] > 1).any()
    for name, run in variants.items():
        assert run.tokens == alone.tokens, name
        for rid, logits in alone.last_logits.items():
            torch.testing.assert_close(run.last_logits[rid], logits, atol=2e-4, rtol=1e-4, msg=name)


def test_moe_model_tokens_and_logits_do_not_depend_on_batching_or_chunking(trace):
    moe_model = build_model(PRESETS["tiny-moe"], seed=3)
    alone = serve(moe_model, trace, "static", max_num_seqs=1)
    variants = {"batched": serve(moe_model, trace, "continuous"),
                "chunked by 7": serve(moe_model, trace, "sarathi", chunk_size=7)}
    assert (variants["chunked by 7"].steps["num_seqs"] > 1).any()
    for name, run in variants.items():
        assert run.tokens == alone.tokens, name
        for rid, logits in alone.last_logits.items():
            torch.testing.assert_close(run.last_logits[rid], logits, atol=2e-4, rtol=1e-4, msg=name)


def test_logs_are_consistent(model, trace):
    run = serve(model, trace, "sarathi", chunk_size=16)
    req, steps = run.requests, run.steps
    assert (req["num_output_tokens"] == [6, 9, 4, 12, 5, 7]).all() and req["finish_s"].notna().all()
    assert ((req["first_token_s"] >= req["arrival_s"]) & (req["finish_s"] >= req["first_token_s"])).all()
    start = steps["start_s"].to_numpy()
    end = start + steps["duration_ms"].to_numpy() / 1000
    gaps = start[1:] - end[:-1]
    assert (gaps >= -1e-12).all()
    # the steps plus the idle gaps between them cover the run from the first arrival to the last finish
    makespan = req["finish_s"].max() - req["arrival_s"].min()
    idle_before = start[0] - req["arrival_s"].min()
    assert steps["duration_ms"].sum() / 1000 + gaps.sum() + idle_before == pytest.approx(makespan, abs=1e-9)
    np.testing.assert_allclose(steps["host_ms"] + steps["device_ms"], steps["duration_ms"], rtol=1e-9)
    assert (steps["device_ms"] > 0).all() and (steps["host_ms"] > 0).all()
    # every token computed once: no preemption here
    assert steps["num_tokens"].sum() == (req["num_prompt_tokens"] + req["num_output_tokens"] - 1).sum()


def test_virtual_clock_skips_idle_gaps_and_wall_clock_waits(model):
    sparse = make_trace([0.0, 30.0], [8, 8], [3, 3])
    run = serve(model, sparse, "vllm", clock="virtual")
    assert run.wall_s < 10 and run.requests["arrival_s"].tolist() == [0.0, 30.0]
    assert run.requests["first_token_s"][1] >= 30.0
    short = make_trace([0.0, 0.3], [8, 8], [2, 2])
    wall = serve(model, short, "vllm", clock="wall")
    assert wall.wall_s >= 0.3 and wall.requests["first_token_s"][1] >= 0.3
