"""Sweep scale-out benchmark (issue 7): 200 simulations of the Azure conv trace on 1 and 2 local workers.

    .venv/bin/python bench/bench_sweep.py [--duration 300] [--repeats 2] [--workers 1 2] [--out FILE.json]

The trace is cut to its first --duration seconds; the grid is 8 scheduler settings (vllm
max_num_seqs 64..512, sarathi chunk 256..2048) × 25 rates. Each worker count runs the whole sweep
into a fresh directory (nothing reused), --repeats times, interleaved so that background load hits
every worker count alike. Prints a markdown table of wall times and speedups over 1 worker, and
checks that every run gave the same summaries.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # one core per simulation, in spawned workers too
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
AZURE_CONV = REPO.parent / "shared/data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
RATES_RPS = [round(2.0 + 0.5 * i, 2) for i in range(25)]   # 2 .. 14 req/s; the trace's own is ~5

CONFIG = """
trace = "{trace}"
duration_s = {duration}
rates_rps = {rates}
step_models = ["linear:8,0.03,0.0002"]

[[schedulers]]
name = "vllm"
max_num_seqs = [64, 128, 256, 512]

[[schedulers]]
name = "sarathi"
chunk_size = [256, 512, 1024, 2048]

[[slos]]
name = "chat"
ttft_ms = 500
tpot_ms = 50
attainment = 0.9
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of the trace kept (default 300)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per worker count (default 2)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts (default 1 2)")
    parser.add_argument("--out", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    from stepcal.experiments.sweep import WALL_COLUMN, load_sweep_config, run_sweep

    with tempfile.TemporaryDirectory(prefix="bench_sweep.") as tmp:
        config_path = Path(tmp) / "sweep.toml"
        config_path.write_text(CONFIG.format(trace=AZURE_CONV, duration=args.duration, rates=RATES_RPS))
        config = load_sweep_config(config_path)
        walls: dict[int, list[float]] = {w: [] for w in args.workers}
        busy: dict[int, list[float]] = {w: [] for w in args.workers}   # summed simulation wall time per run
        reference = None
        for repeat in range(args.repeats):
            for workers in args.workers:
                t0 = time.perf_counter()
                report = run_sweep(config, Path(tmp) / f"out_{workers}_{repeat}", workers=workers)
                walls[workers].append(time.perf_counter() - t0)
                busy[workers].append(float(report.frame[WALL_COLUMN].sum()))
                assert report.num_run == len(config.points)
                frame = report.frame.drop(columns=WALL_COLUMN)
                if reference is None:
                    reference = frame
                assert frame.equals(reference), "a sweep gave different summaries"
                print(f"repeat {repeat}: {workers} worker(s): {walls[workers][-1]:.1f} s", file=sys.stderr)
    base = walls[args.workers[0]]
    print(f"{len(config.points)} simulations of the first {args.duration:g} s of the Azure conv trace "
          f"({int(reference['num_requests'].iloc[0])} requests each); {os.cpu_count()} CPUs. Parallelism = summed "
          f"simulation wall time / sweep wall time: how many simulations really ran at once (below the worker "
          f"count when other processes hold the cores).\n")
    print("| workers | " + " | ".join(f"wall run {i + 1} (s)" for i in range(args.repeats)) + " | "
          + " | ".join(f"speedup run {i + 1}" for i in range(args.repeats)) + " | "
          + " | ".join(f"parallelism run {i + 1}" for i in range(args.repeats)) + " |")
    print("|---" * (1 + 3 * args.repeats) + "|")
    for workers, values in walls.items():
        print(f"| {workers} | " + " | ".join(f"{v:.1f}" for v in values) + " | "
              + " | ".join(f"{b / v:.2f}" for b, v in zip(base, values)) + " | "
              + " | ".join(f"{u / v:.2f}" for u, v in zip(busy[workers], values)) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps({"num_simulations": len(config.points), "duration_s": args.duration,
                                              "wall_s": walls, "summed_sim_s": busy}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
