"""`stepcal validate`: how far is the simulator from a measured run of the same workload?"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from stepcal.experiments.commands import argtypes
from stepcal.experiments.commands.flags import (
    add_command,
    add_measured_run_flags,
    add_ranges_flags,
    ranges_settings_from_args,
)
from stepcal.experiments.host_defaults import VALIDATE_AUTO_HELP, add_host_defaults_flag
from stepcal.experiments.output_paths import check_output

HELP = """Replay a measured run (from `stepcal measure`) in the simulator with the same trace, scheduler
settings and KV capacity, timing each step with --step-model, and report for TTFT, TPOT, ITL and
E2E the measured and simulated mean, P50, P90, P95, P99 and the relative error of each (with the
measured run-to-run noise floor beside it when the run has repeats), the throughput error, and the
step-level error (MAPE of predicted vs measured step time on the measured step log).
Writes OUT/validation.json, OUT/validation.md, OUT/simulated_requests.parquet (the simulated request
log) and OUT/step_predictions.parquet (each measured step: features, measured_ms, predicted_ms).
validation.json's `host_defaults` says which engine terms --host-defaults added (null: none), and
validation.md says so in one line.
A run imported from LLMServingSim's bench keeps the engine's once-a-second record (timeseries.csv):
validation.json's `timeseries` block then compares the running and waiting requests and the KV cache
use (where the run recorded them) with the replay's at the same ticks: means, peaks and the mean
absolute difference per tick; OUT/timeseries.parquet holds both series.
With --ranges N, validation.json gains a `ranges` block (each figure's median and 90% interval over the
replications, and the coverage: how often the measured value lies inside; a replication is one run,
so each repeat of the measured run is compared on its own, and the repeats' mean beside it), and
OUT/ranges_percentiles.parquet holds each replication's TTFT, TPOT and E2E at the quantiles 0, 0.01, ...,
1 (columns replication, seed, metric, quantile, value_ms): `stepcal report` draws the CDF bands from it."""


def register(subparsers) -> None:
    p = add_command(subparsers, "validate", "compare the simulator with a measured run", HELP, run)
    add_measured_run_flags(p)
    add_host_defaults_flag(p, VALIDATE_AUTO_HELP)
    p.add_argument("--step-overhead-ms", type=argtypes.time_ms_or_zero, default=0.0, help="host time added to every simulated step")
    p.add_argument("--out", default=None, help="output directory (default: MEASURED/validation)")
    p.add_argument("--quiet", action="store_true")
    add_ranges_flags(p)


def run(args) -> int:

    if args.out:
        check_output(args.out)
    elif Path(args.measured).is_dir():    # otherwise the measured-run reader says what is wrong with it
        check_output(Path(args.measured) / "validation", flag="--out (default MEASURED/validation)")

    from stepcal.experiments.replications import (
        replicate_ranges,  # lazy: loads concurrent, multiprocessing, numpy, tqdm
    )
    from stepcal.experiments.validation.validate import (
        validate_run,  # lazy: loads concurrent, multiprocessing, numpy, tqdm
    )
    # ranges(trace, model, config); the replications' quantiles go to ranges_percentiles.parquet
    ranges = (partial(replicate_ranges, ranges_settings_from_args(args), args.step_model, quantiles=True,
                      quiet=args.quiet) if args.ranges else None)
    validation = validate_run(args.measured, args.step_model, args.out, args.step_overhead_ms, ranges,
                              host_defaults=args.host_defaults)
    if not args.quiet:
        print(validation.table)
        print(f"wrote {validation.out}/validation.json and validation.md")
    return 0
