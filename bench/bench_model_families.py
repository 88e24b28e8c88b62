"""Composed T_step of mixture-of-experts and MLA models on H100, from AIConfigurator's measured kernels
(../shared/data/profiles/aiconfigurator/<system>), with each term's share, the KV blocks that fit,
a roofline floor to sanity-check decode against, and the wall time of a whole-trace simulation.

Cases (issue 14): Mixtral-8x7B TP2 and Qwen3-30B-A3B TP1, decode of 32 sequences at 1k KV and a
2,048-token prefill; DeepSeek-V3 TP8 (experts split 8 ways by tensor parallelism) and TP8 + EP8
(one eighth of the experts per GPU), decode of 64 sequences at 4k KV.

Usage: .venv/bin/python bench/bench_model_families.py [--system h100_sxm] [--regressor rf|tuned]
       [--memory-gb 80] [--no-simulate] [--work DIR] [--only deepseek]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
# name, preset, tp, ep, ops fitted, batches: (label, sequences, new tokens each, KV each)
DECODE_32, PREFILL = ("decode 32 x 1k", 32, 1, 1024), ("prefill 2048", 1, 2048, 0)
CASES = [
    ("mixtral-8x7b TP2", "mixtral-8x7b", 2, 1, "gemm,attn_prefill,attn_decode,all_reduce,moe", [DECODE_32, PREFILL]),
    ("qwen3-30b-a3b TP1", "qwen3-30b-a3b", 1, 1, "gemm,attn_prefill,attn_decode,moe", [DECODE_32, PREFILL]),
    ("deepseek-v3 TP8", "deepseek-v3", 8, 1, "gemm,mla_prefill,mla_decode,all_reduce,moe",
     [("decode 64 x 4k", 64, 1, 4096)]),
    ("deepseek-v3 TP8 EP8", "deepseek-v3", 8, 8, "gemm,mla_prefill,mla_decode,all_reduce,moe",
     [("decode 64 x 4k", 64, 1, 4096)]),
]
HBM_GBPS = {"h100_sxm": 3350.0, "a100_sxm": 2039.0}     # NVIDIA datasheets (H100 SXM5 80GB, A100 SXM4 80GB)


def fit(case, system: str, regressor: str, work: Path) -> Path:
    label, preset, tp, ep, ops, _ = case
    out = work / label.replace(" ", "_")
    if (out / "meta.json").exists():
        return out
    cmd = [sys.executable, "-m", "stepcal.experiments.cli", "fit", "--profile", str(SHARED / "profiles/aiconfigurator" / system),
           "--model-spec", preset, "--tp", str(tp), "--ep", str(ep), "--ops", ops, "--regressor", regressor,
           "--trials", "8", "--no-mlflow", "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
                   stdout=subprocess.DEVNULL)
    print(f"  fitted {label} in {time.perf_counter() - started:.0f} s -> {out}")
    return out


def breakdown(tables: Path, seqs: int, q: int, kv: int) -> tuple[float, dict[str, float]]:
    from stepcal.core.batch import StepBatch
    from stepcal.costmodel.tables import load_step_model
    model = load_step_model(tables)
    batch = StepBatch.of(list(range(seqs)), [q] * seqs, [kv] * seqs)
    parts = {name: float(v[0]) for name, v in model.term_ms(batch.features()).items()}
    return model.step_ms(batch), parts


def linear_split(tables: Path, num_tokens: int) -> dict[str, float]:
    """The `linear` term's operators at num_tokens: ms per step (per-layer time x layers)."""
    import numpy as np
    import pandas as pd
    ops = pd.read_parquet(tables / "ops.parquet")
    out = {}
    for op, rows in ops.groupby("op"):
        rows = rows.sort_values("num_tokens")
        per_layer = np.interp(np.log(num_tokens), np.log(rows["num_tokens"]), rows["time_ms"])
        out[op] = float(per_layer * rows["layers"].iloc[0])
    return out


def roofline_decode_ms(preset: str, tp: int, ep: int, seqs: int, kv: int, system: str) -> float:
    """Bytes one GPU must read per decode step (its dense weights, the experts the batch's tokens
    hit under balanced routing, its KV cache) over HBM bandwidth: a floor, not a prediction."""
    from stepcal.core.model_spec import PRESETS, Parallelism
    spec, p = PRESETS[preset], Parallelism(tp, ep)
    experts = spec.num_experts / p.ep
    hit = experts * (1 - (1 - spec.experts_per_token / spec.num_experts) ** seqs)
    expert_bytes = 3 * spec.hidden_size * spec.expert_ffn_size / p.moe_tp * spec.dtype_bytes
    all_experts = spec.num_moe_layers * experts * expert_bytes
    weights = spec.weight_bytes_per_gpu(p) - all_experts + spec.num_moe_layers * hit * expert_bytes
    kv_bytes = seqs * kv * spec.kv_bytes_per_token_per_gpu(p)
    return (weights + kv_bytes) / (HBM_GBPS[system] * 1e9) * 1e3


def kv_blocks(preset: str, tp: int, ep: int, memory_gb: float) -> str:
    from stepcal.core.errors import InputError
    from stepcal.core.model_spec import PRESETS, Parallelism
    from stepcal.simulator.kv_cache import kv_blocks_from_memory
    spec, p = PRESETS[preset], Parallelism(tp, ep)
    try:
        blocks = kv_blocks_from_memory(spec, 16, memory_gb, parallelism=p)
    except InputError as exc:
        return f"none ({str(exc).split(': ', 1)[1]})"
    return f"{blocks:,} blocks of 16 ({blocks * 16:,} tokens; weights {spec.weight_bytes_per_gpu(p) / 2**30:.1f} GiB/GPU)"


def simulate_azure(tables: Path, memory_gb: float) -> None:
    trace = SHARED / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "stepcal.experiments.cli", "simulate", "--trace", str(trace), "--step-model", str(tables),
               "--scheduler", "vllm", "--model-spec", "mixtral-8x7b", "--tp", "2", "--device-memory-gb",
               str(memory_gb), "--out", str(Path(tmp) / "sim")]
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - started
    print(f"\nAzure conv (19,366 requests), Mixtral-8x7B TP2, vllm scheduler, KV from {memory_gb:g} GB: "
          f"{wall:.1f} s wall (process start included)")
    print("  " + "\n  ".join(done.stdout.strip().splitlines()[-8:]))


# Published measurements to hold predictions against (GPU, configuration, figure, where from).
PUBLISHED = [
    ("mixtral-8x7b TP2", "decode step, 8 sequences at ~100 tokens", (8, 1, 100), 18.2,
     "vLLM CI latency_mixtral8x7B_tp2 on H100: 2,327 ms for batch 8, 32 in / 128 out (/128 steps); "
     "buildkite.com vllm performance-benchmark"),
    ("qwen3-30b-a3b TP1", "TPOT, 10 sequences at ~2.5k tokens", (10, 1, 2560), 13.18,
     "vLLM PR #23151: H100, concurrency 10, 2,048 in / 1,024 out, mean TPOT (prefills mixed in: an upper "
     "bound on the decode step)"),
    ("deepseek-v3 TP8", "TPOT, 64 sequences at ~1.5k tokens", (64, 1, 1536), 34.6,
     "SemiAnalysisAI/InferenceX issue #870: DeepSeek-R1-0528 on 8x H200 (4.8 TB/s, 1.43x H100's "
     "bandwidth), SGLang 0.5.7, concurrency 64, 1k in / 1k out"),
]
MOE_KERNEL_MS = ("mixtral-8x7b TP2", 32, 0.487, "vLLM PR #24700: one fused-MoE call, H100 TP2 bf16, "
                 "E=8 N=7168, batch 32")


def published(tables: dict) -> None:
    print("\nAgainst published measurements:")
    for label, what, (seqs, q, kv), figure_ms, source in PUBLISHED:
        if label not in tables:
            continue
        total, _ = breakdown(tables[label], seqs, q, kv)
        print(f"  {label} {what}: predicted {total:.2f} ms, published {figure_ms:.2f} ms "
              f"({100 * (total / figure_ms - 1):+.0f}%) - {source}")
    label, tokens, figure_ms, source = MOE_KERNEL_MS
    if label not in tables:
        return
    ops = linear_split(tables[label], tokens)
    per_layer = ops["moe_experts"] / 32
    print(f"  {label} one MoE layer at {tokens} tokens: predicted {per_layer:.3f} ms, published {figure_ms:.3f} ms "
          f"({100 * (per_layer / figure_ms - 1):+.0f}%) - {source}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="h100_sxm")
    parser.add_argument("--regressor", default="rf", choices=["rf", "tuned"])
    parser.add_argument("--memory-gb", type=float, default=80.0)
    parser.add_argument("--no-simulate", action="store_true")
    parser.add_argument("--work", default=None, help="keep fitted tables here (reused on a rerun)")
    parser.add_argument("--only", default=None, help="the cases whose label contains this text (e.g. deepseek)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    work = Path(args.work or tempfile.mkdtemp(prefix="stepcal_families_"))
    tables = {}
    for case in CASES:
        label, preset, tp, ep, _, batches = case
        if args.only and args.only not in label:
            continue
        tables[label] = fit(case, args.system, args.regressor, work)
        print(f"\n{label}: KV on {args.memory_gb:g} GB: {kv_blocks(preset, tp, ep, args.memory_gb)}")
        if preset == "deepseek-v3":
            print(f"  KV on 141 GB (H200): {kv_blocks(preset, tp, ep, 141)}")
        for name, seqs, q, kv in batches:
            total, parts = breakdown(tables[label], seqs, q, kv)
            shares = ", ".join(f"{k} {v:.2f} ms ({100 * v / total:.0f}%)" for k, v in parts.items() if v > 0)
            floor = f"; roofline floor {roofline_decode_ms(preset, tp, ep, seqs, kv, args.system):.2f} ms" if q == 1 else ""
            print(f"  {name}: T_step {total:.2f} ms{floor}\n    {shares}")
            ops = linear_split(tables[label], seqs * q)
            print("    per op: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])))
    published(tables)
    if not args.no_simulate and "mixtral-8x7b TP2" in tables:
        simulate_azure(tables["mixtral-8x7b TP2"], args.memory_gb)


if __name__ == "__main__":
    main()
