"""Simulator speed benchmark (issue 2 targets). Prints a markdown table; run from the repo root:

    .venv/bin/python bench/bench_simulator.py [--quick] [--out FILE.json]

- the whole Azure conv trace (19,366 requests) under sarathi and vllm, fast path on and off;
- Poisson traces from 10k to 1M requests: wall time, number of steps, peak memory, and wall time
  per step (flat if wall time grows linearly with the number of steps).
Each case runs in its own process pinned to one core, so peak RSS and timings do not mix.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AZURE_CONV = REPO.parent / "shared/data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
STEP_MODEL = "linear:8,0.03,0.0002"   # ~7B-class on one GPU: 8 ms a step, 30 µs a token, 0.2 µs a context token
POISSON = "poisson:rate=20,n={n},prompt=lognormal:512:1.0,output=lognormal:128:1.0,seed=1"


def run_case(trace: str, scheduler: str, fast: bool) -> dict:
    """One simulation in this process; returns wall time, steps and peak RSS."""
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    from stepcal.core.workload import load_workload
    from stepcal.experiments.step_models import resolve_step_model
    from stepcal.simulator.simulation import SimConfig, Simulation
    workload = load_workload(trace)
    model = resolve_step_model(STEP_MODEL)
    t0, c0 = time.perf_counter(), time.process_time()
    sim = Simulation(workload, model, SimConfig(scheduler=scheduler, fast_path=fast, record_batches=False))
    result = sim.run()
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return {"num_requests": len(workload), "scheduler": scheduler, "fast_path": fast, "wall_s": wall_s, "cpu_s": cpu_s,
            "loop_wall_s": result.wall_s, "num_steps": result.summary["num_steps"],
            "us_per_step": 1e6 * wall_s / result.summary["num_steps"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "ttft_p50_ms": result.summary["ttft_ms"]["p50"], "tpot_p50_ms": result.summary["tpot_ms"]["p50"]}


def in_subprocess(trace: str, scheduler: str, fast: bool) -> dict:
    """run_case in a fresh process: this script again, asked for one case (--case, JSON)."""
    case = json.dumps({"trace": trace, "scheduler": scheduler, "fast": fast})
    out = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip the 300k and 1M traces")
    parser.add_argument("--out", help="also write the rows as JSON here")
    parser.add_argument("--plot", help="also plot wall time against the number of steps to this PNG")
    parser.add_argument("--case", help=argparse.SUPPRESS)   # one case, in the subprocess in_subprocess starts
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(**json.loads(args.case))))
        return
    rows = []
    for scheduler in ("sarathi", "vllm"):
        for fast in (True, False):
            rows.append({"case": "azure conv", **in_subprocess(str(AZURE_CONV), scheduler, fast)})
    sizes = (10_000, 30_000, 100_000) if args.quick else (10_000, 30_000, 100_000, 300_000, 1_000_000)
    for n in sizes:
        rows.append({"case": f"poisson {n}", **in_subprocess(POISSON.format(n=n), "vllm", True)})
    print(f"step model {STEP_MODEL}; one core; step batches not recorded\n")
    print(f"load average before: {os.getloadavg()[0]:.2f}\n")
    print("| case | scheduler | fast path | requests | steps | wall s | CPU s | µs/step | peak RSS MiB | TTFT p50 ms | TPOT p50 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['scheduler']} | {'on' if r['fast_path'] else 'off'} | {r['num_requests']} | "
              f"{r['num_steps']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['us_per_step']:.1f} | {r['peak_rss_mib']:.0f} | "
              f"{r['ttft_p50_ms']:.1f} | {r['tpot_p50_ms']:.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    if args.plot:
        plot_scaling([r for r in rows if r["case"].startswith("poisson")], args.plot)


def plot_scaling(rows: list[dict], path: str) -> None:
    """Wall time against number of steps, with the line through the origin fitted to them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    steps = np.array([r["num_steps"] for r in rows], dtype=float)
    wall = np.array([r["wall_s"] for r in rows])
    slope = float(steps @ wall / (steps @ steps))
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot(steps / 1e6, wall, "o", label="Poisson traces (10k to 1M requests)")
    grid = np.linspace(0, steps.max(), 50)
    ax.plot(grid / 1e6, slope * grid, "-", label=f"linear fit: {slope * 1e6:.0f} µs per step")
    ax.set_xlabel("simulated steps (millions)")
    ax.set_ylabel("wall time (s)")
    ax.set_title("stepcal simulate: wall time grows linearly with steps")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
