"""`stepcal quickstart`: the whole pipeline on the CPU with the tiny model, in a few minutes."""
from __future__ import annotations

import argparse

HELP = """Run the whole pipeline on a small built-in default, on this machine's CPU with the `tiny` model:

  profile   kernel sweep on the quick grid (GEMM, attention, whole steps, host overhead)
  measure   each scheduler's capacity (saturation run), then a Poisson workload with log-normal
            lengths at 30%, 60% and 90% of it, served for real by the torch engine, twice each
            (interleaved: every run once, then every run again)
  fit       T_step tables (Optuna-tuned) from the profile and the 30%-load step logs
  calibrate host terms from the 30%-load request logs
  validate  simulate every measured run with the same scheduler and KV cache and compare TTFT,
            TPOT, ITL, E2E (the mean of the repeats' statistics; mean, P50-P99), throughput and
            step time; 60% and 90% are held out
  report    report.md / report.html with CDFs, step-time scatter, T_step heatmap, error tables

and print the headline errors. Everything lands under --out; each stage is a plain stepcal
command whose output directory can be inspected or rerun on its own."""


def register(subparsers) -> None:
    p = subparsers.add_parser("quickstart", help="run the whole pipeline on a small built-in default (CPU, tiny)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/quickstart", help="output directory (default runs/quickstart)")
    p.add_argument("--schedulers", default="continuous,sarathi", help="comma-separated (default continuous,sarathi)")
    p.add_argument("--num-requests", type=int, default=200, help="requests per measured run (default 200)")
    p.add_argument("--repeats", type=int, default=2, help="measured repeats per run (default 2: the noise floor)")
    p.add_argument("--trials", type=int, default=4, help="Optuna trials per fitted target (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from experiments.pipeline import Campaign, CampaignConfig, format_headline
    from simulator.errors import InputError
    schedulers = tuple(s for s in args.schedulers.split(",") if s)
    if not schedulers or args.num_requests < 20 or args.repeats < 1 or args.trials < 1:
        raise InputError("quickstart: needs at least one scheduler, --num-requests >= 20, --repeats >= 1, --trials >= 1")
    config = CampaignConfig(out=Path(args.out), schedulers=schedulers, num_requests=args.num_requests,
                            repeats=args.repeats, trials=args.trials, seed=args.seed)
    result = Campaign(config).run()
    print(format_headline(result))
    print(f"\nfinished in {result['wall_s']:.0f} s; report: {Path(args.out) / 'report' / 'report.html'} "
          f"(and report.md); headline numbers: {Path(args.out) / 'headline.json'}")
    return 0
