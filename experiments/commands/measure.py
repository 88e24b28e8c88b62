"""`stepcal measure`: serve a trace for real on the torch engine and write measured logs."""
from __future__ import annotations

import sys
from functools import partial

from stepcal.core.errors import InputError, print_warnings
from stepcal.core.model_files import load_model_spec
from stepcal.experiments.commands import argtypes
from stepcal.experiments.commands.flags import (
    add_command,
    add_scheduler_flags,
    kv_blocks_from_args,
    prefix_caching_from_args,
    scheduler_config_from_args,
)
from stepcal.experiments.commands.output import format_summary
from stepcal.experiments.output_paths import check_output
from stepcal.profiler.noise_policy import NoisePolicy

HELP = """Serve a trace for real: the simulator's scheduler drives the torch Llama-style model (random
weights) on the device, one real forward pass per step, greedy sampling, output lengths from the
trace. Writes OUT/meta.json, OUT/trace.parquet, OUT/repeat_<k>/{requests,steps}.parquet and
summary.json, and OUT/summary.json (with the run-to-run noise floor when --repeats >= 2).
On the CPU, STEPCAL_ALLOCATOR=warm keeps freed memory in the process (see `stepcal profile
--help`); meta.json records the setting as `allocator`.

example:
  stepcal measure --model-spec tiny --device cpu \\
      --trace poisson:rate=20,n=300,prompt=lognormal:256:0.8,output=lognormal:64:0.8 \\
      --scheduler sarathi --chunk-size 256 --repeats 2 --out runs/measured"""


def register(subparsers) -> None:
    p = add_command(subparsers, "measure", "serve a trace for real on the torch engine", HELP, run)
    p.add_argument("--model-spec", default="tiny", help="model preset, ModelSpec file or Hugging Face config.json (default tiny; MoE: tiny-moe)")
    p.add_argument("--device", type=argtypes.device, default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: float32 on CPU, bf16 on CUDA)")
    p.add_argument("--threads", type=argtypes.count(1, 1024), default=1, help="torch threads on the CPU (default 1)")
    p.add_argument("--trace", required=True, help="trace file or generator spec (see `stepcal trace --help`)")
    p.add_argument("--trace-format", default=None, help="force the trace format (default: auto-detect)")
    p.add_argument("--rate", type=argtypes.rate, default=None, help="rescale arrivals to this mean rate (req/s)")
    p.add_argument("--num-requests", type=argtypes.count(), default=None, help="keep only the first N requests")
    p.add_argument("--duration", type=argtypes.seconds, default=None, help="keep only requests arriving in the first S seconds")
    add_scheduler_flags(p, parallelism=False)   # the torch engine runs on one device
    p.add_argument("--clock", default="virtual", choices=["virtual", "wall"],
                   help="virtual: run every step for real but skip idle gaps (default); wall: real time")
    p.add_argument("--repeats", type=argtypes.count(1, 1000), default=1, help="serve the workload R times (R >= 2 gives the noise floor)")
    p.add_argument("--retry-slowed", type=argtypes.count(0, 100), default=0, metavar="N",
                   help="serve a repeat again when the machine slowed it (another process on the cores: 32 "
                        "consecutive steps whose median time, over their shapes' usual time, is over 1.25x the "
                        "other repeats' over the same stretch, or 1.4x with one repeat), up to N times in all; "
                        "one slowed again in the same place is kept, as the engine's own, and its summary.json "
                        "says so (slow_again_in_same_place: validate then notes it instead of warning) "
                        "(default 0: such repeats are kept, and named on stderr; on cpu each repeat's summary.json "
                        "records its slowest_window either way, on cuda only with N > 0: the rule is for a shared "
                        "CPU's cores)")
    p.add_argument("--seed", type=argtypes.seed, default=0, help="seed of weights, prompt tokens and generated workloads")
    p.add_argument("--timeout-s", type=argtypes.seconds, default=None,
                   help="client timeout for requests whose trace gives no timeout_s: the engine aborts a request "
                        "not finished this long after it arrived and frees its KV blocks")
    p.add_argument("--slo-ttft-ms", type=argtypes.time_ms, default=None)
    p.add_argument("--slo-tpot-ms", type=argtypes.time_ms, default=None)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--out", required=True, help="output directory")


def run(args) -> int:

    check_output(args.out)
    from stepcal.core.workload import load_workload  # lazy: loads numpy
    from stepcal.profiler.engine.measure import measure_trace  # lazy: loads numpy, torch
    if args.repeats < 1 or args.threads < 1:
        raise InputError("--repeats and --threads must be at least 1")
    spec = load_model_spec(args.model_spec)
    trace = load_workload(args.trace, trace_format=args.trace_format, rate_rps=args.rate,
                          num_requests=args.num_requests, duration_s=args.duration, seed=args.seed)
    print_warnings(trace.warnings)
    summary = measure_trace(trace, spec, _engine_config(args), args.out, device=args.device, dtype=args.dtype,
                            num_threads=args.threads, repeats=args.repeats, trace_source=str(args.trace),
                            on_repeat=None if args.quiet else _print_repeat, noise=noise_policy(args),
                            on_slowed=partial(_print_slowed, hint=args.retry_slowed == 0))
    if not args.quiet:
        print(format_summary(summary))
        if "noise_floor" in summary:
            nf = summary["noise_floor"]
            print("run-to-run noise (|Δ|/value, repeat 1 vs 0): " + ", ".join(
                f"{m} p50 {_pct(nf[m]['p50'])} p99 {_pct(nf[m]['p99'])}" for m in ("ttft_ms", "tpot_ms", "e2e_ms")))
        print(f"wrote {args.out}")
    return 0


def noise_policy(args):
    """The measured run's noise handling: the device's (profiler.noise_policy), with --retry-slowed."""
    return NoisePolicy.for_device(args.device).with_retry_slowed(args.retry_slowed)


def _print_slowed(k: int, window: dict, action: str, hint: bool) -> None:
    """measure_trace's on_slowed: `action` is "again", "kept" or "same place"."""
    from stepcal.profiler.engine.slowdown import SlowestWindow  # lazy: loads numpy, torch
    why = SlowestWindow.from_dict(window).describe()
    if action == "same place":
        said = f"slow again in the same place when served again ({why}): kept, as the engine's own"
    else:
        kept = "kept" + (" (--retry-slowed N serves such a repeat again)" if hint else "")
        said = f"the machine slowed it ({why}); {'serving it again' if action == 'again' else kept}"
    print(f"warning: repeat {k}: {said}", file=sys.stderr)


def _print_repeat(k: int, result) -> None:
    s = result.summary
    print(f"repeat {k}: {s['num_finished']}/{s['num_requests']} requests, {s['num_steps']} steps in "
          f"{result.wall_s:.1f} s; TTFT p50 {s['ttft_ms']['p50']:.1f} ms, TPOT p50 {s['tpot_ms']['p50']:.2f} ms",
          file=sys.stderr)


def _engine_config(args):
    from stepcal.profiler.engine.engine import EngineConfig  # lazy: loads numpy, torch
    return EngineConfig(scheduler=args.scheduler, scheduler_config=scheduler_config_from_args(args),
                        block_size=args.block_size, kv_blocks=kv_blocks_from_args(args), clock=args.clock,
                        seed=args.seed, skip_oversize=args.skip_oversize,
                        slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
                        prefix_caching=prefix_caching_from_args(args), timeout_s=args.timeout_s)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
