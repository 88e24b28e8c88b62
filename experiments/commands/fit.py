"""`stepcal fit`: profiles in, a T_step table directory out (with held-out errors and an MLflow run)."""
from __future__ import annotations

import argparse
import time

HELP = "fit step-time regressors to profiles and write T_step tables"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fit", help=HELP, description=HELP + ". Reads our profile tables and step logs, Vidur "
        "mlp.csv, AIConfigurator Parquet (a whole system directory too) and Splitwise perf_model.csv; "
        "measures every target on held-out rows (random and extrapolation splits); logs an MLflow "
        "run (tracking store OUT/mlflow.db unless --tracking-uri).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--profile", nargs="+", required=True, metavar="PATH",
                   help="profile files or directories (several are combined)")
    p.add_argument("--format", default="auto",
                   choices=["auto", "profile", "steplog", "vidur", "aiconfigurator", "splitwise"],
                   help="input format (auto: detect from the columns)")
    p.add_argument("--model-spec", default=None, metavar="NAME",
                   help="preset or JSON/TOML file; needed to compose T_step from per-operator "
                        "profiles (not for whole-step data)")
    p.add_argument("--dtype", default=None,
                   help="keep rows of this dtype (default: the model spec's dtype)")
    p.add_argument("--device", default=None,
                   help="keep rows whose device name contains this (needed when the input mixes devices)")
    p.add_argument("--ops", default=None, metavar="LIST",
                   help="fit only records of these ops, comma-separated (e.g. gemm,attn_prefill,attn_decode: "
                        "tables composed from kernels alone, without whole-step rows)")
    p.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel degree (default: 1, or the smallest in whole-step data)")
    p.add_argument("--regressor", default="tuned", choices=["rf", "tuned"],
                   help="rf: a random forest per target; tuned: an Optuna search over forest, "
                        "extra trees, boosting and the physics-informed model")
    p.add_argument("--trials", type=int, default=12, help="Optuna trials per target (tuned)")
    p.add_argument("--timeout-s", type=float, default=None,
                   help="wall-clock limit of each target's Optuna study")
    p.add_argument("--storage", default=None,
                   help="Optuna storage: a journal file path or an RDB URL (default: in memory); "
                        "several workers may share one")
    p.add_argument("--seed", type=int, default=0, help="seed of splits, forests and TPE")
    p.add_argument("--holdout", default=None, metavar="FILE",
                   help="also report errors on this file's rows (never used for fitting)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default sqlite:///OUT/mlflow.db)")
    p.add_argument("--experiment", default="stepcal-fit", help="MLflow experiment name")
    p.add_argument("--register", default=None, metavar="NAME",
                   help="register the fitted T_step model under this name in the MLflow registry")
    p.add_argument("--no-mlflow", action="store_true", help="skip MLflow tracking")
    p.add_argument("--out", required=True, metavar="DIR", help="T_step table directory to write")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from costmodel.build import build_tables
    from costmodel.fitting import FitConfig, fit_all, select_records
    from costmodel.importers import load_profiles
    from costmodel.records import normalise_dtype
    from simulator.errors import InputError
    from simulator.io import atomic_output_dir
    from simulator.model_spec import Parallelism, load_model_spec

    if args.trials < 1:
        raise InputError(f"--trials must be at least 1, got {args.trials}")
    if args.tp is not None and args.tp < 1:
        raise InputError(f"--tp must be at least 1, got {args.tp}")
    started = time.perf_counter()
    spec = load_model_spec(args.model_spec) if args.model_spec else None
    dtype = normalise_dtype(args.dtype) if args.dtype else (normalise_dtype(spec.dtype) if spec else None)
    records = select_records(load_profiles(args.profile, args.format), device=args.device,
                             dtype=dtype, tp=args.tp, ops=args.ops)
    holdout = None
    if args.holdout:
        holdout = select_records(load_profiles([args.holdout], args.format), device=args.device,
                                 dtype=dtype, tp=args.tp)
    config = FitConfig(regressor=args.regressor, trials=args.trials, seed=args.seed,
                       storage=args.storage, timeout_s=args.timeout_s)
    result = fit_all(records, config, holdout,
                     progress=lambda t, n: print(f"fitting {t} ({n} rows)", flush=True))
    out = Path(args.out)
    tp = args.tp or 1
    with atomic_output_dir(out) as staging:
        meta = build_tables(result, staging, spec=spec, parallelism=Parallelism(tp=tp),
                            extra_meta={"inputs": [str(p) for p in args.profile],
                                        "holdout": args.holdout})
        plot = _plot(result, staging)
    if not args.no_mlflow:
        meta = _track(args, result, out, meta, plot and out / plot.name)
    _report(result, meta, out, time.perf_counter() - started)
    return 0


def _plot(result, directory):
    from costmodel.plots import plot_held_out
    return plot_held_out(result, directory / "held_out_random.png")


def _track(args, result, out, meta, plot):
    from costmodel.tables import write_meta
    from costmodel.tracking import default_tracking_uri, track_fit
    uri = args.tracking_uri or default_tracking_uri(out)
    run_id = track_fit(result, out, meta, tracking_uri=uri, experiment=args.experiment,
                       register=args.register, plot_path=plot,
                       artifact_root=None if args.tracking_uri else out / "mlartifacts",
                       params={"model_spec": args.model_spec, "tp": args.tp or 1,
                               "dtype": args.dtype, "device": args.device,
                               "inputs": " ".join(args.profile)[:500]})
    meta = {**meta, "mlflow_run_id": run_id, "mlflow_tracking_uri": uri}
    # meta.json is rewritten whole (atomically) now that the run id is known.
    write_meta(out, {k: v for k, v in meta.items()
                     if k not in ("kind", "schema_version", "tool_version", "units", "features")})
    return meta


def _report(result, meta, out, wall_s) -> None:
    print(f"wrote {out} ({meta['mode']} T_step: {' + '.join(meta['t_step_terms'])}) in {wall_s:.1f} s")
    for target, fit in result.targets.items():
        errs = "  ".join(f"{split} MAPE {e['mape']:.2f}% (P90 {e['p90_ape']:.1f}%)"
                         for split, e in fit.errors.items())
        print(f"  {target:<36} {fit.choice.family:<8} {fit.n_rows:>6} rows  {errs}")
    for split, e in result.errors.items():
        print(f"  overall {split}: MAPE {e['mape']:.2f}%  P90 {e['p90_ape']:.1f}%  max {e['max_ape']:.1f}%")
    if meta.get("missing_terms"):
        print(f"  note: no data for T_step terms {', '.join(meta['missing_terms'])}")
    if meta.get("mlflow_run_id"):
        print(f"  MLflow run {meta['mlflow_run_id']} at {meta['mlflow_tracking_uri']}")
