"""`stepcal capacity`: the highest request rate a deployment serves within its SLOs."""
from __future__ import annotations

from stepcal.core import bounds
from stepcal.experiments.commands import argtypes
from stepcal.experiments.commands.flags import STEP_MODEL_HELP, add_command, add_ranges_flags, add_scheduler_flags
from stepcal.experiments.host_defaults import add_host_defaults_flag

HELP = """Find the highest request rate (the trace's arrivals rescaled to that mean rate) at which the
share of requests meeting the SLOs (TTFT ≤ --slo-ttft-ms and TPOT ≤ --slo-tpot-ms) is at least
--attainment. The search doubles or halves the rate from --rate-start until it brackets the answer,
then bisects (on a log scale) until the bracket is within --tolerance (relative); it then checks the
answer by simulating 5% above it. Deterministic: every rate simulates the same requests.

With --disaggregated P:D it also searches a prefill/decode-disaggregated deployment of P prefill and
D decode replicas, and compares it with an aggregated one of the same number of devices (P + D
replicas). TTFT there includes the KV transfer and the decode queue (see simulator/disaggregation.py).
--host-defaults (or calibrated tables) applies there too: each pool's step model gets the engine's
per-step host terms, and the deployment its request path, paid once before the prefill pool, its
per-stream part counting the requests active in both pools; auto adds them only where every pool's
step model prices the kernels only. capacity.json's `host_defaults` says which terms were added.

With --ranges N it also runs N seeded replications at each rate it probes (replication i draws the
step model's error and the step scatter from --ranges-seed + i, the same draw at every rate, so each
replication's attainment against rate is one curve). The median of the N attainments is the central
curve, their 5th and 95th percentiles the lower and upper bounds; the same bracket-and-bisect search
runs on each, from the same start, within the same limits, to the same tolerance, sharing the rates
simulated. It prints e.g. "capacity 6.2 req/s (90% interval 5.7-6.6)": the median curve's crossing,
then the lower bound's and the upper bound's. A bound that does not cross the target within the
searched limits (--rate-min / --rate-max, else the start / 2^20 and x 2^20) is reported as beyond
them, not as a number. The replications run in --workers processes (or, with --backend ray, as Ray
tasks) that each receive the trace and the step model once; a bar on stderr counts them. Costs N
simulations per rate probed against 1, on somewhat more rates (three searches that share their
bracketing probes; 11 rates against 9 on a 1,000-request trace); the line printed states both.
Aggregated deployments only.

Writes OUT/capacity.json (max_rate_rps, goodput_rps and the metrics at that rate, the check above it,
every probe; with --ranges a `ranges` block: max_rate_rps as {median, low, high} with null where a
curve is beyond the searched range, `curves` with each search (beyond: "above" / "below", limit_rps),
`probes` with each figure's median, low and high per rate, num_simulations and wall_s) and
OUT/capacity.png (attainment and P99 TTFT / TPOT against rate; with --ranges the attainment's 90%
band and the interval of the capacity).

examples:
  stepcal capacity --trace ../shared/data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv \\
      --duration 600 --step-model linear:8,0.03,0.0002 --scheduler sarathi \\
      --slo-ttft-ms 500 --slo-tpot-ms 50 --out runs/capacity
  stepcal capacity --trace poisson:n=2000,prompt=lognormal:512:1.0,output=uniform:16:256 \\
      --step-model linear:8,0.03,0.0002 --slo-ttft-ms 500 --slo-tpot-ms 50 \\
      --disaggregated 1:1 --model-spec llama-3-8b --kv-transfer-gbps 25 --out runs/pd
  stepcal capacity --trace poisson:n=500,prompt=uniform:32:512,output=uniform:8:128 \
      --step-model tables/tiny --slo-ttft-ms 300 --slo-tpot-ms 40 \
      --ranges 20 --scatter-cv 0.05 --scatter-rho 0.5 --workers 2 --out runs/capacity_ranges"""


def register(subparsers) -> None:
    p = add_command(subparsers, "capacity", "find the highest request rate that meets the SLOs", HELP, run)
    p.add_argument("--trace", required=True, help="trace file or generator spec (see `stepcal trace --help`)")
    p.add_argument("--trace-format", default=None, help="force the trace format (default: auto-detect)")
    p.add_argument("--num-requests", type=argtypes.count(), default=None, help="keep only the first N requests")
    p.add_argument("--duration", type=argtypes.seconds, default=None,
                   help="keep only requests arriving in the first S seconds (of the trace as given)")
    p.add_argument("--seed", type=argtypes.seed, default=0, help="seed for generated workloads (default 0)")
    p.add_argument("--step-model", required=True, help=STEP_MODEL_HELP)
    add_host_defaults_flag(p)
    p.add_argument("--model-spec", default=None,
                   help="model preset, ModelSpec file or Hugging Face config.json: KV bytes per token for --disaggregated, and --device-memory-gb")
    add_scheduler_flags(p)
    g = p.add_argument_group("deployment")
    g.add_argument("--replicas", type=argtypes.count(1, bounds.MAX_REPLICAS), default=None,
                   help="replicas of the aggregated deployment (default 1; with --disaggregated, P + D)")
    g.add_argument("--router", default="round-robin", choices=["round-robin", "least-tokens"],
                   help="how arrivals are spread over replicas (each pool's own router when disaggregated)")
    g.add_argument("--step-overhead-ms", type=argtypes.time_ms_or_zero, default=0.0, help="host time added to every step")
    g = p.add_argument_group("SLO and search")
    g.add_argument("--slo-ttft-ms", type=argtypes.time_ms, default=None, help="TTFT SLO in ms")
    g.add_argument("--slo-tpot-ms", type=argtypes.time_ms, default=None, help="TPOT SLO in ms")
    g.add_argument("--attainment", type=argtypes.fraction, default=0.9,
                   help="share of requests that must meet the SLOs (default 0.9)")
    g.add_argument("--tolerance", type=argtypes.fraction, default=0.02,
                   help="relative width of the final bracket (default 0.02: the answer is within 2%%)")
    g.add_argument("--rate-start", type=argtypes.rate, default=None,
                   help="first rate probed, req/s (default: the trace's own mean rate)")
    g.add_argument("--rate-min", type=argtypes.rate, default=None, help="never probe below this rate (req/s)")
    g.add_argument("--rate-max", type=argtypes.rate, default=None, help="never probe above this rate (req/s)")
    g = p.add_argument_group("prefill/decode disaggregation")
    g.add_argument("--disaggregated", default=None, metavar="P:D",
                   help="also search P prefill + D decode replicas, against P + D aggregated replicas")
    g.add_argument("--prefill-step-model", default=None, help="step-time model of the prefill pool "
                   "(default --step-model)")
    g.add_argument("--decode-step-model", default=None, help="step-time model of the decode pool "
                   "(default --step-model)")
    g.add_argument("--kv-transfer-alpha-ms", type=argtypes.time_ms_or_zero, default=0.5,
                   help="fixed cost of one KV transfer, ms (default 0.5)")
    g.add_argument("--kv-transfer-gbps", type=argtypes.positive, default=25.0,
                   help="KV transfer bandwidth in GB/s (10^9 bytes/s; default 25, a PCIe 4/5 or IB link)")
    add_ranges_flags(p)
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--out", required=True, help="output directory")


def parse_split(text: str) -> tuple[int, int]:
    """'P:D' → (P, D), both positive."""
    from stepcal.core.errors import InputError
    head, sep, tail = text.partition(":")
    try:
        p, d = int(head), int(tail)
    except ValueError:
        p = d = 0
    if not sep or p < 1 or d < 1:
        raise InputError(f"--disaggregated: expected P:D with positive integers (e.g. 1:1 or 2:3), got {text!r}")
    return p, d


def run(args) -> int:
    import time

    from stepcal.experiments.commands.output_paths import check_output
    check_output(args.out)
    from stepcal.core.errors import InputError
    from stepcal.core.io import atomic_output_dir, atomic_write_json
    from stepcal.core.metrics import clean_json
    from stepcal.core.workload import load_workload, mean_rate_rps
    from stepcal.experiments.capacity import (
        RateEvaluator,
        aggregated,
        capacity_record,
        check_above,
        disaggregated,
        format_record,
        search_capacity,
    )
    from stepcal.experiments.capacity.plot import plot_capacity
    from stepcal.experiments.commands.flags import (
        kv_blocks_from_args,
        prefix_caching_from_args,
        scheduler_config_from_args,
    )
    from stepcal.experiments.commands.output import print_warnings
    from stepcal.experiments.step_models import describe_step_model, front_end
    from stepcal.simulator.simulation import SimConfig

    if args.slo_ttft_ms is None and args.slo_tpot_ms is None:
        raise InputError("capacity needs an SLO: give --slo-ttft-ms and/or --slo-tpot-ms")
    split = parse_split(args.disaggregated) if args.disaggregated else None
    if args.ranges and split is not None:
        raise InputError("--ranges: the replications model aggregated replicas only (the disaggregated "
                         "simulation draws no scatter); run --ranges without --disaggregated")
    num_replicas = _aggregated_replicas(args.replicas, split)
    (model, *pools), added = _step_models(args, split)
    trace = load_workload(args.trace, trace_format=args.trace_format, num_requests=args.num_requests,
                          duration_s=args.duration, seed=args.seed)
    print_warnings(trace.warnings)
    start_rps = args.rate_start if args.rate_start is not None else mean_rate_rps(trace)
    if start_rps is None:
        raise InputError(f"{args.trace}: all requests arrive at one instant, so the trace has no rate to "
                         f"rescale; give a trace with spread arrivals")
    config = SimConfig(scheduler=args.scheduler, scheduler_config=scheduler_config_from_args(args),
                       block_size=args.block_size, kv_blocks=kv_blocks_from_args(args), num_replicas=num_replicas,
                       router=args.router, step_overhead_ms=args.step_overhead_ms, skip_oversize=args.skip_oversize,
                       front_end=front_end(model),
                       slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
                       prefix_caching=prefix_caching_from_args(args))
    deployments = {"aggregated": RateEvaluator(trace, aggregated(model, config))}
    if split is not None:
        prefill_model, decode_model = pools
        disagg_config = disagg_config_from_args(args, config, split, pools_front_end(args, prefill_model, decode_model))
        deployments["disaggregated"] = RateEvaluator(trace, disaggregated(prefill_model, decode_model, disagg_config))

    if added is not None and not args.quiet:
        print(added.describe())
    records = {}
    for label, evaluate in deployments.items():
        wall0 = time.perf_counter()
        result = search_capacity(evaluate, start_rps=start_rps, target_attainment=args.attainment,
                                 tolerance=args.tolerance, min_rps=args.rate_min, max_rps=args.rate_max)
        records[label] = capacity_record(result, check_above(evaluate, result))
        plain_wall_s = time.perf_counter() - wall0
        if not args.quiet:
            print(format_record(f"{label} ({_describe(label, num_replicas, split)})", records[label]))
    if args.ranges:
        from stepcal.experiments.capacity.ranges import format_ranges
        records["aggregated"]["ranges"] = _capacity_ranges(args, trace, model, config, start_rps)
        if not args.quiet:
            print(format_ranges(records["aggregated"]["ranges"], len(deployments["aggregated"].cache), plain_wall_s))

    out = {**records["aggregated"], "deployment": _describe("aggregated", num_replicas, split),
           "num_replicas": num_replicas, "scheduler": args.scheduler, "slo_ttft_ms": args.slo_ttft_ms,
           "slo_tpot_ms": args.slo_tpot_ms, "trace": str(args.trace), "trace_rate_rps": mean_rate_rps(trace),
           "num_requests": len(trace), "step_model": describe_step_model(args.step_model, model),
           "host_defaults": None if added is None else added.to_dict(),
           "args": {k: v for k, v in vars(args).items() if k != "func"}}
    if split is not None:
        out["disaggregated"] = {**records["disaggregated"], "deployment": _describe("disaggregated", num_replicas, split),
                                "num_prefill_replicas": split[0], "num_decode_replicas": split[1],
                                "prefill_step_model": describe_step_model(args.prefill_step_model or args.step_model,
                                                                          prefill_model),
                                "decode_step_model": describe_step_model(args.decode_step_model or args.step_model,
                                                                         decode_model)}
        out["comparison"] = _comparison(records, num_replicas)
        if not args.quiet:
            print(_format_comparison(out["comparison"]))
    with atomic_output_dir(args.out) as staging:
        atomic_write_json(staging / "capacity.json", clean_json(out))
        plot_capacity(records, args.slo_ttft_ms, args.slo_tpot_ms, staging / "capacity.png")
    if not args.quiet:
        print(f"wrote {args.out}/capacity.json, capacity.png")
    return 0


def _step_models(args, split):
    """The aggregated deployment's step model, then with --disaggregated the prefill and decode pools',
    and the engine terms --host-defaults added (AddedHostTerms, or None). The terms go on every pool's
    model (each pool pays its own per-step host time) and their request path on the deployment (paid
    once, before the prefill pool); auto decides for all the models at once, so that the pools never
    get two request paths."""
    from stepcal.experiments.step_models import resolve_step_models
    specs = [args.step_model]
    if split is not None:
        specs += [args.prefill_step_model or args.step_model, args.decode_step_model or args.step_model]
    return resolve_step_models(specs, args.host_defaults, args.scheduler)


def _capacity_ranges(args, trace, model, config, start_rps: float) -> dict:
    """The `ranges` block of capacity.json (experiments.capacity.ranges): N replications per rate probed,
    run in --workers processes that share the trace and the step model."""
    import time
    from dataclasses import replace

    from stepcal.experiments.capacity.ranges import ReplicatedRates, ranges_record, search_capacity_ranges
    from stepcal.experiments.commands.flags import pool_settings_from_args, replication_settings, scatter_from_args
    from stepcal.experiments.replications import ReplicaPool, keep_summary, progress_bar
    from stepcal.simulator.ranges import replication_seeds
    scatter, _ = scatter_from_args(args)
    wall0 = time.perf_counter()
    # the number of rates probed is known only at the end: the bar counts simulations
    with ReplicaPool(trace, model, replace(config, scatter=scatter), **pool_settings_from_args(args)) as pool, \
            progress_bar(None, args.quiet, desc="capacity replications") as on_done:
        replicated = ReplicatedRates(lambda seeds, rate: pool.map(keep_summary, seeds, rate, on_done),
                                     tuple(replication_seeds(args.ranges, args.ranges_seed)))
        curves = search_capacity_ranges(replicated, start_rps=start_rps, target_attainment=args.attainment,
                                        tolerance=args.tolerance, min_rps=args.rate_min, max_rps=args.rate_max)
    return ranges_record(curves, replicated, replication_settings(args, model, scatter, time.perf_counter() - wall0))


def pools_front_end(args, prefill_model, decode_model):
    """The disaggregated deployment's request path: one per deployment (the client's API server hands
    each request to the prefill pool), so the pools' step models must not disagree on it. A pool whose
    model has none (uncalibrated tables) takes the other's."""
    from stepcal.core.errors import InputError
    from stepcal.experiments.step_models import front_end
    prefill, decode = front_end(prefill_model), front_end(decode_model)
    if not prefill.is_zero and not decode.is_zero and prefill != decode:
        raise InputError(f"--decode-step-model {args.decode_step_model or args.step_model}: its request path "
                         f"({decode.describe()}) differs from the prefill pool's ({prefill.describe()}); a "
                         f"disaggregated deployment has one front end: give one pool tables without front-end terms")
    return decode if prefill.is_zero else prefill


def disagg_config_from_args(args, config, split: tuple[int, int], front_end=None):
    from stepcal.core.errors import InputError
    from stepcal.core.model_files import load_model_spec
    from stepcal.simulator.disaggregation import DisaggConfig, PoolConfig
    if not args.model_spec:
        raise InputError("--disaggregated needs --model-spec: the KV transfer's bytes come from its "
                         "KV bytes per token")
    spec = load_model_spec(args.model_spec)

    def pool(num_replicas: int) -> PoolConfig:
        return PoolConfig(num_replicas, config.scheduler, config.scheduler_config, config.kv_blocks, config.router)
    return DisaggConfig(prefill=pool(split[0]), decode=pool(split[1]), kv_bytes_per_token=spec.kv_bytes_per_token,
                        kv_transfer_alpha_ms=args.kv_transfer_alpha_ms, kv_transfer_gb_per_s=args.kv_transfer_gbps,
                        block_size=config.block_size, step_overhead_ms=config.step_overhead_ms,
                        skip_oversize=config.skip_oversize, slo_ttft_ms=config.slo_ttft_ms,
                        slo_tpot_ms=config.slo_tpot_ms, front_end=front_end or config.front_end)


def _aggregated_replicas(replicas: int | None, split: tuple[int, int] | None) -> int:
    from stepcal.core.errors import InputError
    if split is None:
        return 1 if replicas is None else replicas
    if replicas is not None and replicas != sum(split):
        raise InputError(f"--replicas {replicas} differs from the {sum(split)} devices of --disaggregated "
                         f"{split[0]}:{split[1]}; the comparison holds the number of devices fixed (omit --replicas)")
    return sum(split)


def _describe(label: str, num_replicas: int, split) -> str:
    if label == "aggregated":
        return f"{num_replicas} replica{'s' if num_replicas != 1 else ''}"
    return f"{split[0]} prefill + {split[1]} decode replicas"


def _comparison(records: dict, num_devices: int) -> dict:
    agg, dis = records["aggregated"]["max_rate_rps"], records["disaggregated"]["max_rate_rps"]
    return {"num_devices": num_devices, "aggregated_max_rate_rps": agg, "disaggregated_max_rate_rps": dis,
            "aggregated_per_device_rps": agg / num_devices if agg is not None else None,
            "disaggregated_per_device_rps": dis / num_devices if dis is not None else None,
            "disaggregated_over_aggregated": dis / agg if agg and dis is not None else None}


def _format_comparison(c: dict) -> str:
    ratio = c["disaggregated_over_aggregated"]
    return (f"same {c['num_devices']} devices: disaggregated / aggregated max rate = "
            f"{ratio:.3f}" if ratio is not None else "comparison undefined: a deployment found no feasible rate")
