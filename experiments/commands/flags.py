"""Flags that several commands share, and the library settings they turn into.

Loads only argparse and the bounds (math): library modules are imported inside the functions that
build settings, so `stepcal --help` stays instant.
"""
from __future__ import annotations

import argparse

from stepcal.experiments.commands import argtypes
from stepcal.experiments.commands.spec_flags import spec_decode_from_args

# The keys of simulator.schedulers.SCHEDULERS, listed here so `--help` imports no numpy (a test checks they agree).
SCHEDULER_NAMES = ("static", "continuous", "vllm", "sarathi", "slo")
# simulator.kv_cache.KV_SIZINGS, listed here for the same reason (a test checks they agree).
KV_SIZINGS = ("weights", "vllm")
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_BLOCK_SIZE = 16
STEP_MODEL_HELP = "const:MS, linear:A,B,C or a T_step table directory"


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only where it tells the reader something: not for a default of None
    (the flag is simply optional) and not where the help text already states its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        # the base class already leaves SUPPRESS and positional defaults out
        if action.default is None or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def add_scheduler_flags(parser: argparse.ArgumentParser, *, parallelism: bool = True,
                        prefix_caching: bool = True) -> None:
    """Scheduler and KV-cache flags, shared by simulate, measure, capacity and import; --tp and --ep
    (KV sizing of a multi-GPU instance) where `parallelism`; --prefix-caching where `prefix_caching`
    (an imported vLLM run has no prefix ids to replay it with)."""
    g = parser.add_argument_group("scheduler and KV cache")
    g.add_argument("--scheduler", default="vllm", choices=SCHEDULER_NAMES,
                   help="serving policy (default: vllm)")
    g.add_argument("--max-num-seqs", type=argtypes.scheduler_size, default=DEFAULT_MAX_NUM_SEQS,
                   help=f"max sequences per step (default {DEFAULT_MAX_NUM_SEQS})")
    g.add_argument("--max-batched-tokens", type=argtypes.scheduler_size, default=None,
                   help="token budget per step (default 8192; static: unlimited; sarathi: --chunk-size)")
    g.add_argument("--chunk-size", type=argtypes.scheduler_size, default=512, help="prefill chunk / token budget of sarathi and slo "
                   "(default 512)")
    g.add_argument("--block-size", type=argtypes.block_size, default=DEFAULT_BLOCK_SIZE,
                   help=f"tokens per KV block (default {DEFAULT_BLOCK_SIZE})")
    g.add_argument("--kv-blocks", type=argtypes.kv_blocks, default=None, help="KV cache capacity in blocks "
                   "(default: derived from --device-memory-gb, else unlimited)")
    g.add_argument("--device-memory-gb", type=argtypes.positive, default=None,
                   help="derive --kv-blocks from this device memory and --model-spec")
    g.add_argument("--gpu-memory-utilization", type=argtypes.fraction, default=0.9, help="share of device memory for "
                   "weights + KV cache when deriving --kv-blocks (default 0.9)")
    g.add_argument("--kv-sizing", choices=KV_SIZINGS, default="weights",
                   help="how --device-memory-gb becomes --kv-blocks: 'weights' gives the cache memory x "
                        "utilisation less the weights; 'vllm' also takes off what vLLM V1's start-up profile "
                        "run uses (activations of a --max-batched-tokens forward, the sampler over "
                        "--max-num-seqs sequences, non-torch memory), as vLLM sizes its cache (default: weights)")
    if parallelism:
        _add_parallelism_flags(g)
    g.add_argument("--skip-oversize", action="store_true",
                   help="drop requests larger than the whole KV cache instead of failing")
    if prefix_caching:
        _add_prefix_caching_flag(g)


def _add_prefix_caching_flag(g) -> None:
    g.add_argument("--prefix-caching", choices=("on", "off"), default=None,
                   help="automatic prefix caching: a request reuses the cached KV blocks of the longest "
                        "prompt prefix it shares (by the trace's prefix_hash_ids) and prefills the rest; "
                        "freed blocks stay cached until evicted, least recently used first (default: on "
                        "for --scheduler vllm, as vLLM's V1 engine, off for the others)")


def prefix_caching_from_args(args) -> bool | None:
    """--prefix-caching as a bool; None: the scheduler's default."""
    value = getattr(args, "prefix_caching", None)
    return None if value is None else value == "on"


def _add_parallelism_flags(g) -> None:
    g.add_argument("--tp", type=argtypes.count(1, 1024), default=1, help="GPUs per model instance (tensor parallelism) when "
                   "deriving --kv-blocks: each GPU holds its share of the weights and KV heads; as in vLLM it must "
                   "divide --model-spec's attention heads, and divide its KV heads or be a multiple of them (default 1)")
    g.add_argument("--ep", type=argtypes.count(1, 1024), default=1, help="expert parallelism of a mixture-of-experts model when "
                   "deriving --kv-blocks: experts spread over --ep of the --tp GPUs; must divide --tp and the "
                   "model's experts (default 1)")


def add_measured_run_flags(parser: argparse.ArgumentParser) -> None:
    """--measured and --step-model: the inputs of validate and calibrate."""
    parser.add_argument("--measured", required=True,
                        help="measured run directory (`stepcal measure` or `stepcal import vllm-bench`)")
    parser.add_argument("--step-model", required=True, help=STEP_MODEL_HELP)


def scheduler_config_from_args(args):
    """The SchedulerConfig of the scheduler flags (with --spec-decode where the command has it); every size
    must be positive (InputError naming the flag)."""
    from stepcal.simulator.schedulers import checked_scheduler_config  # lazy: loads numpy
    return checked_scheduler_config(args.max_num_seqs, args.max_batched_tokens, args.chunk_size,
                                    block_size=args.block_size, kv_blocks=getattr(args, "kv_blocks", None),
                                    spec_decode=spec_decode_from_args(args))


def _kv_sizing(args):
    from stepcal.simulator.kv_cache import KvCacheSizing  # lazy: loads numpy
    return KvCacheSizing(block_size=args.block_size, kv_blocks=args.kv_blocks, device_memory_gb=args.device_memory_gb,
                         gpu_memory_utilization=args.gpu_memory_utilization, tp=getattr(args, "tp", 1),
                         ep=getattr(args, "ep", 1), sizing=getattr(args, "kv_sizing", "weights"),
                         max_num_batched_tokens=args.max_batched_tokens, max_num_seqs=args.max_num_seqs)


def kv_cache_from_args(args):
    """The KV cache's sizing from --block-size, --kv-blocks, --device-memory-gb, --gpu-memory-utilization,
    --kv-sizing (with --max-batched-tokens and --max-num-seqs), --tp and --ep (argtypes refused values
    below 1 when parsing), checked against --model-spec (a bad
    spec or an impossible split is an InputError); measure has no --tp / --ep."""
    sizing = _kv_sizing(args)
    sizing.num_blocks(args.model_spec)   # the spec and the tp / ep split refused here, before any work
    return sizing


def kv_blocks_from_args(args) -> int | None:
    """The KV cache's blocks (None: unlimited), the spec and the tp / ep split checked as kv_cache_from_args does."""
    return _kv_sizing(args).num_blocks(args.model_spec)


def add_command(subparsers, name: str, summary: str, description: str, run) -> argparse.ArgumentParser:
    """A subcommand that runs `run(args)`; its --help shows `description` as written (examples keep
    their line breaks)."""
    parser = subparsers.add_parser(name, help=summary, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(func=run)
    return parser


def add_ranges_flags(parser: argparse.ArgumentParser) -> None:
    """--ranges and what the replications draw: simulate and validate."""
    g = parser.add_argument_group("ranges (how sure the prediction is)")
    g.add_argument("--ranges", type=argtypes.num_replications, default=0, metavar="N",
                   help="also run N seeded replications, each drawing the step model's error (per T_step term and "
                        "region, from the fit's held-out errors, held for the whole run: meta.json model_error, else "
                        "the recorded MAPE, else the tables' spread; calibrated host terms jointly from the covariance "
                        "of their fit), the device's speed over the run and the step-to-step scatter (the flags "
                        "below, else the tables', else the profile's speed probes and repeats); for every figure the "
                        "median and the 5th and 95th percentiles over the replications (a 90%% interval). The "
                        "ranges block's `sources` lists what was drawn and what is not known. const:/linear: "
                        "models have no spread: only the scatter varies (default 0: no ranges)")
    g.add_argument("--scatter-cv", type=argtypes.scatter_cv, default=None,
                   help="step-to-step scatter of step time in the replications: coefficient of variation of a "
                        "multiplicative AR(1) factor (default: the scatter measured on the device and stored "
                        "with the tables by `stepcal calibrate`, meta.json's scatter; else 0)")
    g.add_argument("--scatter-rho", type=argtypes.correlation, default=None,
                   help="lag-one autocorrelation of that factor, in (-1, 1) (default: the tables' measured one, "
                        "else 0)")
    g.add_argument("--scatter-run-cv", type=argtypes.scatter_cv, default=None,
                   help="the device's speed over a whole run: coefficient of variation of one log-normal level "
                        "per replication that multiplies every step (default: the tables' measured one, from the "
                        "two repeats' total step times; else 0)")
    g.add_argument("--scatter-run-cv-pairs", type=argtypes.count(0, 1_000_000), default=None, metavar="N",
                   help="take run_cv as an estimate from N pairs of runs (meta.json's run_cv_pairs says how many the "
                        "tables' has): each replication draws its level from Student's t with N degrees of freedom, "
                        "the law of a new run's speed when run_cv is itself estimated. With a quickstart's three "
                        "pairs it about doubles the level's part of the interval; on 16 campaigns of a 2-core VM it "
                        "brought the pooled coverage of 90%% intervals to 89-90%% but left fewer campaigns within "
                        "80-97%% (too wide where run_cv was right): pool more pairs with --scatter-runs instead "
                        "where you can (default 0: run_cv taken as exact)")
    g.add_argument("--scatter-model-repeats", type=argtypes.count(0, 1_000_000), default=None, metavar="K",
                   help="the step model's speed level was fitted to a measured run of K repeats, whose speed it "
                        "carries: a new run differs from it by run_cv x sqrt(1 + 1/K), not run_cv; 0: the model's "
                        "level is exact (default: the tables' model_level_repeats, which `stepcal calibrate` "
                        "stores, else 0). On 16 campaigns of a 2-core VM it raised the pooled coverage of 90%% "
                        "intervals from 78%% to 82%% (calibrated tables) and from 82%% to 87%% (profiled tables "
                        "calibrated), widths from 60%% to 64%% and 69%% to 77%% of the measured value")
    g.add_argument("--ranges-seed", type=argtypes.seed, default=0, help="seed of the replications (default 0)")
    g.add_argument("--workers", type=argtypes.count(1, 1024), default=1,
                   help="local: run the replications in this many processes (1: in this one); ray without "
                        "--ray-address: CPUs of the local Ray cluster (same results either way; default 1)")
    g.add_argument("--backend", default="local", choices=["local", "ray"],
                   help="where the replications run: local, a process pool on this machine; ray, one Ray task "
                        "per replication (pip install 'stepcal[ray]'). The same summaries in the same order "
                        "(default local)")
    g.add_argument("--ray-address", default=None,
                   help="with --backend ray: address of a running Ray cluster (e.g. ray://head:10001 or auto), "
                        "whose nodes have stepcal installed. Default: start a local cluster for the run")


def ranges_settings_from_args(args):
    """The library's RangesSettings from the flags of add_ranges_flags."""
    from stepcal.experiments.replications import (  # lazy: loads concurrent, multiprocessing, numpy, tqdm
        RangesSettings,
        ScatterOverrides,
    )
    scatter = ScatterOverrides(cv=args.scatter_cv, rho=args.scatter_rho, run_cv=args.scatter_run_cv,
                               run_cv_pairs=args.scatter_run_cv_pairs, model_level_repeats=args.scatter_model_repeats)
    return RangesSettings(num_replications=args.ranges, seed=args.ranges_seed, workers=args.workers,
                          backend=args.backend, ray_address=args.ray_address, scatter=scatter)
