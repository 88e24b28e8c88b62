"""The sweep config (TOML): a grid of schedulers × their settings × rates × replicas × step models.

    trace = "AzureLLMInferenceTrace_conv.csv"  # or a generator spec
    duration_s = 600                 # optional cut of the trace (also num_requests, trace_format, seed)
    rates_rps = [2.0, 4.0, 8.0]      # the trace's arrivals rescaled; omit for the trace's own rate
    replicas = [1, 2]                # default [1]
    step_models = ["linear:8,0.03,0.0002"]
    host_defaults = "vllm"           # optional: a serving engine's published host and front-end terms added to
                                     # every step model (experiments/data/serving_defaults.json); a list sweeps
                                     # them, "none" being the step model as it is: ["none", "vllm", "vllm-async"]
    latency = "ttft_ms"              # the P99 on the Pareto plot: ttft_ms, tpot_ms, itl_ms or e2e_ms
    # block_size, kv_blocks, router, step_overhead_ms: simulation settings shared by every point
    ranges = 20                      # optional: N replications per point, each figure with a 90% interval
    scatter_cv = 0.05                # their step-to-step scatter (default 0) and its autocorrelation
    scatter_rho = 0.5                # (default 0); scatter_run_cv: the device's speed over a run (default 0);
                                     # ranges_seed: replication i uses ranges_seed + i (default 0)

    [[schedulers]]
    name = "vllm"
    max_num_seqs = [128, 256]        # each setting a value or a list; lists are crossed
    max_batched_tokens = [2048, 8192]

    [[schedulers]]
    name = "sarathi"
    chunk_size = [256, 512]

    [[slos]]                         # each SLO gets attainment / goodput columns and a best point
    name = "chat"
    ttft_ms = 500
    tpot_ms = 50
    attainment = 0.9

Relative file paths (the trace, table directories) are relative to the config file.

`host_defaults` is an axis of the grid like step_models (crossed with it): each point's step model
gets that engine's terms (experiments.host_defaults), and its row a `host_defaults` column (None for
"none" and for sweeps without the key). A step model with calibrated host terms refuses an engine, as
`--host-defaults` does. Points of sweeps without the key keep the keys they had, and their step models
as they are: a sweep has no `auto` (the commands' default), so that a stored sweep resumes with the
results it had; name the engine to add its terms.

With `ranges = N` (N > 0) every point also runs N seeded replications (simulator.ranges: each draws the
step model's error per T_step term and the step scatter) and its row gains, for every figure column
(throughput, the latency statistics, each SLO's attainment and goodput, ...), `<column>.median`,
`<column>.low` and `<column>.high`: the median and the 5th and 95th percentiles over the replications.
The plain columns stay the plain run's. The ranges settings are part of every point's key: a point
stored without ranges and run again with them (or with other ranges settings) is a new point, simulated
again; the stored one stays under its own key for a rerun without ranges.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.readers import read_toml
from stepcal.experiments.host_defaults import ENGINE_NAMES, has_calibrated_terms
from stepcal.simulator.schedulers import SCHEDULERS

TOP_KEYS = {"trace", "trace_format", "num_requests", "duration_s", "seed", "rates_rps", "replicas", "step_models",
            "host_defaults", "latency", "block_size", "kv_blocks", "router", "step_overhead_ms", "schedulers", "slos",
            "ranges", "scatter_cv", "scatter_rho", "scatter_run_cv", "ranges_seed"}
RANGES_KEYS = ("scatter_cv", "scatter_rho", "scatter_run_cv", "ranges_seed")   # meaningful with ranges > 0 only
SCHEDULER_SETTINGS = ("max_num_seqs", "max_batched_tokens", "chunk_size")
LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
SLO_KEYS = {"name", "ttft_ms", "tpot_ms", "attainment"}
NO_HOST_DEFAULTS = "none"   # a host_defaults value: the step model without an engine's terms


@dataclass(frozen=True)
class Slo:
    name: str
    ttft_ms: float | None
    tpot_ms: float | None
    attainment: float


@dataclass(frozen=True)
class SweepRanges:
    """`ranges = N` of a sweep config: N replications per point (replication i seeded seed + i)."""
    num_replications: int
    scatter_cv: float = 0.0
    scatter_rho: float = 0.0
    seed: int = 0
    scatter_run_cv: float = 0.0     # the device's speed over a run (simulator.scatter.Scatter.run_cv)


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of the grid. `None` settings take the scheduler's defaults; `rate_rps` None is the trace's own."""
    index: int
    scheduler: str
    max_num_seqs: int | None
    max_batched_tokens: int | None
    chunk_size: int | None
    rate_rps: float | None
    num_replicas: int
    step_model: str
    host_defaults: str | None = None     # an engine of experiments/data/serving_defaults.json, or none


@dataclass(frozen=True)
class SweepConfig:
    path: Path
    trace: str
    trace_format: str | None
    num_requests: int | None
    duration_s: float | None
    seed: int
    block_size: int
    kv_blocks: int | None
    router: str
    step_overhead_ms: float
    latency: str
    slos: tuple[Slo, ...]
    points: tuple[SweepPoint, ...]
    ranges: SweepRanges | None = None

    def shared(self) -> dict:
        """Everything but the grid axes that a point's result depends on (part of every point's key).
        `ranges` only when set, so that the keys of sweeps without ranges stay what they were."""
        shared = {"trace": self.trace, "trace_format": self.trace_format, "num_requests": self.num_requests,
                  "duration_s": self.duration_s, "seed": self.seed, "block_size": self.block_size,
                  "kv_blocks": self.kv_blocks, "router": self.router, "step_overhead_ms": self.step_overhead_ms,
                  "slos": [vars(s) for s in self.slos]}
        if self.ranges is not None:
            shared["ranges"] = vars(self.ranges)
        return shared


def load_sweep_config(path: str | Path) -> SweepConfig:
    path = Path(path)
    data = read_toml(path, "a sweep config (TOML)")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise InputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(TOP_KEYS))}")
    for key in ("trace", "step_models", "schedulers"):
        if key not in data:
            raise InputError(f"{path}: missing key {key!r}")
    base = path.resolve().parent
    step_models = [_relative(base, s) for s in _list(path, "step_models", data["step_models"], str)]
    rates = _list(path, "rates_rps", data.get("rates_rps"), (int, float)) if "rates_rps" in data else [None]
    if any(r is not None and r <= 0 for r in rates):
        raise InputError(f"{path}: rates_rps must be positive numbers, got {rates}")
    replicas = _list(path, "replicas", data.get("replicas", [1]), int)
    if any(r < 1 for r in replicas):
        raise InputError(f"{path}: replicas must be positive integers, got {replicas}")
    latency = data.get("latency", "ttft_ms")
    if latency not in LATENCY_METRICS:
        raise InputError(f"{path}: latency must be one of {', '.join(LATENCY_METRICS)}, got {latency!r}")
    settings = [s for i, entry in enumerate(_tables(path, "schedulers", data["schedulers"]))
                for s in _scheduler_settings(path, i, entry)]
    engines = _host_defaults(path, data, step_models)
    points = tuple(SweepPoint(i, sched, *values, float(rate) if rate is not None else None, n, model, engine)
                   for i, ((sched, *values), model, engine, n, rate) in
                   enumerate(itertools.product(settings, step_models, engines, replicas, rates)))
    return SweepConfig(
        path=path, trace=_relative(base, _scalar(path, data, "trace", str)),
        trace_format=data.get("trace_format"), num_requests=_scalar(path, data, "num_requests", int, None),
        duration_s=_scalar(path, data, "duration_s", (int, float), None), seed=_scalar(path, data, "seed", int, 0),
        block_size=_scalar(path, data, "block_size", int, 16), kv_blocks=_scalar(path, data, "kv_blocks", int, None),
        router=_scalar(path, data, "router", str, "round-robin"),
        step_overhead_ms=float(_scalar(path, data, "step_overhead_ms", (int, float), 0.0)),
        latency=latency, slos=tuple(_slo(path, i, t) for i, t in enumerate(_tables(path, "slos", data.get("slos", [])))),
        points=points, ranges=_ranges(path, data))


def _host_defaults(path: Path, data: dict, step_models: list[str]) -> list[str | None]:
    """The engines of `host_defaults` (a name or a list), None for "none"; [None] without the key.
    Calibrated terms win over an engine's defaults, as with --host-defaults: such tables are refused."""
    if "host_defaults" not in data:
        return [None]
    names = _list(path, "host_defaults", data["host_defaults"], str)
    known = (NO_HOST_DEFAULTS, *ENGINE_NAMES)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise InputError(f"{path}: host_defaults must be one or a list of {', '.join(known)}, got {unknown[0]!r}")
    if len(set(names)) < len(names):
        raise InputError(f"{path}: host_defaults lists an engine twice: {names}")
    engine = next((name for name in names if name != NO_HOST_DEFAULTS), None)
    calibrated = next((spec for spec in step_models if has_calibrated_terms(spec)), None)
    if engine is not None and calibrated is not None:
        raise InputError(f"{path}: host_defaults {engine!r}: step model {calibrated} already has calibrated host "
                         f"terms; drop host_defaults, or list the uncalibrated tables")
    return [None if name == NO_HOST_DEFAULTS else name for name in names]


def _ranges(path: Path, data: dict) -> SweepRanges | None:
    """SweepRanges from `ranges = N` and its settings; None without it (or with 0)."""
    num = _scalar(path, data, "ranges", int, 0)
    if not 0 <= num <= 10_000:
        raise InputError(f"{path}: ranges must be a number of replications in [0, 10000], got {num}")
    if num == 0:
        given = [key for key in RANGES_KEYS if key in data]
        if given:
            raise InputError(f"{path}: {', '.join(given)} need(s) ranges = N (N > 0 replications per point)")
        return None
    cv = float(_scalar(path, data, "scatter_cv", (int, float), 0.0))
    rho = float(_scalar(path, data, "scatter_rho", (int, float), 0.0))
    seed = _scalar(path, data, "ranges_seed", int, 0)
    run_cv = float(_scalar(path, data, "scatter_run_cv", (int, float), 0.0))
    if not 0 <= run_cv <= 1:
        raise InputError(f"{path}: scatter_run_cv must be in [0, 1] (a coefficient of variation), got {run_cv}")
    if not 0 <= cv <= 1:
        raise InputError(f"{path}: scatter_cv must be in [0, 1] (a coefficient of variation), got {cv}")
    if not -1 < rho < 1:
        raise InputError(f"{path}: scatter_rho must be in (-1, 1) (a lag-one autocorrelation), got {rho}")
    if seed < 0:
        raise InputError(f"{path}: ranges_seed must be a non-negative integer, got {seed}")
    return SweepRanges(num, cv, rho, seed, run_cv)


def _scheduler_settings(path: Path, i: int, entry: dict) -> list[tuple]:
    where = f"{path}: schedulers[{i}]"
    name = entry.get("name")
    if name not in SCHEDULERS:
        raise InputError(f"{where}: name must be one of {', '.join(SCHEDULERS)}, got {name!r}")
    unknown = set(entry) - {"name", *SCHEDULER_SETTINGS}
    if unknown:
        raise InputError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(SCHEDULER_SETTINGS)}")
    axes = []
    for key in SCHEDULER_SETTINGS:
        values = _list(path, f"schedulers[{i}].{key}", entry.get(key), int) if key in entry else [None]
        if any(v is not None and v <= 0 for v in values):
            raise InputError(f"{where}: {key} must be positive integers, got {values}")
        axes.append(values)
    return [(name, *combo) for combo in itertools.product(*axes)]


def _slo(path: Path, i: int, entry: dict) -> Slo:
    where = f"{path}: slos[{i}]"
    unknown = set(entry) - SLO_KEYS
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(SLO_KEYS))}")
    name = entry.get("name", f"slo{i}")
    if not isinstance(name, str) or not name.isidentifier():
        raise InputError(f"{where}: name must be a plain identifier (it names columns), got {name!r}")
    ttft, tpot = entry.get("ttft_ms"), entry.get("tpot_ms")
    if ttft is None and tpot is None:
        raise InputError(f"{where}: give ttft_ms and/or tpot_ms")
    attainment = entry.get("attainment", 0.9)
    if not isinstance(attainment, (int, float)) or not 0 < attainment <= 1:
        raise InputError(f"{where}: attainment must be in (0, 1], got {attainment!r}")
    for key, value in (("ttft_ms", ttft), ("tpot_ms", tpot)):
        if value is not None and (not isinstance(value, (int, float)) or value <= 0):
            raise InputError(f"{where}: {key} must be a positive number, got {value!r}")
    return Slo(name, None if ttft is None else float(ttft), None if tpot is None else float(tpot), float(attainment))


def _list(path: Path, key: str, value, kind) -> list:
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(v, bool) or not isinstance(v, kind) for v in values):
        raise InputError(f"{path}: {key} must be a value or a non-empty list of {_kind_name(kind)}, got {value!r}")
    return values


def _scalar(path: Path, data: dict, key: str, kind, default=...):
    if key not in data:
        if default is ...:
            raise InputError(f"{path}: missing key {key!r}")
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise InputError(f"{path}: {key} must be {_kind_name(kind)}, got {value!r}")
    return value


def _tables(path: Path, key: str, value) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InputError(f"{path}: {key} must be a list of tables ([[{key}]])")
    if key == "schedulers" and not value:
        raise InputError(f"{path}: give at least one [[schedulers]] table")
    return value


def _kind_name(kind) -> str:
    return {str: "strings", int: "integers"}.get(kind, "numbers")


def _relative(base: Path, text: str) -> str:
    """A path relative to the config's directory, when it names an existing file or directory there."""
    candidate = base / text
    return str(candidate) if not Path(text).is_absolute() and candidate.exists() else text
