"""`stepcal report`: plots and tables of validation runs and simulations, as markdown and a self-contained
HTML page."""
from __future__ import annotations

from stepcal.core.errors import InputError
from stepcal.experiments.commands.flags import add_command
from stepcal.experiments.output_paths import check_output, check_store_uri

HELP = """Write OUT/report.md and a self-contained OUT/report.html (plots embedded) with the PNG plots
beside them, from one or more directories:
  - a validation directory (from `stepcal validate`): CDFs of TTFT, TPOT and E2E, measured vs
    simulated; predicted vs measured step time; the error table with the noise floor and the
    step-level MAPE. A validation with ranges (`validate --ranges N`) adds to the CDFs the band of
    the N simulated replications (at each cumulative share, the 5th to 95th percentile of their
    latencies, from ranges_percentiles.parquet) and their median curve, and to the error table each
    cell's 90% interval and whether the measured value lies inside;
  - a simulate output directory (from `stepcal simulate`): CDFs of TTFT, TPOT and E2E; after
    `simulate --ranges N`, with the band of the N replications as above (ranges_percentiles.parquet)
    and a table of each headline statistic: the plain run, the replications' median, the 90% interval;
  - a T_step table directory (from `stepcal fit` / `calibrate`): the cost model's held-out errors
    from its meta.json, and a heatmap of T_step over batch size and KV length (pure decode).
--step-model linear:A,B,C (repeatable) adds the heatmap of a built-in model.
--mlflow-run-id logs the report files as artifacts of that MLflow run.

example:
  stepcal report runs/measured/validation tables/tiny --out runs/report
  stepcal report runs/conv_ranges --out runs/conv_report     # after stepcal simulate --ranges 20"""


def register(subparsers) -> None:
    p = add_command(subparsers, "report", "plots and error tables of validation runs (md + html)", HELP, run)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="validation, simulate output and T_step table directories")
    p.add_argument("--step-model", action="append", default=[], metavar="SPEC",
                   help="also draw the T_step heatmap of this model (const:MS, linear:A,B,C or a table directory)")
    p.add_argument("--mlflow-run-id", default=None, help="log the report files as artifacts of this MLflow run")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: MLflow's own default)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--out", required=True, help="output directory")


def run(args) -> int:
    check_output(args.out)
    check_store_uri(args.tracking_uri, flag="--tracking-uri", bare_kind="dir")   # the artifacts go there
    from stepcal.experiments.report.build import (  # lazy: loads concurrent, multiprocessing, numpy, tqdm
        build_report,
        describe_report,
        log_report_to_mlflow,
        mlflow_client,
    )
    if args.tracking_uri and not args.mlflow_run_id:
        raise InputError("--tracking-uri needs --mlflow-run-id")
    client = mlflow_client(args.mlflow_run_id, args.tracking_uri) if args.mlflow_run_id else None
    files = build_report(args.dirs, args.out, step_model_specs=args.step_model)
    if client is not None:
        log_report_to_mlflow(client, args.mlflow_run_id, args.out, files)
    if not args.quiet:
        print(describe_report(args.out, files))
        if client is not None:
            print(f"logged them to MLflow run {args.mlflow_run_id} under report/")
    return 0
