"""The work of `stepcal capacity`: search the highest rate an aggregated deployment (and, asked, a
prefill/decode-disaggregated one of the same devices) serves within its SLOs, with the capacity's
range where replications are asked for, and write OUT/capacity.json and OUT/capacity.png."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from stepcal.core.errors import InputError, print_warnings
from stepcal.core.io import atomic_output_dir, atomic_write_json
from stepcal.core.metrics import clean_json
from stepcal.core.model_files import load_model_spec
from stepcal.core.workload import load_workload, mean_rate_rps
from stepcal.costmodel.spec_decode import drafted_step_model
from stepcal.experiments.capacity.evaluate import RateEvaluator, aggregated, disaggregated
from stepcal.experiments.capacity.plot import plot_capacity
from stepcal.experiments.capacity.ranges import (
    ReplicatedRates,
    format_ranges,
    ranges_record,
    search_capacity_ranges,
)
from stepcal.experiments.capacity.report import capacity_record, format_record
from stepcal.experiments.capacity.search import check_above, search_capacity
from stepcal.experiments.host_defaults import AUTO
from stepcal.experiments.replications import (
    RangesSettings,
    chosen_scatter,
    keep_summary,
    progress_bar,
    replication_settings,
)
from stepcal.experiments.step_models import describe_step_model, front_end, resolve_step_model, resolve_step_models
from stepcal.simulator.disaggregation import DisaggConfig, PoolConfig
from stepcal.simulator.kv_cache import KvCacheSizing
from stepcal.simulator.ranges import replication_seeds
from stepcal.simulator.schedulers import SchedulerConfig
from stepcal.simulator.simulation import SimConfig


@dataclass(frozen=True)
class CapacityOptions:
    """What `stepcal capacity` is asked for; the defaults are its flags'."""
    trace: str                                  # a trace file or a generator spec
    step_model: str
    out: str
    trace_format: str | None = None
    num_requests: int | None = None             # keep only the first N requests
    duration_s: float | None = None             # keep only requests arriving in the first S seconds
    seed: int = 0                               # of generated workloads
    host_defaults: str = AUTO                   # auto, none or an engine (experiments.host_defaults)
    model_spec: str | None = None
    scheduler: str = "vllm"
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_cache: KvCacheSizing = field(default_factory=KvCacheSizing)
    num_replicas: int | None = None             # None: 1, or P + D with `disaggregated`
    router: str = "round-robin"
    step_overhead_ms: float = 0.0
    skip_oversize: bool = False
    prefix_caching: bool | None = None          # None: the scheduler's default
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    target_attainment: float = 0.9
    tolerance: float = 0.02
    start_rps: float | None = None              # None: the trace's own mean rate
    min_rps: float | None = None
    max_rps: float | None = None
    disaggregated: str | None = None            # "P:D": also P prefill + D decode replicas
    prefill_step_model: str | None = None       # None: step_model
    decode_step_model: str | None = None        # None: step_model
    kv_transfer_alpha_ms: float = 0.5
    kv_transfer_gb_per_s: float = 25.0
    ranges: RangesSettings = field(default_factory=RangesSettings)
    drafter: str | None = None                  # --drafter, with scheduler_config.spec_decode
    quiet: bool = False
    flags: dict = field(default_factory=dict)   # the command line as parsed, recorded as capacity.json's `args`


@dataclass(frozen=True)
class Pools:
    """The disaggregated deployment's P prefill and D decode replicas and their step models."""
    num_prefill: int
    num_decode: int
    prefill_model: object
    decode_model: object


def run_capacity(options: CapacityOptions) -> dict:
    """Search each deployment's capacity, printing each answer unless `quiet`; write OUT/capacity.json
    and OUT/capacity.png; return capacity.json's record. Every input is checked before the first
    simulation."""
    o = options
    if o.slo_ttft_ms is None and o.slo_tpot_ms is None:
        raise InputError("capacity needs an SLO: give --slo-ttft-ms and/or --slo-tpot-ms")
    split = parse_split(o.disaggregated) if o.disaggregated else None
    if o.ranges.num_replications and split is not None:
        raise InputError("--ranges: the replications model aggregated replicas only (the disaggregated "
                         "simulation draws no scatter); run --ranges without --disaggregated")
    num_replicas = aggregated_replicas(o.num_replicas, split)
    (model, *pool_models), added = _step_models(o, split)
    model = _with_drafter(o, model, split)
    trace = load_workload(o.trace, trace_format=o.trace_format, num_requests=o.num_requests,
                          duration_s=o.duration_s, seed=o.seed)
    print_warnings(trace.warnings)
    start_rps = o.start_rps if o.start_rps is not None else mean_rate_rps(trace)
    if start_rps is None:
        raise InputError(f"{o.trace}: all requests arrive at one instant, so the trace has no rate to "
                         f"rescale; give a trace with spread arrivals")
    config = SimConfig(scheduler=o.scheduler, scheduler_config=o.scheduler_config, block_size=o.kv_cache.block_size,
                       kv_blocks=o.kv_cache.num_blocks(o.model_spec), num_replicas=num_replicas, router=o.router,
                       step_overhead_ms=o.step_overhead_ms, skip_oversize=o.skip_oversize, front_end=front_end(model),
                       slo_ttft_ms=o.slo_ttft_ms, slo_tpot_ms=o.slo_tpot_ms, prefix_caching=o.prefix_caching)
    deployments = {"aggregated": RateEvaluator(trace, aggregated(model, config))}
    pools = None
    if split is not None:
        pools = Pools(*split, *pool_models)
        disagg_config = disaggregated_config(o, config, pools, pools_front_end(o, pools))
        deployments["disaggregated"] = RateEvaluator(
            trace, disaggregated(pools.prefill_model, pools.decode_model, disagg_config))

    if added is not None and not o.quiet:
        print(added.describe())
    records, plain_wall_s = _search_each(o, deployments, start_rps, num_replicas, pools)
    if o.ranges.num_replications:
        records["aggregated"]["ranges"] = capacity_ranges(o, trace, model, config, start_rps)
        if not o.quiet:
            print(format_ranges(records["aggregated"]["ranges"], len(deployments["aggregated"].cache), plain_wall_s))
    record = _record(o, records, trace, model, num_replicas, pools, added)
    if pools is not None and not o.quiet:
        print(format_comparison(record["comparison"]))
    with atomic_output_dir(o.out) as staging:
        atomic_write_json(staging / "capacity.json", clean_json(record))
        plot_capacity(records, o.slo_ttft_ms, o.slo_tpot_ms, staging / "capacity.png")
    return record



def _with_drafter(o: CapacityOptions, model, split: tuple[int, int] | None):
    """The aggregated deployment's model with the drafter's time when spec decode is on."""
    spec = o.scheduler_config.spec_decode
    if spec is None:
        return model
    if split is not None or o.ranges.num_replications:
        raise InputError("--spec-decode: capacity searches aggregated replicas without --ranges with it; "
                         "leave out --disaggregated and --ranges")
    return drafted_step_model(model, spec, o.drafter, resolve_step_model)


def _step_models(o: CapacityOptions, split: tuple[int, int] | None):
    """The aggregated deployment's step model, then with --disaggregated the prefill and decode pools',
    and the engine terms --host-defaults added (AddedHostTerms, or None). The terms go on every pool's
    model (each pool pays its own per-step host time) and their request path on the deployment (paid
    once, before the prefill pool); auto decides for all the models at once, so that the pools never
    get two request paths."""
    specs = [o.step_model]
    if split is not None:
        specs += [o.prefill_step_model or o.step_model, o.decode_step_model or o.step_model]
    return resolve_step_models(specs, o.host_defaults, o.scheduler)


def _search_each(o: CapacityOptions, deployments: dict, start_rps: float, num_replicas: int,
                 pools: Pools | None) -> tuple[dict, float]:
    """Each deployment's capacity record, printed as it is found; and the last search's wall time."""
    records, wall_s = {}, 0.0
    for label, evaluate in deployments.items():
        wall0 = time.perf_counter()
        result = search_capacity(evaluate, start_rps=start_rps, target_attainment=o.target_attainment,
                                 tolerance=o.tolerance, min_rps=o.min_rps, max_rps=o.max_rps)
        records[label] = capacity_record(result, check_above(evaluate, result))
        wall_s = time.perf_counter() - wall0
        if not o.quiet:
            print(format_record(f"{label} ({describe_deployment(label, num_replicas, pools)})", records[label]))
    return records, wall_s


def _record(o: CapacityOptions, records: dict, trace, model, num_replicas: int, pools: Pools | None,
            added) -> dict:
    """capacity.json: the aggregated deployment's record and what was searched; with `pools`, the
    disaggregated deployment's record and the comparison of the two."""
    record = {**records["aggregated"], "deployment": describe_deployment("aggregated", num_replicas, pools),
              "num_replicas": num_replicas, "scheduler": o.scheduler, "slo_ttft_ms": o.slo_ttft_ms,
              "slo_tpot_ms": o.slo_tpot_ms, "trace": str(o.trace), "trace_rate_rps": mean_rate_rps(trace),
              "num_requests": len(trace), "step_model": describe_step_model(o.step_model, model),
              "host_defaults": None if added is None else added.to_dict(), "args": o.flags}
    if pools is not None:
        record["disaggregated"] = {
            **records["disaggregated"], "deployment": describe_deployment("disaggregated", num_replicas, pools),
            "num_prefill_replicas": pools.num_prefill, "num_decode_replicas": pools.num_decode,
            "prefill_step_model": describe_step_model(o.prefill_step_model or o.step_model, pools.prefill_model),
            "decode_step_model": describe_step_model(o.decode_step_model or o.step_model, pools.decode_model)}
        record["comparison"] = comparison(records, num_replicas)
    return record


def capacity_ranges(o: CapacityOptions, trace, model, config, start_rps: float) -> dict:
    """The `ranges` block of capacity.json (capacity.ranges): N replications per rate probed, run on
    o.ranges' workers, which share the trace and the step model."""
    scatter, _ = chosen_scatter(o.ranges.scatter, o.step_model)
    wall0 = time.perf_counter()
    # the number of rates probed is known only at the end: the bar counts simulations
    with o.ranges.pool(trace, model, replace(config, scatter=scatter)) as pool, \
            progress_bar(None, o.quiet, desc="capacity replications") as on_done:
        replicated = ReplicatedRates(lambda seeds, rate: pool.map(keep_summary, seeds, rate, on_done),
                                     tuple(replication_seeds(o.ranges.num_replications, o.ranges.seed)))
        curves = search_capacity_ranges(replicated, start_rps=start_rps, target_attainment=o.target_attainment,
                                        tolerance=o.tolerance, min_rps=o.min_rps, max_rps=o.max_rps)
    return ranges_record(curves, replicated, replication_settings(o.ranges, model, scatter,
                                                                  time.perf_counter() - wall0))


def parse_split(text: str) -> tuple[int, int]:
    """'P:D' → (P, D), both positive."""
    head, sep, tail = text.partition(":")
    try:
        p, d = int(head), int(tail)
    except ValueError:
        p = d = 0
    if not sep or p < 1 or d < 1:
        raise InputError(f"--disaggregated: expected P:D with positive integers (e.g. 1:1 or 2:3), got {text!r}")
    return p, d


def aggregated_replicas(num_replicas: int | None, split: tuple[int, int] | None) -> int:
    """The aggregated deployment's replicas: as many devices as the disaggregated one has, when there is one."""
    if split is None:
        return 1 if num_replicas is None else num_replicas
    if num_replicas is not None and num_replicas != sum(split):
        raise InputError(f"--replicas {num_replicas} differs from the {sum(split)} devices of --disaggregated "
                         f"{split[0]}:{split[1]}; the comparison holds the number of devices fixed (omit --replicas)")
    return sum(split)


def pools_front_end(o: CapacityOptions, pools: Pools):
    """The disaggregated deployment's request path: one per deployment (the client's API server hands
    each request to the prefill pool), so the pools' step models must not disagree on it. A pool whose
    model has none (uncalibrated tables) takes the other's."""
    prefill, decode = front_end(pools.prefill_model), front_end(pools.decode_model)
    if not prefill.is_zero and not decode.is_zero and prefill != decode:
        raise InputError(f"--decode-step-model {o.decode_step_model or o.step_model}: its request path "
                         f"({decode.describe()}) differs from the prefill pool's ({prefill.describe()}); a "
                         f"disaggregated deployment has one front end: give one pool tables without front-end terms")
    return decode if prefill.is_zero else prefill


def disaggregated_config(o: CapacityOptions, config: SimConfig, pools: Pools, front_end=None):
    """The disaggregated deployment's settings: the aggregated one's scheduler, KV cache and SLOs per
    pool, and the KV transfer between the pools (its bytes per token from the model spec)."""
    if not o.model_spec:
        raise InputError("--disaggregated needs --model-spec: the KV transfer's bytes come from its "
                         "KV bytes per token")
    spec = load_model_spec(o.model_spec)

    def pool(num_replicas: int) -> PoolConfig:
        return PoolConfig(num_replicas, config.scheduler, config.scheduler_config, config.kv_blocks, config.router)
    return DisaggConfig(prefill=pool(pools.num_prefill), decode=pool(pools.num_decode),
                        kv_bytes_per_token=spec.kv_bytes_per_token, kv_transfer_alpha_ms=o.kv_transfer_alpha_ms,
                        kv_transfer_gb_per_s=o.kv_transfer_gb_per_s, block_size=config.block_size,
                        step_overhead_ms=config.step_overhead_ms, skip_oversize=config.skip_oversize,
                        slo_ttft_ms=config.slo_ttft_ms, slo_tpot_ms=config.slo_tpot_ms,
                        front_end=front_end or config.front_end)


def describe_deployment(label: str, num_replicas: int, pools: Pools | None) -> str:
    if label == "aggregated":
        return f"{num_replicas} replica{'s' if num_replicas != 1 else ''}"
    return f"{pools.num_prefill} prefill + {pools.num_decode} decode replicas"


def comparison(records: dict, num_devices: int) -> dict:
    """The two deployments' capacities on the same number of devices, and their ratio."""
    agg, dis = records["aggregated"]["max_rate_rps"], records["disaggregated"]["max_rate_rps"]
    return {"num_devices": num_devices, "aggregated_max_rate_rps": agg, "disaggregated_max_rate_rps": dis,
            "aggregated_per_device_rps": agg / num_devices if agg is not None else None,
            "disaggregated_per_device_rps": dis / num_devices if dis is not None else None,
            "disaggregated_over_aggregated": dis / agg if agg and dis is not None else None}


def format_comparison(c: dict) -> str:
    ratio = c["disaggregated_over_aggregated"]
    return (f"same {c['num_devices']} devices: disaggregated / aggregated max rate = "
            f"{ratio:.3f}" if ratio is not None else "comparison undefined: a deployment found no feasible rate")
