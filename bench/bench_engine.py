"""Engine benchmark (issue 4 targets). From the repo root:

    .venv/bin/python bench/bench_engine.py [--device cpu|cuda] [--model-spec tiny] [--n 300]

Serves one Poisson trace with log-normal lengths under each scheduler with the virtual clock,
twice, in one process (the comparisons interleave, so slow drift hits every scheduler alike),
and prints the wall time of each run and the run-to-run noise floor at P50/P90/P99 of TTFT,
TPOT and E2E.
"""
from __future__ import annotations

import argparse
import json
import time

TRACE = "poisson:rate={rate},n={n},prompt=lognormal:{prompt}:0.8,output=lognormal:{output}:0.8,seed=0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model-spec", default="tiny")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rate", type=float, default=15.0)
    parser.add_argument("--prompt", type=int, default=256, help="mean prompt length")
    parser.add_argument("--output", type=int, default=64, help="mean output length")
    parser.add_argument("--schedulers", default="static,continuous,vllm,sarathi,slo")
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="also write the rows as JSON here")
    args = parser.parse_args()

    import torch

    from stepcal.core.measured_run import noise_floor
    from stepcal.core.metrics import clean_json
    from stepcal.core.model_files import load_model_spec
    from stepcal.core.workload import load_workload
    from stepcal.profiler.engine import Engine, EngineConfig
    from stepcal.profiler.engine.measure import warm_up
    from stepcal.profiler.model import build_model
    from stepcal.simulator.schedulers import SchedulerConfig

    torch.set_num_threads(args.threads)
    model = build_model(load_model_spec(args.model_spec), device=args.device, dtype=args.dtype)
    warm_up(model)
    trace = load_workload(TRACE.format(rate=args.rate, n=args.n, prompt=args.prompt, output=args.output))
    names = args.schedulers.split(",")
    runs = {name: [] for name in names}
    for _ in range(2):
        for name in names:
            config = EngineConfig(scheduler=name, scheduler_config=SchedulerConfig(chunk_size=args.chunk_size))
            t0 = time.perf_counter()
            result = Engine(model, trace, config).run()
            runs[name].append((time.perf_counter() - t0, clean_json(result.summary)))
    print(f"{args.model_spec} on {args.device}, {args.threads} thread(s), {len(trace)} requests "
          f"({TRACE.format(rate=args.rate, n=args.n, prompt=args.prompt, output=args.output)}), virtual clock\n")
    print("| scheduler | wall s (run 1, 2) | steps | tput req/s | TTFT p50 ms | TPOT p50 ms | noise TTFT p50/p90/p99 | "
          "noise TPOT p50/p90/p99 | noise E2E p50/p90/p99 |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in names:
        (w0, s0), (w1, s1) = runs[name]
        floor = noise_floor([s0, s1])
        cells = [" / ".join(f"{100 * floor[m][p]:.1f}%" for p in ("p50", "p90", "p99"))
                 for m in ("ttft_ms", "tpot_ms", "e2e_ms")]
        print(f"| {name} | {w0:.1f}, {w1:.1f} | {s0['num_steps']} | {s0['throughput_rps']:.2f} | "
              f"{s0['ttft_ms']['p50']:.1f} | {s0['tpot_ms']['p50']:.2f} | " + " | ".join(cells) + " |")
        rows.append({"scheduler": name, "wall_s": [w0, w1], "summaries": [s0, s1], "noise_floor": floor})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
