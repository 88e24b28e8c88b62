"""`stepcal quickstart`: the main job on a small built-in default.

For now (until the profile → fit → measure → validate pipeline lands) it simulates a real trace,
the Azure LLM 2023 conversation trace, under each scheduler with a built-in step-time model,
and prints how they compare.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

AZURE_CONV = Path(__file__).resolve().parents[3] / "shared/data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
FALLBACK_TRACE = "poisson:rate=5.5,n=19366,prompt=lognormal:1155:1.0,output=lognormal:211:1.0,seed=0"
STEP_MODEL = "linear:8,0.03,0.0002"
SCHEDULERS = ("static", "continuous", "vllm", "sarathi", "slo")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "quickstart", help="run the main job on a small built-in default",
        description="Simulate the Azure LLM 2023 conversation trace (19,366 requests, one hour) under every "
                    "scheduler with a built-in step-time model (" + STEP_MODEL + ": 8 ms a step, 30 µs a token, "
                    "0.2 µs a cached token), a KV cache of --kv-blocks blocks of 16 tokens, and print the "
                    "comparison. Falls back to a generated trace of the same shape when the shared data "
                    "folder is not beside the repository.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=None, help="trace to use instead of the Azure conversation trace")
    p.add_argument("--num-requests", type=int, default=None, help="only the first N requests")
    p.add_argument("--kv-blocks", type=int, default=8000, help="KV cache blocks per replica (default 8000)")
    p.add_argument("--out", default="runs/quickstart", help="output directory (default runs/quickstart)")
    p.set_defaults(func=run)


def run(args) -> int:
    from experiments.commands.simulate import format_summary
    from experiments.step_models import resolve_step_model
    from simulator.io import atomic_output_dir, atomic_write_json, atomic_write_parquet
    from simulator.metrics import clean_json
    from simulator.simulation import SimConfig, simulate
    from simulator.workload import load_workload

    trace_arg = args.trace or (str(AZURE_CONV) if AZURE_CONV.exists() else FALLBACK_TRACE)
    if args.trace is None and not AZURE_CONV.exists():
        print(f"stepcal: {AZURE_CONV} not found; using a generated trace of the same shape", file=sys.stderr)
    trace = load_workload(trace_arg, num_requests=args.num_requests)
    model = resolve_step_model(STEP_MODEL)
    rows = []
    with atomic_output_dir(args.out) as staging:
        for name in SCHEDULERS:
            result = simulate(trace, model, SimConfig(scheduler=name, kv_blocks=args.kv_blocks,
                                                      skip_oversize=True, record_batches=False,
                                                      slo_ttft_ms=1000, slo_tpot_ms=50))
            summary = clean_json({**result.summary, "step_model": STEP_MODEL, "trace": trace_arg})
            atomic_write_parquet(result.requests, staging / name / "requests.parquet")
            atomic_write_json(staging / name / "summary.json", summary)
            rows.append((name, summary, result.wall_s))
            print(f"\n== {name} ({result.wall_s:.1f} s to simulate)\n{format_summary(summary)}")
    print(f"\n{len(trace)} requests from {trace_arg}; step model {STEP_MODEL}; SLO TTFT ≤ 1000 ms, TPOT ≤ 50 ms")
    print(f"{'scheduler':<12}{'tput rps':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p50':>10}{'TPOT p99':>10}{'SLO att.':>10}")
    for name, s, _ in rows:
        print(f"{name:<12}{s['throughput_rps']:>10.2f}{s['ttft_ms']['p50']:>10.0f}{s['ttft_ms']['p99']:>10.0f}"
              f"{s['tpot_ms']['p50']:>10.1f}{s['tpot_ms']['p99']:>10.1f}{s['slo_attainment']:>10.3f}")
    print(f"wrote {args.out}/<scheduler>/requests.parquet and summary.json")
    return 0
