"""`stepcal capacity`: the highest request rate a deployment serves within its SLOs."""
from __future__ import annotations

from stepcal.core import bounds
from stepcal.experiments.commands import argtypes
from stepcal.experiments.commands.flags import (
    STEP_MODEL_HELP,
    add_command,
    add_ranges_flags,
    add_scheduler_flags,
    kv_cache_from_args,
    prefix_caching_from_args,
    ranges_settings_from_args,
    scheduler_config_from_args,
)
from stepcal.experiments.commands.spec_flags import add_spec_decode_flags
from stepcal.experiments.host_defaults import add_host_defaults_flag
from stepcal.experiments.output_paths import check_output

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
  stepcal capacity --trace AzureLLMInferenceTrace_conv.csv \\
      --duration 600 --step-model linear:8,0.03,0.0002 --scheduler sarathi \\
      --slo-ttft-ms 500 --slo-tpot-ms 50 --out runs/capacity
  stepcal capacity --trace poisson:rate=5,n=2000,prompt=lognormal:512:1.0,output=uniform:16:256 \\
      --step-model linear:8,0.03,0.0002 --slo-ttft-ms 500 --slo-tpot-ms 50 \\
      --disaggregated 1:1 --model-spec llama-3-8b --kv-transfer-gbps 25 --out runs/pd
  stepcal capacity --trace poisson:rate=5,n=500,prompt=uniform:32:512,output=uniform:8:128 \\
      --step-model tables/tiny --slo-ttft-ms 300 --slo-tpot-ms 40 \\
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
    add_spec_decode_flags(p)
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


def options_from_args(args):
    """The library's CapacityOptions from the parsed flags."""
    from stepcal.experiments.capacity.run import CapacityOptions  # lazy: loads concurrent, multiprocessing, numpy, tqdm
    return CapacityOptions(
        trace=args.trace, step_model=args.step_model, out=args.out, trace_format=args.trace_format,
        num_requests=args.num_requests, duration_s=args.duration, seed=args.seed, host_defaults=args.host_defaults,
        model_spec=args.model_spec, scheduler=args.scheduler, scheduler_config=scheduler_config_from_args(args),
        kv_cache=kv_cache_from_args(args), num_replicas=args.replicas, router=args.router,
        step_overhead_ms=args.step_overhead_ms, skip_oversize=args.skip_oversize,
        prefix_caching=prefix_caching_from_args(args), slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
        target_attainment=args.attainment, tolerance=args.tolerance, start_rps=args.rate_start,
        min_rps=args.rate_min, max_rps=args.rate_max, disaggregated=args.disaggregated,
        prefill_step_model=args.prefill_step_model, decode_step_model=args.decode_step_model,
        kv_transfer_alpha_ms=args.kv_transfer_alpha_ms, kv_transfer_gb_per_s=args.kv_transfer_gbps,
        ranges=ranges_settings_from_args(args), drafter=args.drafter, quiet=args.quiet,
        flags={k: v for k, v in vars(args).items() if k != "func"})


def run(args) -> int:
    check_output(args.out)
    from stepcal.experiments.capacity.run import run_capacity  # lazy: loads concurrent, multiprocessing, numpy, tqdm
    run_capacity(options_from_args(args))
    if not args.quiet:
        print(f"wrote {args.out}/capacity.json, capacity.png")
    return 0
