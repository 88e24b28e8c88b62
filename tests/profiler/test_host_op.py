"""The `host` op: a real engine iteration held at one batch, timed outside its forward; and the
`step` op, which times the forward (and sampling) alone, so that T_step = step + host."""
import pytest
import torch

import stepcal.profiler.engine.probe as probe_module
from stepcal.core.errors import InputError
from stepcal.core.model_spec import PRESETS
from stepcal.profiler.engine.probe import EngineProbe
from stepcal.profiler.op_context import OpContext
from stepcal.profiler.ops import build_kernel
from stepcal.profiler.point import Point
from stepcal.profiler.sweep import default_timer
from stepcal.profiler.timing import SelfTimer, TimingPolicy, measure

TINY = PRESETS["tiny"]


def ctx():
    return OpContext(TINY, "cpu", "float32", seed=3)


def _last_step(probe):
    steps = probe.engine.log.to_frame()
    return steps.iloc[-1]


@pytest.mark.parametrize("q_lens, kv_lens", [((1,) * 6, (40,) * 6), ((70,), (0,)),
                                             ((33, 1, 1, 1), (0, 20, 20, 20))])
def test_probe_runs_real_iterations_of_the_batch_and_returns_the_engines_host_time(q_lens, kv_lens):
    probe = EngineProbe(ctx().model(), q_lens, kv_lens)
    for call in range(3):
        host_ms = probe(call)
        step = _last_step(probe)
        assert host_ms == probe.engine.host_ms[-1] and 0 < host_ms < step["duration_ms"]
        assert (step["num_seqs"], step["num_tokens"]) == (len(q_lens), sum(q_lens))
        # the decodes are at their own KV length, one token more each iteration
        decodes = [s for s in kv_lens if s > 0]
        assert step["decode_kv_sum"] == sum(decodes) + call * len(decodes)


def test_probe_is_rebuilt_before_its_decodes_would_finish(monkeypatch):
    monkeypatch.setattr(probe_module, "GROWTH_STEPS", 3)
    probe = EngineProbe(ctx().model(), (1, 1), (16, 16))
    engines = []     # the engines themselves: a freed engine's id() can come back for the next one
    for call in range(7):
        probe(call)
        if not any(engine is probe.engine for engine in engines):
            engines.append(probe.engine)
        assert _last_step(probe)["num_seqs"] == 2
    assert len(engines) == 3


def test_host_batches_are_decodes_and_fresh_prefills_only():
    with pytest.raises(InputError, match=r"host batch: a host batch holds decodes .* got q=8, s=4"):
        EngineProbe(ctx().model(), (8,), (4,))


def test_host_kernel_times_itself():
    kernel = build_kernel(Point("host", "decode", q_lens=(1, 1), kv_lens=(30, 30)), ctx())
    timer = default_timer("cpu", kernel)
    assert kernel.self_timed and isinstance(timer, SelfTimer)
    result = measure(kernel.run, timer, TimingPolicy(max_point_s=0.05, min_repeats=3, warmup=1))
    assert 0 < result.time_ms < 50


def test_self_timer_averages_what_the_calls_return():
    values = iter([1.0, 3.0, 5.0, 7.0])
    assert SelfTimer().samples(lambda i: next(values), 2, 2, 0) == [2.0, 6.0]


def test_step_op_times_the_engines_device_part_inside_an_engine_where_it_can():
    kernel = build_kernel(Point("step", "decode", q_lens=(1, 1), kv_lens=(8, 9)), ctx())
    assert kernel.self_timed and kernel.run.part == "device"
    device_ms = kernel.run(0)
    assert device_ms == kernel.run.engine.device_ms[-1] > 0


def test_step_op_runs_a_chunk_over_a_prefix_on_the_engines_pool_without_building_inputs(monkeypatch):
    import stepcal.profiler.model as model_module
    context = ctx()
    point = Point("step", "mixed", q_lens=(24, 1), kv_lens=(40, 9))     # no engine holds a chunk at 40
    kernel = build_kernel(point, context)
    assert not kernel.self_timed
    built, outputs = [], []
    monkeypatch.setattr(model_module, "step_inputs", lambda *a: built.append(a))
    original = context.model().run_step

    def capture(inputs):
        assert inputs.kv_lens == [40, 9]
        out = original(inputs)
        outputs.append(out)
        return out

    monkeypatch.setattr(context.model(), "run_step", capture)
    kernel.run(0)
    kernel.run(1)
    assert built == []     # built once when the kernel was: input building is the host op's
    torch.testing.assert_close(outputs[0], outputs[1])   # the read copies rewound: the same batch


def test_a_probe_prefills_its_decodes_within_a_budget_and_its_memory_is_checked_as_a_whole_engine():
    from stepcal.profiler.engine.probe import probe_budget, probe_output_tokens, probe_tokens
    from stepcal.profiler.ops import estimate_bytes
    decodes = [4096] * 512
    budget = probe_budget(decodes, [])
    assert budget == 8192                      # not 2M prompt tokens in one step
    assert probe_output_tokens(decodes, budget) == probe_module.GROWTH_STEPS + 4 + 256
    kv_tokens, step_tokens = probe_tokens((1,) * 512, (4096,) * 512)
    assert kv_tokens >= 512 * (4096 + probe_module.GROWTH_STEPS) and step_tokens == 8192
    big = PRESETS["llama-3-8b"]
    point = Point("host", "decode", q_lens=(1,) * 512, kv_lens=(4096,) * 512)
    # 8B's KV at 128 KiB a token: the engine's pool, not the point's batch, decides
    assert estimate_bytes(point, OpContext(big, "cuda", "bfloat16")) > kv_tokens * 128 * 1024


def test_decodes_still_decode_after_a_warm_up_in_several_steps(monkeypatch):
    monkeypatch.setattr(probe_module, "probe_budget", lambda decode_kv, prefill_q: 64)
    probe = EngineProbe(ctx().model(), (1, 1, 1), (40, 40, 40))
    probe(0)
    assert _last_step(probe)["num_seqs"] == 3 and _last_step(probe)["num_tokens"] == 3
