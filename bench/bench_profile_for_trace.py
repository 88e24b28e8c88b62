"""Profiling to a budget for a target trace, end to end on replayed GPU data: the simulated TTFT and
TPOT (P50, P90) of a trace under T_step tables fitted to an adaptive profile, against those under
tables fitted to the full grid. Not run by CI.

The device replays AIConfigurator's H100 SXM tables (../shared/data/profiles); the model is
Llama-3-8B, its GEMMs and attention; the trace is the first --num-requests requests of the Azure
LLM inference trace (conv). Per seed: the full grid is profiled, then adaptive campaigns at
--fraction of the full grid's measurement time, uniform and with --for-trace the same trace; each
profile is fitted (`stepcal fit --ops gemm,attn_prefill,attn_decode`) and the trace simulated
(`stepcal simulate`, vllm at its defaults).

Target: with --for-trace, each of the four figures within 2% of the full grid's at 35%.

Usage: .venv/bin/python bench/bench_profile_for_trace.py [--seeds 3] [--fraction 0.35] [--num-requests 300]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
AIC = REPO.parent / "shared" / "data" / "profiles" / "aiconfigurator" / "h100_sxm"
AZURE_CONV = REPO.parent / "shared" / "data" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
OPS = "gemm,attn_prefill,attn_decode"
FIGURES = (("ttft_ms", "p50"), ("ttft_ms", "p90"), ("tpot_ms", "p50"), ("tpot_ms", "p90"))
TARGET_REL = 0.02


def stepcal(*args: str) -> None:
    from stepcal.experiments.cli import main
    if main([*args]) != 0:
        raise SystemExit(f"stepcal {' '.join(args)}: failed")


def profile(work: Path, name: str, seed: int, *extra: str) -> Path:
    out = work / f"prof-{name}"
    stepcal("profile", "--model-spec", "llama-3-8b", "--device", f"replay:{AIC}", "--ops", OPS, "--grid", "full",
            "--seed", str(seed), "--no-progress", "--out", str(out), *extra)
    return out


def figures(work: Path, name: str, prof: Path, trace: Path) -> dict[str, float]:
    """The trace's TTFT and TPOT P50 / P90 under tables fitted to `prof`."""
    tables, sim = work / f"tables-{name}", work / f"sim-{name}"
    stepcal("fit", "--profile", str(prof), "--model-spec", "llama-3-8b", "--ops", OPS, "--no-mlflow",
            "--out", str(tables))
    stepcal("simulate", "--trace", str(trace), "--step-model", str(tables), "--quiet", "--out", str(sim))
    summary = json.loads((sim / "summary.json").read_text())
    return {f"{m}.{q}": float(summary[m][q]) for m, q in FIGURES}


def one_seed(work: Path, seed: int, fraction: float, trace: Path) -> dict[str, dict[str, float]]:
    full = profile(work, f"full{seed}", seed)
    budget_s = fraction * json.loads((full / "meta.json").read_text())["replay"]["measure_s"]
    runs = {"full": full,
            "uniform": profile(work, f"uniform{seed}", seed, "--budget-s", f"{budget_s:.6f}"),
            "for-trace": profile(work, f"trace{seed}", seed, "--budget-s", f"{budget_s:.6f}", "--for-trace", str(trace))}
    return {name: figures(work, f"{name}{seed}", prof, trace) for name, prof in runs.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.35)
    parser.add_argument("--num-requests", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trace = work / "trace.csv"
        with AZURE_CONV.open() as src:
            trace.write_text("".join(line for _, line in zip(range(args.num_requests + 1), src)))
        for seed in range(args.seeds):
            results = one_seed(work, seed, args.fraction, trace)
            base = results["full"]
            for name, values in results.items():
                cells = [f"{k}={v:.2f} ({100 * (v / base[k] - 1):+.1f}%)" for k, v in values.items()]
                worst = max(abs(v / base[k] - 1) for k, v in values.items())
                verdict = "" if name == "full" else ("  within 2%" if worst <= TARGET_REL else "  over 2%")
                print(f"seed {seed} {name:9s} " + " ".join(cells) + verdict, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
