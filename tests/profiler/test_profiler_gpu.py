"""The CUDA path on a real GPU (skipped without CUDA): events, graphs, OOM, a small sweep."""
import json

import pandas as pd
import pytest
import torch

from stepcal.core.model_spec import PRESETS
from stepcal.profiler.grid import expand_grid
from stepcal.profiler.model import build_model, greedy_generate
from stepcal.profiler.point import Point
from stepcal.profiler.sweep import PointMeasurer, SweepConfig, run_sweep
from stepcal.profiler.timing import CudaTimer, TimingPolicy, cuda_graph_run, measure

pytestmark = pytest.mark.gpu
TINY = PRESETS["tiny"]


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_model_on_cuda_matches_chunked_and_batched_runs(preset):
    spec = PRESETS[preset]
    model = build_model(spec, device="cuda", dtype="float32", seed=1)
    tokens = torch.randint(0, spec.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    reference = greedy_generate(model, tokens, 6)
    assert greedy_generate(model, tokens, 6, chunk_size=7) == reference
    whole = model.forward_step([tokens], [model.new_cache()], [True])
    cache = model.new_cache()
    model.forward_step([tokens[:25]], [cache], [False])
    out = model.forward_step([tokens[:3], tokens[25:]], [model.new_cache(), cache], [True, True])
    torch.testing.assert_close(out[1], whole[0], atol=1e-3, rtol=1e-3)


def test_small_cuda_moe_sweep(tmp_path):
    spec = PRESETS["tiny-moe"]
    source = {"timing": {"max_point_s": 0.05},
              "gemm": {"m": [1, 64], "names": ["router", "shared_gate_up_proj"]},
              "moe": {"num_tokens": [1, 64, 1024], "distributions": ["balanced", "power_law_1.01"]},
              "step": {"batches": [{"num_prefill": 1, "q": 32, "num_decode": 3, "decode_s": 64}]}}
    config = SweepConfig(spec=spec, device="cuda", dtype="bfloat16", ops=("gemm", "moe", "step"),
                         grid=expand_grid("g", source, spec))
    result = run_sweep(config, tmp_path, progress=False)
    assert result.complete and result.num_failed == 0 and result.num_points == 11
    frame = pd.read_parquet(tmp_path / "profile.parquet")
    assert (frame["time_ms_p10"] <= frame["time_ms"]).all() and (frame["time_ms"] <= frame["time_ms_p90"]).all()


def test_bfloat16_model_on_cuda_runs():
    model = build_model(TINY, device="cuda", seed=0)
    assert model.dtype == torch.bfloat16
    out = model.forward_step([torch.arange(9)], [model.new_cache()], [True])
    assert out.shape == (1, TINY.vocab_size) and torch.isfinite(out.float()).all()


def test_cuda_events_and_graph_replay_time_a_gemm():
    a = torch.randn(64, 256, device="cuda")
    b = torch.randn(256, 256, device="cuda")
    eager = measure(lambda i: a @ b, CudaTimer(), TimingPolicy(max_point_s=0.2, cuda_graphs=False))
    graphed = measure(lambda i: a @ b, CudaTimer(), TimingPolicy(max_point_s=0.2, min_sample_ms=0.1,
                                                                cuda_graph_below_ms=1.0),
                      graph=cuda_graph_run)
    for m in (eager, graphed):
        assert 0 < m.time_ms_p10 <= m.time_ms <= m.time_ms_p90
    assert graphed.inner_repeats > 1


def test_real_out_of_memory_is_recorded_and_memory_freed(monkeypatch):
    grid = expand_grid("g", {"gemm": {"m": [1], "names": ["o_proj"]}}, TINY)
    config = SweepConfig(spec=TINY, device="cuda", dtype="bfloat16", ops=("attn_decode",), grid=grid)
    measurer = PointMeasurer(config)
    monkeypatch.setattr("stepcal.profiler.ops.estimate_bytes", lambda point, ctx: 0)   # skip the pre-check
    before = torch.cuda.memory_allocated()
    free, _ = torch.cuda.mem_get_info()
    # K takes 70% of the free memory and is allocated, V then runs out: K must be freed again.
    tokens = int(0.7 * free / (TINY.kv_size * 2))
    row = measurer.measure_row(Point("attn_decode", "case", q_lens=(1,), kv_lens=(tokens,)))
    assert row["status"] == "failed" and row["error"].startswith("out of memory")
    assert torch.cuda.memory_allocated() == before


def test_small_cuda_sweep_records_the_gpu(tmp_path):
    source = {"timing": {"max_point_s": 0.05},
              "gemm": {"m": [1, 64], "names": ["qkv_proj", "lm_head"]},
              "attn_prefill": {"num_seqs": [2], "q": [16], "s": [0, 64]},
              "attn_decode": {"num_seqs": [4], "s": [128], "patterns": ["uniform", "log_uniform"]},
              "step": {"batches": [{"num_prefill": 1, "q": 32, "num_decode": 3, "decode_s": 64}]},
              "overhead": {"num_seqs": [4], "s": [64]}}
    grid = expand_grid("g", source, TINY)
    config = SweepConfig(spec=TINY, device="cuda", dtype="bfloat16", ops=tuple(sorted({p.op for p in grid.points})),
                         grid=grid)
    result = run_sweep(config, tmp_path, progress=False)
    assert result.complete and result.num_failed == 0
    frame = pd.read_parquet(tmp_path / "profile.parquet")
    assert set(frame["device_name"]) == {torch.cuda.get_device_name()}
    assert (frame["time_ms_p10"] <= frame["time_ms"]).all() and (frame["time_ms"] <= frame["time_ms_p90"]).all()
    hardware = json.loads((tmp_path / "meta.json").read_text())["hardware"]
    assert hardware["gpu_name"] and hardware["cuda_version"]
