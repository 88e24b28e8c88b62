"""`stepcal simulate`: run a trace through a scheduler in the discrete-event simulator."""
from __future__ import annotations

import sys
from dataclasses import asdict

from stepcal.core.errors import print_warnings
from stepcal.core.io import atomic_output_dir, atomic_write_json, atomic_write_parquet, atomic_write_table
from stepcal.experiments.commands import argtypes
from stepcal.experiments.commands.flags import (
    add_command,
    add_ranges_flags,
    add_scheduler_flags,
    kv_blocks_from_args,
    prefix_caching_from_args,
    ranges_settings_from_args,
    scheduler_config_from_args,
)
from stepcal.experiments.commands.output import format_summary
from stepcal.experiments.commands.spec_flags import add_spec_decode_flags, drafted_model_from_args
from stepcal.experiments.host_defaults import add_host_defaults_flag
from stepcal.experiments.output_paths import check_output
from stepcal.experiments.value_checks import ROUTER_NAMES

HELP = """Simulate serving a trace: each step's time comes from --step-model, requests flow through
the chosen scheduler and a paged KV cache. Writes OUT/requests.parquet, OUT/steps.parquet,
OUT/summary.json and OUT/config.json, and prints a short table. summary.json's `host_defaults` says
which engine terms --host-defaults added (engine, auto or flag, each term), null where none were;
the printed table says so in one line after it. With --ranges N, summary.json gains a
`ranges` block (each figure's median and 90% interval over N replications) and
OUT/ranges_percentiles.parquet holds each replication's TTFT, TPOT and E2E at the quantiles 0, 0.01,
..., 1 (columns replication, seed, metric, quantile, value_ms): `stepcal report OUT` draws the CDFs
with their band. A progress bar over the replications goes to stderr (not with --quiet).

examples:
  stepcal simulate --trace AzureLLMInferenceTrace_conv.csv \\
      --scheduler sarathi --step-model linear:8,0.03,0.0002 --out runs/conv
  stepcal simulate --trace poisson:rate=5,n=1000,prompt=lognormal:512:1.0,output=uniform:16:256 \\
      --scheduler vllm --step-model const:20 --kv-blocks 2000 --out runs/p5"""


BATCHES_AUTO_LIMIT = 50_000   # step batches of longer traces would take GBs of memory


def register(subparsers) -> None:
    p = add_command(subparsers, "simulate", "simulate a trace under a scheduler", HELP, run)
    p.add_argument("--trace", required=True, help="trace file (stepcal CSV/Parquet, Azure CSV, Mooncake JSONL, "
                   "Vidur CSV) or a generator spec (see `stepcal trace --help`)")
    p.add_argument("--trace-format", default=None, help="force the trace format (default: auto-detect)")
    p.add_argument("--step-model", required=True, help="const:MS, linear:A,B,C (A + B·num_tokens + "
                   "C·Σ(s_i+q_i) ms) or a T_step table directory from `stepcal fit`")
    add_host_defaults_flag(p)
    p.add_argument("--model-spec", default=None, help="model preset, ModelSpec file or Hugging Face config.json (needed for --device-memory-gb)")
    add_scheduler_flags(p)
    add_spec_decode_flags(p)
    g = p.add_argument_group("replicas and workload")
    g.add_argument("--replicas", type=argtypes.replicas, default=1, help="number of replicas (default 1)")
    g.add_argument("--router", default="round-robin", choices=ROUTER_NAMES,
                   help="how arrivals are spread over replicas")
    g.add_argument("--step-overhead-ms", type=argtypes.time_ms_or_zero, default=0.0, help="host time added to every step")
    g.add_argument("--rate", type=argtypes.rate, default=None, help="rescale the trace's arrivals to this mean rate (req/s)")
    g.add_argument("--num-requests", type=argtypes.num_requests, default=None, help="keep only the first N requests")
    g.add_argument("--duration", type=argtypes.seconds, default=None, help="keep only requests arriving in the first S seconds")
    g.add_argument("--seed", type=argtypes.seed, default=0, help="seed for generated workloads (default 0)")
    g.add_argument("--timeout-s", type=argtypes.seconds, default=None,
                   help="client timeout for requests whose trace gives no timeout_s: a request not finished "
                        "this long after it was sent is aborted (its KV blocks freed at the next step) and "
                        "counted in num_timeouts, not in the latencies (load tests often use 300)")
    add_ranges_flags(p)
    g = p.add_argument_group("metrics and output")
    g.add_argument("--slo-ttft-ms", type=argtypes.time_ms, default=None, help="TTFT SLO for attainment and goodput")
    g.add_argument("--slo-tpot-ms", type=argtypes.time_ms, default=None, help="TPOT SLO for attainment and goodput")
    g.add_argument("--step-batches", choices=["auto", "on", "off"], default="auto",
                   help="keep each step's request_ids / q_lens / kv_lens in steps.parquet; auto: only for traces "
                        f"of up to {BATCHES_AUTO_LIMIT:,} requests, whose logs stay small (default auto)")
    g.add_argument("--no-fast-path", action="store_true",
                   help="take every decode step one by one (same results, slower; for checking)")
    g.add_argument("--quiet", action="store_true", help="print nothing but errors")
    g.add_argument("--out", required=True, help="output directory")


def _record_batches(choice: str, num_requests: int) -> bool:
    return choice == "on" or (choice == "auto" and num_requests <= BATCHES_AUTO_LIMIT)


def run(args) -> int:
    check_output(args.out)
    kv_blocks = kv_blocks_from_args(args)   # the model spec and the tp / ep split refused before any work
    from stepcal.core.metrics import clean_json  # lazy: loads numpy
    from stepcal.core.workload import load_workload  # lazy: loads numpy
    from stepcal.experiments.step_models import describe_step_model, front_end, resolve_step_models  # lazy: loads numpy
    from stepcal.simulator.simulation import SimConfig, Simulation  # lazy: loads numpy, tqdm

    scheduler_config = scheduler_config_from_args(args)   # bad flags refused before any work
    (model,), added = resolve_step_models([args.step_model], args.host_defaults, args.scheduler, args.tp)
    model = drafted_model_from_args(args, model, scheduler_config.spec_decode)
    trace = load_workload(args.trace, trace_format=args.trace_format, rate_rps=args.rate,
                          num_requests=args.num_requests, duration_s=args.duration, seed=args.seed)
    print_warnings(trace.warnings)
    config = SimConfig(scheduler=args.scheduler, scheduler_config=scheduler_config,
                       block_size=args.block_size, kv_blocks=kv_blocks,
                       num_replicas=args.replicas, router=args.router, step_overhead_ms=args.step_overhead_ms,
                       front_end=front_end(model),
                       fast_path=not args.no_fast_path, record_batches=_record_batches(args.step_batches, len(trace)),
                       skip_oversize=args.skip_oversize, slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
                       prefix_caching=prefix_caching_from_args(args), timeout_s=args.timeout_s)
    sim = Simulation(trace, model, config)   # checks the inputs (a request larger than the cache) up front
    if sim.num_skipped and not args.quiet:
        print(f"stepcal: warning: skipped {sim.num_skipped} requests larger than the KV cache", file=sys.stderr)
    ranges = quantiles = None
    if args.ranges:
        # The replications run before the plain run: their workers never live beside its logs, so the
        # whole process tree stays within about twice one run's memory.
        from stepcal.experiments.replications import (  # lazy: loads concurrent, multiprocessing, numpy, tqdm
            RANGES_PERCENTILES,
            replicate_ranges,
        )
        ranges = replicate_ranges(ranges_settings_from_args(args), args.step_model, trace, model, config,
                                  quantiles=True, quiet=args.quiet)
        # a table, stored beside summary.json and named in it (stepcal report draws the CDF bands from it)
        quantiles = ranges.pop("replica_quantiles")
        ranges["replica_quantiles_file"] = RANGES_PERCENTILES
    result = sim.run(progress=not args.quiet)
    summary = {**result.summary, "step_model": describe_step_model(args.step_model, model),
               "host_defaults": None if added is None else added.to_dict(),
               "trace": str(args.trace), "sim_wall_s": result.wall_s}
    if ranges is not None:
        summary["ranges"] = ranges
    summary = clean_json(summary)
    with atomic_output_dir(args.out) as staging:
        atomic_write_parquet(result.requests, staging / "requests.parquet")
        atomic_write_table(result.steps_table, staging / "steps.parquet")
        if quantiles is not None:
            atomic_write_parquet(quantiles, staging / RANGES_PERCENTILES)
        atomic_write_json(staging / "summary.json", summary)
        atomic_write_json(staging / "config.json", clean_json(run_config(args, config)))
    if not args.quiet:
        print(format_summary(summary))
        if added is not None:
            print(added.describe())
        if args.ranges:
            print(format_ranges(summary["ranges"]))
        print(f"wrote {args.out}/requests.parquet, steps.parquet, summary.json")
    return 0


def format_ranges(ranges: dict) -> str:
    """One line per latency metric: P50 and P99 as median [low, high] over the replications."""
    stats = ranges["stats"]
    lines = [f"ranges ({ranges['num_replications']} replications, {ranges['interval_percentiles'][0]:g}th-"
             f"{ranges['interval_percentiles'][1]:g}th percentiles; drawn: "
             f"{', '.join(ranges['drawn_terms']) or 'no term spread'}, scatter cv {ranges['scatter_cv']:g}):"]
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        cells = [(q, stats.get(metric, {}).get(q)) for q in ("p50", "p99")]
        lines.append(f"  {metric:<8}" + "  ".join(f"{q} {c['median']:.4g} [{c['low']:.4g}, {c['high']:.4g}]"
                                                for q, c in cells if c))
    t = stats.get("throughput_rps")
    if t:
        lines.append(f"  throughput {t['median']:.4g} [{t['low']:.4g}, {t['high']:.4g}] req/s")
    if ranges.get("sources"):
        from stepcal.experiments.validation.error_sources import sources_text  # lazy: loads numpy
        lines.append(sources_text(ranges["sources"]))
    return "\n".join(lines)


def run_config(args, config) -> dict:
    """Everything needed to replay this simulation (validate and calibrate read it)."""
    return {"command": "simulate", "args": {k: v for k, v in vars(args).items() if k != "func"},
            "sim_config": asdict(config)}
