"""`stepcal tables export`: a T_step table directory in Vidur's layout, as an AIConfigurator system, plain
CSV or JSON."""
from __future__ import annotations

import sys
from pathlib import Path

from stepcal.core.io import atomic_output_dir
from stepcal.experiments.commands import argtypes, flags
from stepcal.experiments.output_paths import check_output

HELP = "work with T_step table directories"
# costmodel.export.DEFAULT_HBM_GBPS (not imported here: `stepcal --help` stays instant).
DEFAULT_HBM_GBPS = 2039.0
# costmodel.export_aiconfigurator.DEFAULT_VERSION (the vLLM version of AIConfigurator's shared tables).
DEFAULT_AIC_VERSION = "0.14.0"


def register(subparsers) -> None:
    p = subparsers.add_parser("tables", help=HELP, description=HELP + ".")
    sub = p.add_subparsers(dest="tables_command", metavar="ACTION")
    e = sub.add_parser(
        "export", help="export tables to other formats",
        description="Export a T_step table directory: vidur (mlp.csv and attention.csv in the "
                    "layout Vidur's profiling data takes, per layer, in ms, at the points Vidur's "
                    "profilers time, evaluated from the fitted regressors), aiconfigurator (a systems "
                    "directory AIConfigurator loads: SYSTEM.yaml with the device's datasheet figures and "
                    "data/SYSTEM/<op>/vllm/VERSION/*.parquet, the GEMM, attention prefill/decode, "
                    "all-reduce, MoE and MLA tables the fit has, on AIConfigurator's lookup grid: the "
                    "profile's time where it measured a shape, the fit's prediction elsewhere, column "
                    "stepcal_source saying which), csv (one CSV per "
                    "grid, plus meta.json) or json (one tables.json). The vidur format refuses "
                    "tables without attention data: Vidur cannot run without attention.csv. From a "
                    "`stepcal calibrate` directory, vidur's times are scaled by the calibration's "
                    "base_scale, and its other host terms (not operator times) are left out, as the "
                    "printed line says; csv and json carry them in meta.json.",
        formatter_class=flags.DefaultsHelpFormatter)
    e.add_argument("tables", metavar="DIR", help="a directory written by `stepcal fit` or `stepcal calibrate`")
    e.add_argument("--format", required=True, choices=["vidur", "aiconfigurator", "csv", "json"])
    e.add_argument("--out", required=True, metavar="DIR2", help="output directory")
    e.add_argument("--vidur-model", default=None, metavar="NAME",
                   help="vidur: write the filter keys of this Vidur model config (e.g. meta-llama/Llama-2-7b-hf, "
                        "codellama/CodeLlama-34b-Instruct-hf, Qwen/Qwen-72B); refused when the tables' model "
                        "has another shape. Default: the keys of the Vidur profile the tables were fitted from, "
                        "else of the model spec in Vidur's convention")
    e.add_argument("--hbm-gbps", type=argtypes.positive, default=DEFAULT_HBM_GBPS,
                   help="vidur: device memory bandwidth in GB/s of the attn_kv_cache_save estimate (K and V of "
                        "the new tokens written at this speed; no input times it); 2039: A100-SXM4-80GB")
    e.add_argument("--aic-system", default=None, metavar="NAME",
                   help="aiconfigurator: the system's name (AIConfigurator's --system); default stepcal_<device>")
    e.add_argument("--aic-version", default=DEFAULT_AIC_VERSION, metavar="VERSION",
                   help="aiconfigurator: the vLLM version the tables are filed under (--perf-db-version)")
    e.add_argument("--aic-predict-all", action="store_true",
                   help="aiconfigurator: every time from the fitted regressors, the profile's measured shapes "
                        "too (to check a fit against the tables it was fitted on)")
    e.set_defaults(func=run_export)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(parser) -> int:
    """`stepcal tables` without an action: the help on stderr (it is an error: exit 2), as the other groups do."""
    parser.print_help(sys.stderr)
    return 2


def run_export(args) -> int:
    check_output(args.out)

    from stepcal.costmodel.export import export_tables  # lazy: loads numpy, pandas

    with atomic_output_dir(Path(args.out)) as staging:
        export = export_tables(args.tables, args.format, staging, vidur_model=args.vidur_model,
                               hbm_gbps=args.hbm_gbps, aic_system=args.aic_system,
                               aic_version=args.aic_version,
                               aic_predict_all=args.aic_predict_all)
    notes = "".join(f"; {note}" for note in export.notes)
    print(f"wrote {', '.join(str(Path(args.out) / p.relative_to(staging)) for p in export.files)}{notes}")
    return 0
