"""`stepcal fit`: profiles in, a T_step table directory out (with held-out errors and an MLflow run)."""
from __future__ import annotations

from dataclasses import fields

from stepcal.costmodel.devices import known_devices
from stepcal.experiments.commands import argtypes, flags
from stepcal.experiments.fitting import FitOptions, fit_tables
from stepcal.experiments.output_paths import check_output, check_store_uri

HELP = "fit step-time regressors to profiles and write T_step tables"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fit", help=HELP, description=HELP + ". Reads our profile tables and step logs, Vidur "
        "mlp.csv, AIConfigurator Parquet (a whole system directory too) and Splitwise perf_model.csv; "
        "measures every target on held-out rows (a random split, and an extrapolation split that holds out "
        "the larger half of the size axis: of its rows for ops, of its distinct token counts for whole steps, "
        "whose rows are mostly decodes); logs an MLflow "
        "run (tracking store OUT/mlflow.db unless --tracking-uri). Where a workload was served more than once "
        "(the profiler's serve op: two profiles, e.g. a device profiled before and after measurements, or a "
        "grid's [serve] rounds), the stretches the machine slowed are left out: 32 steps whose median is over "
        "1.25x another serving's over the same steps, once each pass's overall drift is taken out (a pooled row "
        "keeps its other passes), as a measured run's slowed repeat is served again; meta.json lists the "
        "servings and their steps (slowed_servings). That rule is for a shared CPU's cores: on for profiles "
        "timed on the cpu, off for those timed on cuda (the profiles' device column).",
        formatter_class=flags.DefaultsHelpFormatter)
    _add_input_flags(p)
    _add_parallelism_flags(p)
    _add_regressor_flags(p)
    _add_output_flags(p)
    p.set_defaults(func=run, noise=None)   # FitOptions.noise: the profiles' device's


def _add_input_flags(p) -> None:
    """Which profile rows are fitted: the files, their format, the model and the rows kept."""
    p.add_argument("--profile", nargs="+", required=True, metavar="PATH",
                   help="profile files or directories (several are combined)")
    p.add_argument("--format", default="auto",
                   choices=["auto", "profile", "steplog", "vidur", "aiconfigurator", "splitwise", "llmservingsim"],
                   help="input format (auto: detect from the columns; llmservingsim: a bundle directory, "
                        "the one holding meta.yaml or a tp<N> folder in it, read with --model-spec)")
    p.add_argument("--model-spec", default=None, metavar="NAME",
                   help="preset, JSON/TOML ModelSpec, or a Hugging Face config.json (or its directory); "
                        "needed to compose T_step from per-operator profiles (without it they are fitted "
                        "for `stepcal predict` only)")
    p.add_argument("--dtype", default=None,
                   help="keep rows of this dtype (default: the model spec's dtype)")
    p.add_argument("--device", default=None,
                   help="keep rows whose device name contains this (needed when the input mixes devices)")
    p.add_argument("--ops", default=None, metavar="LIST",
                   help="fit only records of these ops, comma-separated (e.g. gemm,attn_prefill,attn_decode: "
                        "tables composed from kernels alone, without whole-step rows)")


def _add_parallelism_flags(p) -> None:
    """Tensor and expert parallelism, the MoE routing and all-to-all, and the device's datasheet."""
    p.add_argument("--tp", type=argtypes.count(1, 1024), default=None,
                   help="tensor-parallel degree (default: 1, or the smallest in whole-step data); as in vLLM "
                        "it must divide the model's attention heads, and divide its KV heads or be a multiple of them")
    p.add_argument("--ep", type=argtypes.count(1, 1024), default=1,
                   help="expert parallelism of a mixture-of-experts model: experts spread over --ep of "
                        "the --tp GPUs, whose number must also divide the model's experts (must divide --tp)")
    p.add_argument("--moe-distribution", default=None,
                   help="routing of tokens to experts the MoE term assumes: balanced, or a skewed one the "
                        "profiles hold (AIConfigurator: power_law_1.01, power_law_1.2); default: balanced "
                        "where the profiles have it, else the least skewed (meta.json says which)")
    p.add_argument("--ep-link-gbps", type=argtypes.positive, default=450.0,
                   help="link bandwidth per GPU and direction of --ep's all-to-all, GB/s (no measured "
                        "all-to-all data is read; 450: NVLink 4)")
    p.add_argument("--ep-latency-us", type=argtypes.non_negative, default=10.0,
                   help="fixed latency of each all-to-all (an assumption; stated in meta.json)")
    p.add_argument("--tp-link-gbps", type=argtypes.positive, default=None,
                   help="with --tp above 1 and no measured all-reduce in the profiles: price each all-reduce as "
                        "a ring over links of this bandwidth per GPU and direction, GB/s (default: none, and "
                        "meta.json lists all_reduce as missing); measured all-reduce data win")
    p.add_argument("--tp-latency-us", type=argtypes.non_negative, default=0.0,
                   help="latency of each of the ring's 2 (tp - 1) hops, with --tp-link-gbps (default 0)")
    p.add_argument("--no-skew", action="store_true",
                   help="--format llmservingsim: leave out the decode_attn_skew term that the bundle's skew.csv "
                        "gives (decode attention of a batch whose KV lengths differ: the mean KV's time plus the "
                        "median alpha of its pure-decode batches x the gap to the longest KV's)")
    p.add_argument("--device-spec", default=None, metavar="NAME",
                   help="the GPU whose datasheet (memory bandwidth) the memory-roofline terms use: element-wise "
                        "work (norms, RoPE, activation, residual adds) where no profile times it, and greedy "
                        "sampling; needed only when the profiles do not name a known device (AIConfigurator's "
                        "do). Known: " + ", ".join(known_devices()) + ", or a short or CUDA name (H100, "
                        "'NVIDIA H100 80GB HBM3')")


def _add_regressor_flags(p) -> None:
    """The tables' knots, the regressors, their tuning and seed."""
    p.add_argument("--axes", default="data", choices=["data", "fixed"],
                   help="knots of the T_step tables' grids. data: every value the data were measured at, the "
                        "powers of two, multiples of 8/16/64 where the data are dense, and a knot each side of "
                        "every step the regressors take between knots (GEMM tiles, all-reduce protocols), over "
                        "the fixed log grid; fixed: the log grid alone (66 num_tokens knots from 1 to 65,536), "
                        "as tables had before. meta.json's axes.rule says which")
    p.add_argument("--regressor", default="tuned", choices=["rf", "tuned"],
                   help="rf: a random forest per target; tuned: an Optuna search over forest, "
                        "extra trees, boosting and the physics-informed model (whole steps and host time: "
                        "over the knots and smoothing of the additive tables; whole steps are scored on "
                        "random folds by mean and time-weighted error, so the few big prefill steps, "
                        "which hold much of the time, count)")
    p.add_argument("--trials", type=argtypes.count(1, 100_000), default=12, help="Optuna trials per target (tuned)")
    p.add_argument("--timeout-s", type=argtypes.positive, default=None,
                   help="wall-clock limit of each target's Optuna study")
    p.add_argument("--storage", default=None,
                   help="Optuna storage: a journal file path or an RDB URL (default: in memory); "
                        "several workers may share one")
    p.add_argument("--seed", type=argtypes.seed, default=0, help="seed of splits, forests and TPE")


def _add_output_flags(p) -> None:
    """The run-to-run scatter, held-out rows, MLflow tracking and the output directory."""
    p.add_argument("--scatter-runs", nargs="+", default=[], metavar="DIR",
                   help="measured runs of this device, two or more repeats each, or directories holding some (an "
                        "earlier campaign): their repeats' total step times join those of the step logs among "
                        "--profile to estimate how the device's speed varies from run to run (the scatter's run_cv "
                        "stored with the tables, which --ranges draws); with no such step logs they give the "
                        "whole scatter (cv and rho too), so profile-only tables carry the device's spread")
    p.add_argument("--holdout", default=None, metavar="FILE",
                   help="also report errors on this file's rows (never used for fitting)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default sqlite:///OUT/mlflow.db)")
    p.add_argument("--experiment", default="stepcal-fit", help="MLflow experiment name")
    p.add_argument("--register", default=None, metavar="NAME",
                   help="register the fitted T_step model under this name in the MLflow registry")
    p.add_argument("--no-mlflow", action="store_true", help="skip MLflow tracking")
    p.add_argument("--out", required=True, metavar="DIR", help="T_step table directory to write")


def run(args) -> int:
    check_output(args.out)
    check_store_uri(args.storage, flag="--storage", bare_kind="file")             # an Optuna journal file
    if not args.no_mlflow:
        check_store_uri(args.tracking_uri, flag="--tracking-uri", bare_kind="dir")  # an MLflow file store

    fit_tables(options_from_args(args))
    return 0


def options_from_args(args):
    """The library's FitOptions from the parsed flags, whose names its fields share."""

    return FitOptions(**{f.name: getattr(args, f.name) for f in fields(FitOptions)})
