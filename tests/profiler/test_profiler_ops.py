"""Kernel builders and the device-side timing pieces that can be exercised on the CPU."""
import time

import pytest
import torch

from stepcal.core.model_spec import PRESETS
from stepcal.profiler.op_context import OpContext
from stepcal.profiler.ops import build_kernel, estimate_bytes, num_buffer_sets
from stepcal.profiler.point import Point
from stepcal.profiler.sweep import _Repeat, default_timer
from stepcal.profiler.timing import CpuTimer, CudaTimer, HostTimer, TimingPolicy, measure

TINY = PRESETS["tiny"]


def ctx(rotate_bytes=0):
    return OpContext(TINY, "cpu", "float32", seed=3, rotate_bytes=rotate_bytes)


def test_buffer_sets_cover_the_rotation_target():
    assert num_buffer_sets(10, 0) == 1
    assert num_buffer_sets(10, 35) == 4
    assert num_buffer_sets(10, 10**9) == 8              # capped
    assert num_buffer_sets(10**9, 10) == 1


def test_gemm_kernel_rotates_its_buffers(monkeypatch):
    seen = []
    monkeypatch.setattr("stepcal.profiler.ops.F.linear", lambda x, w: seen.append((x.data_ptr(), w.data_ptr())))
    point = Point("gemm", "o_proj", m=4, n=256, k=256)
    set_bytes = (4 * 256 + 256 * 256) * 4
    kernel = build_kernel(point, ctx(rotate_bytes=3 * set_bytes))
    for i in range(6):
        kernel.run(i)
    assert len(set(seen)) == 3 and seen[:3] == seen[3:]
    assert kernel.graph_safe and not kernel.host_side


def test_attention_kernel_runs_again_and_again_on_the_same_inputs():
    point = Point("attn_prefill", "uniform", q_lens=(8, 3), kv_lens=(16, 0))
    kernel = build_kernel(point, ctx())
    kernel.run(0)
    kernel.run(1)                                   # no state carried between calls


def test_overhead_kernel_is_host_side():
    kernel = build_kernel(Point("overhead", "decode", q_lens=(1,) * 4, kv_lens=(9,) * 4), ctx())
    kernel.run(0)
    assert kernel.host_side and isinstance(default_timer("cpu", kernel), CpuTimer)


def test_memory_estimates_grow_with_the_point():
    context = ctx()
    small = estimate_bytes(Point("attn_decode", "uniform", q_lens=(1,), kv_lens=(100,)), context)
    large = estimate_bytes(Point("attn_decode", "uniform", q_lens=(1,), kv_lens=(10_000,)), context)
    assert large > 50 * small
    step = estimate_bytes(Point("step", "decode", q_lens=(1,), kv_lens=(10,)), context)
    assert step >= TINY.num_params * 4                  # the weights, before the model is built
    gemm = estimate_bytes(Point("gemm", "lm_head", m=8, n=2048, k=256), context)
    assert gemm >= (8 * 256 + 2048 * 256) * 4


class FakeEvent:
    """Stands in for torch.cuda.Event: records perf_counter instead of a GPU timestamp."""
    synchronised = 0

    def __init__(self, enable_timing):
        assert enable_timing
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        FakeEvent.synchronised += 1

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def test_cuda_timer_one_sync_per_batch_and_per_call_times(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.synchronised = 0
    calls = []
    times = CudaTimer().samples(lambda i: (calls.append(i), time.sleep(0.001)), 4, 3, 10)
    assert calls == list(range(10, 22))
    assert FakeEvent.synchronised == 1
    assert len(times) == 4 and all(0.9 <= t < 50 for t in times)


def test_host_timer_syncs_before_every_sample():
    syncs = []
    timer = HostTimer(lambda: syncs.append(1))
    calls = []
    times = timer.samples(calls.append, 3, 2, 0)
    assert len(times) == 3 and len(syncs) == 3 and calls == list(range(6))


def test_repeat_fallback_counts_like_a_graph():
    calls = []
    replay = _Repeat(calls.append, 4)
    replay(0)
    replay(1)
    assert calls == list(range(8))
    result = measure(lambda i: None, CpuTimer(), TimingPolicy(max_point_s=0.01, min_sample_ms=0.0,
                                                             cuda_graph_below_ms=1e9),
                     graph=_Repeat)
    assert result.inner_repeats == 1 and result.time_ms >= 0


@pytest.mark.parametrize("op", ["attn_decode", "overhead"])
def test_builders_accept_long_batches(op):
    point = Point(op, "uniform", q_lens=(1,) * 64, kv_lens=tuple(range(1, 65)))
    build_kernel(point, ctx()).run(0)


def test_cpu_kernels_rotate_past_one_cores_l2(tmp_path, monkeypatch):
    """A weight is reused in a step only after megabytes of others: CPU kernels rotate their inputs
    past twice one core's L2, read from sysfs, as CUDA kernels do past the GPU's."""
    import stepcal.profiler.fingerprint as fingerprint
    from stepcal.profiler.sweep import _rotate_bytes
    for name, (level, kind, size) in {"index0": ("1", "Data", "48K"), "index1": ("1", "Instruction", "32K"),
                                      "index2": ("2", "Unified", "2048K"), "index3": ("3", "Unified", "300M")}.items():
        (tmp_path / name).mkdir()
        for field, value in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / name / field).write_text(value + "\n")
    assert fingerprint.cpu_l2_bytes(tmp_path) == 2 * 2**20
    assert fingerprint.cpu_l2_bytes(tmp_path / "absent") is None
    monkeypatch.setattr("stepcal.profiler.sweep.cpu_l2_bytes", lambda: 2 * 2**20)
    assert _rotate_bytes("cpu") == 4 * 2**20
    monkeypatch.setattr("stepcal.profiler.sweep.cpu_l2_bytes", lambda: None)
    assert _rotate_bytes("cpu") == 0
