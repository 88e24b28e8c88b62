"""`stepcal quickstart`: the whole pipeline on the CPU with the tiny model, in a few minutes."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from stepcal.core import bounds
from stepcal.core.errors import InputError
from stepcal.core.model_files import load_model_spec
from stepcal.experiments.commands import argtypes
from stepcal.experiments.commands.flags import SCHEDULER_NAMES, add_command
from stepcal.experiments.output_paths import check_output
from stepcal.profiler.fingerprint import hardware_fingerprint
from stepcal.profiler.noise_policy import NOISE_FLOOR_REPEATS, NoisePolicy

# processes for the calibrations and replications: two, where the machine has two cores
DEFAULT_WORKERS = min(2, os.cpu_count() or 1)

HELP = """Run the whole pipeline on a small built-in default, on this machine's CPU with the `tiny` model:

  profile   kernel sweep on the quick grid (GEMM, attention, whole steps, the engine's host path):
            half of its rounds now, the other half after the measurements, so that the profile
            spans the machine's drift over the campaign as the interleaved repeats do
  measure   each scheduler's capacity (saturation run), then a Poisson (or, with --arrivals
            gamma:CV, bursty) workload with log-normal lengths at 30%, 60% and 90% of it, served
            for real by the torch engine, twice each (interleaved: every run once, then every
            run again); a repeat the machine slowed (`stepcal measure --retry-slowed`) is served
            again, up to twice per run (on cpu; off on cuda, whose cores no other process shares)
  fit       T_step tables (Optuna-tuned) from the profile and the 30%-load step logs ("tables"),
            from the profile alone: whole steps plus the engine's host time ("profiled": the
            path of a user without step logs; it saw no run, so every load is held out for it),
            and from the kernel profile alone ("kernels": no engine host work in them); on cpu the
            stretches of a served workload the machine slowed in one profile half are left out
  calibrate host terms of the kernel tables from the 30%-load request logs ("calibrated"), and of
            the profiled tables ("profiled_cal"), on --workers processes at once
  validate  simulate every measured run with the same scheduler and KV cache and compare TTFT,
            TPOT, ITL, E2E (the mean of the repeats' statistics; mean, P50-P99), throughput and
            step time; 60% and 90% are held out
  reproduce the profiled tables fitted on each half of the profile alone, every run simulated with
            both: how far the prediction moves when the device is profiled again minutes later,
            printed beside the targets (a cell cannot be trusted to better than that)
  report    report.md / report.html with CDFs, step-time scatter, T_step heatmap, error tables

and print the headline errors. Everything lands under --out; each stage does what its stepcal
command does, so its output directory can be inspected or rerun on its own.

Every quickstart adds its runs' pairs of repeats to the device's history (--history), and pools
those of earlier quickstarts on this machine in the run-to-run speed spread that --ranges draws:
a campaign alone has three pairs, which say that spread poorly."""


def register(subparsers) -> None:
    p = add_command(subparsers, "quickstart", "run the whole pipeline on a small built-in default (CPU, tiny)", HELP, run)
    p.add_argument("--out", default="runs/quickstart", help="output directory (default runs/quickstart)")
    p.add_argument("--schedulers", type=argtypes.names(SCHEDULER_NAMES), default=("continuous", "sarathi"),
                   help=f"comma-separated, of {','.join(SCHEDULER_NAMES)} (default continuous,sarathi)")
    p.add_argument("--num-requests", type=argtypes.count(), default=200, help="requests per measured run (default 200)")
    p.add_argument("--repeats", type=argtypes.count(1, 1000), default=NOISE_FLOOR_REPEATS, help="measured repeats per run (default 2: the noise floor; every two repeats are one more pair for "
                        "the run-to-run speed spread that --ranges draws)")
    p.add_argument("--trials", type=argtypes.count(1, 100_000), default=4, help="Optuna trials per fitted target (default 4)")
    p.add_argument("--seed", type=argtypes.seed, default=0)
    p.add_argument("--ranges", type=argtypes.count(0, 10_000), default=0, metavar="N",
                   help="also validate the calibrated models' held-out runs with N replications each "
                        "(`stepcal validate --ranges`) and report how often the measured values fall inside the "
                        "90%% intervals (coverage, each repeat on its own) and their width (default 0: none)")
    p.add_argument("--workers", type=argtypes.count(1, 1024), default=DEFAULT_WORKERS,
                   help="processes for the four calibrations (after the measurements, which run alone) and for "
                        "those replications (default 2, or 1 on a one-core machine: on two cores the "
                        "calibrations take about half their minutes)")
    p.add_argument("--scatter-runs", nargs="+", default=[], metavar="DIR",
                   help="earlier campaigns (their directories) or measured runs of this machine: their repeats' "
                        "speed differences join this campaign's three pairs in run_cv, the run-to-run speed "
                        "spread that --ranges draws (as `stepcal calibrate --scatter-runs`); three pairs alone "
                        "put it anywhere from a third to 1.6 times its value")
    p.add_argument("--history", default=None, metavar="FILE",
                   help="the device's history: a ledger of every earlier quickstart's pairs of repeats on this "
                        "machine, pooled in run_cv like --scatter-runs (runs deleted since still count), to "
                        "which this campaign adds its own at the end; 'off': neither read nor write "
                        "(default $STEPCAL_HISTORY, else ~/.cache/stepcal/device_history.jsonl)")
    g = p.add_argument_group("another device or model (the defaults are the CPU quickstart)")
    g.add_argument("--device", type=argtypes.device, default="cpu", help="cpu or cuda[:N] (default cpu)")
    g.add_argument("--model-spec", default="tiny", help="model preset, ModelSpec file or Hugging Face config.json (default tiny)")
    g.add_argument("--prompt", default="lognormal:128:0.8", help="prompt length distribution (default lognormal:128:0.8)")
    g.add_argument("--output", default="lognormal:32:0.8", help="output length distribution (default lognormal:32:0.8)")
    g.add_argument("--arrivals", type=_arrivals, default="poisson",
                   help="arrival process of the measured workloads: poisson, or gamma:CV for bursty arrivals "
                        "(CV > 1: the coefficient of variation of the gaps; default poisson)")
    g.add_argument("--chunk-size", type=argtypes.count(1, bounds.MAX_TOKENS_PER_REQUEST), default=64, help="sarathi's prefill chunk, in tokens (default 64)")
    g.add_argument("--grid", default="quick", help="profile grid: quick, full or a file (default quick)")
    g.add_argument("--profile-ops", default=None,
                   help="profile only these ops, e.g. step,overhead (default: every op of the grid)")


def run(args) -> int:

    check_output(args.out, staged=False)   # the stages fill OUT as they go

    from stepcal.experiments.campaign import (  # lazy: loads concurrent, multiprocessing, numpy, tqdm
        Campaign,
        CampaignConfig,
        format_headline,
    )
    from stepcal.experiments.validation.device_history import history_file  # lazy: loads numpy, tqdm
    # --schedulers, --repeats, --trials and --chunk-size were refused when parsed (argtypes)
    if args.num_requests < 20:
        raise InputError(f"quickstart: needs --num-requests >= 20 (for P99 of every run), got {args.num_requests}")
    _check_setup(args)
    config = CampaignConfig(out=Path(args.out), schedulers=args.schedulers, num_requests=args.num_requests,
                            repeats=args.repeats, trials=args.trials, seed=args.seed, device=args.device,
                            model_spec=args.model_spec, prompt=args.prompt, output=args.output,
                            chunk_size=args.chunk_size, grid=args.grid, profile_ops=args.profile_ops,
                            arrivals=args.arrivals, ranges=args.ranges, workers=args.workers,
                            scatter_runs=tuple(args.scatter_runs), history_file=history_file(args.history),
                            noise=noise_policy(args))
    campaign = Campaign(config)
    headline = campaign.run()
    print(format_headline(headline))
    history = history_text(config, campaign.history_used, campaign.history_added)
    if history:
        print("\n" + history)
    print(f"\nfinished in {headline.wall_s:.0f} s; report: {Path(args.out) / 'report' / 'report.html'} "
          f"(and report.md); headline numbers: {Path(args.out) / 'headline.json'}")
    return 0


def noise_policy(args):
    """The campaign's noise handling: the device's (profiler.noise_policy); no flag changes it."""
    return NoisePolicy.for_device(args.device)


def history_text(config, used: list, added: list) -> str | None:
    """What the device's history gave run_cv and what this campaign added to it, or how to keep one."""
    from stepcal.experiments.validation.device_history import describe  # lazy: loads numpy, tqdm
    if config.repeats < 2:
        return None
    if config.history_file is None:
        if not config.ranges or config.scatter_runs:
            return None
        return (f"the 90% intervals' run-to-run speed spread (run_cv) rests on this campaign's three pairs of runs; "
                f"a later campaign on this machine pools them with its own: --scatter-runs {config.out}")
    pooled = (f"run_cv pooled this campaign's pairs with {describe(used)} on this machine" if used
              else "no earlier campaign of this machine in it")
    return (f"device history ({config.history_file}): {pooled}; added this campaign's {len(added)} run(s) "
            f"({sum(len(e.ratios) for e in added)} pairs), which later campaigns pool")


def _arrivals(text: str) -> str:
    """poisson or gamma:CV with CV a positive number."""
    process, _, cv = text.partition(":")
    if process == "poisson" and not cv:
        return text
    if process == "gamma":
        try:
            value = float(cv)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and 0 < value <= 100:
            return text
    raise argparse.ArgumentTypeError(f"expected poisson or gamma:CV with 0 < CV <= 100, got {text!r}")


def _check_setup(args) -> None:
    """Bad flags fail here, in one line, before minutes of profiling."""
    from stepcal.core.workload.spec import parse_spec  # lazy: loads numpy
    from stepcal.experiments.validation.device_history import history_file  # lazy: loads numpy, tqdm
    load_model_spec(args.model_spec)
    parse_spec(f"poisson:rate=1,n=1,prompt={args.prompt},output={args.output}", "--prompt / --output")
    if args.scatter_runs:
        _check_scatter_runs(args)
    if args.history is not None and history_file(args.history) is not None:
        check_output(args.history, kind="file", flag="--history")   # written at the end, minutes later
    if args.device.startswith("cuda"):
        import torch  # lazy: loads torch
        if not torch.cuda.is_available():
            raise InputError(f"--device {args.device}: CUDA is not available on this machine")
    elif args.device != "cpu":
        raise InputError(f"--device {args.device}: expected cpu or cuda[:N]")


def _check_scatter_runs(args) -> None:
    """--scatter-runs: runs of two or more repeats, measured on this machine (its fingerprint now)."""
    from stepcal.experiments.validation.scatter import check_scatter_runs  # lazy: loads numpy, tqdm
    if args.repeats < 2:
        raise InputError("--scatter-runs needs --repeats of two or more: the step-to-step scatter comes from "
                         "this campaign's own repeats")
    # the engine's measurements run on one thread
    check_scatter_runs(args.scatter_runs, hardware_fingerprint(args.device, num_threads=1))
