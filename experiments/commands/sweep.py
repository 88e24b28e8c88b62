"""`stepcal sweep`: a grid of simulations, run in parallel, resumable."""
from __future__ import annotations

import sys

from stepcal.experiments.commands import argtypes
from stepcal.experiments.commands.flags import add_command
from stepcal.experiments.output_paths import check_output

HELP = """Run a grid of simulations (schedulers × their settings × rates × replicas × step models × host
defaults) from a TOML config, on a local process pool or as Ray tasks. Each simulation is seeded, so
results do not depend on the backend or the number of workers. Each finished point is stored at once under
OUT/points/, so a sweep that is interrupted and rerun skips the points already done.

Writes OUT/summaries.parquet (one row per point: settings, throughput, mean/P50/P90/P95/P99 of
TTFT, TPOT, ITL and E2E, and each SLO's attainment and goodput), OUT/pareto.png (throughput against
P99 latency, the Pareto front, the best point per SLO) and OUT/sweep.json.

Ranges: with `ranges = N` in the config (and optionally scatter_cv, scatter_rho, ranges_seed), every
point also runs N seeded replications, each drawing the step model's error per T_step term and the
step-to-step scatter, and its row gains <column>.median, <column>.low and <column>.high (the median and
the 5th and 95th percentiles over the replications) for every figure column; the plain columns stay the
plain run's, and pareto.png shows each point's interval as error bars. A point's replications run in
the worker that runs the point. The ranges settings are part of each point's key, so a point stored
without ranges and rerun with them is a new point (simulated again), never mixed with the old result.

Every key is checked as the flag it mirrors is (step_overhead_ms as simulate's --step-overhead-ms,
replicas as --replicas, ...) before anything runs: a bad value, a value of the wrong type or an unknown
key is one line naming the file and the key. A grid has at most 100,000 points.

config example (see experiments/sweep/config.py for every key):
  trace = "AzureLLMInferenceTrace_conv.csv"
  duration_s = 600
  rates_rps = [2.0, 4.0, 8.0]
  replicas = [1, 2]
  step_models = ["linear:8,0.03,0.0002"]
  host_defaults = ["none", "vllm"]   # optional: with and without vLLM's published host terms

  [[schedulers]]
  name = "vllm"
  max_num_seqs = [128, 256]

  [[schedulers]]
  name = "sarathi"
  chunk_size = [256, 512]

  [[slos]]
  name = "chat"
  ttft_ms = 500
  tpot_ms = 50
  attainment = 0.9

examples:
  stepcal sweep sweep.toml --workers 8 --out runs/sweep
  stepcal sweep sweep.toml --backend ray --ray-address ray://head:10001 --out runs/sweep"""


def register(subparsers) -> None:
    p = add_command(subparsers, "sweep", "run a grid of simulations (local pool or Ray), resumable", HELP, run)
    p.add_argument("config", help="sweep config (TOML)")
    p.add_argument("--backend", default="local", choices=["local", "ray"],
                   help="local: a process pool on this machine; ray: one Ray task per simulation (default local)")
    p.add_argument("--workers", type=argtypes.count(1, 1024), default=1,
                   help="local: processes (1 runs in this process); ray without --ray-address: CPUs of the "
                        "local cluster started for the run (default 1)")
    p.add_argument("--ray-address", default=None,
                   help="address of a running Ray cluster (e.g. ray://head:10001 or auto); its nodes need "
                        "stepcal installed. Default: start a local cluster for the run")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--out", required=True, help="output directory (reused to resume)")


def run(args) -> int:
    check_output(args.out, staged=False)   # filled point by point, to resume
    from stepcal.experiments.sweep import (  # lazy: loads concurrent, multiprocessing, numpy, tqdm
        load_sweep_config,
        run_sweep,
    )
    from stepcal.experiments.sweep.pareto import point_label  # lazy: loads concurrent, multiprocessing, numpy, tqdm

    config = load_sweep_config(args.config)
    bar = None if args.quiet else _progress_bar(len(config.points))
    try:
        report = run_sweep(config, args.out, backend=args.backend, workers=args.workers,
                           ray_address=args.ray_address, on_progress=None if bar is None else _advance(bar))
    finally:
        if bar is not None:
            bar.close()
    if not args.quiet:
        print(f"{report.num_points} points: {report.num_run} simulated, {report.num_reused} reused from {args.out}/points")
        frame = report.frame.set_index("index", drop=False)
        for name, index in report.best.items():
            print(f"best for {name}: " + ("no point meets it" if index is None else point_label(frame.loc[index])))
        print(f"wrote {args.out}/summaries.parquet, pareto.png, sweep.json")
    return 0


def _progress_bar(total: int):
    from tqdm import tqdm  # lazy: loads tqdm
    return tqdm(total=total, unit="sim", desc="sweep", file=sys.stderr, mininterval=0.5)


def _advance(bar):
    def on_progress(done: int, total: int) -> None:
        bar.n = done
        bar.refresh()
    return on_progress
