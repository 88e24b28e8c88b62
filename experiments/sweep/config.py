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

Each key is checked as the flag it mirrors is (TOP_KEYS, SCHEDULER_KEYS, SLO_KEYS map each key to its
type and to the flag's own check in experiments.value_checks), so the two cannot drift apart; an error
is one line naming the file and the key. The grid is counted from its axes' lengths and refused beyond
MAX_SWEEP_POINTS before it is built.

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

import difflib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stepcal.core.errors import InputError, shown
from stepcal.core.readers import read_toml
from stepcal.core.workload import TRACE_FORMATS
from stepcal.experiments import value_checks as checks
from stepcal.experiments.host_defaults import ENGINE_NAMES, has_calibrated_terms
from stepcal.experiments.value_checks import ROUTER_NAMES
from stepcal.simulator.schedulers import SCHEDULERS
from stepcal.simulator.step_model import parse_builtin_step_model

RANGES_KEYS = ("scatter_cv", "scatter_rho", "scatter_run_cv", "ranges_seed")   # meaningful with ranges > 0 only
SCHEDULER_SETTINGS = ("max_num_seqs", "max_batched_tokens", "chunk_size")
LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
NO_HOST_DEFAULTS = "none"   # a host_defaults value: the step model without an engine's terms
# Every point is a whole simulation, stored as its own file under OUT/points: 100,000 of them at even a
# second each is more than a day of one core. A larger grid is a list written by mistake (three axes of
# a few hundred values each), and building it would take minutes and gigabytes before the first point.
MAX_SWEEP_POINTS = 100_000
NUMBER = (int, float)


@dataclass(frozen=True)
class KeyCheck:
    """How one key of the config is checked: its TOML type first, then `check(value, what)`, the very check
    of the flag the key mirrors (experiments.value_checks), whose InputError names `what` (the file and the key).
    `axis`: a value or a non-empty list of them (a grid axis, or a list of engines)."""
    kind: type | tuple[type, ...]
    check: Callable
    axis: bool = False


def _one_of(allowed: tuple[str, ...]) -> Callable:
    """The check of a flag with `choices`: the value is one of `allowed`."""
    def check(value: str, what: str) -> str:
        if value not in allowed:
            raise InputError(f"{what} must be one of {', '.join(allowed)}, got {shown(value)}")
        return value
    return check


def _text(value: str, what: str) -> str:
    """A path or a spec, read when the sweep runs (as --trace and --step-model are)."""
    if not value.strip():
        raise InputError(f"{what} must not be empty")
    return value


def _identifier(value: str, what: str) -> str:
    if not value.isidentifier():
        raise InputError(f"{what} must be a plain identifier (it names columns), got {shown(value)}")
    return value


# The one map of the config's keys to their checks; the comment names the flag each mirrors.
TOP_KEYS = {
    "trace": KeyCheck(str, _text),                                          # --trace
    "trace_format": KeyCheck(str, _one_of(TRACE_FORMATS)),                  # --trace-format
    "num_requests": KeyCheck(NUMBER, checks.num_requests),          # --num-requests
    "duration_s": KeyCheck(NUMBER, checks.seconds),                 # --duration
    "seed": KeyCheck(NUMBER, checks.seed),                          # --seed
    "rates_rps": KeyCheck(NUMBER, checks.rate, axis=True),          # --rate
    "replicas": KeyCheck(NUMBER, checks.replicas, axis=True),       # --replicas
    "step_models": KeyCheck(str, _text, axis=True),                         # --step-model
    "host_defaults": KeyCheck(str, _one_of((NO_HOST_DEFAULTS, *ENGINE_NAMES)), axis=True),   # --host-defaults
    "latency": KeyCheck(str, _one_of(LATENCY_METRICS)),
    "block_size": KeyCheck(NUMBER, checks.block_size),              # --block-size
    "kv_blocks": KeyCheck(NUMBER, checks.kv_blocks),                # --kv-blocks
    "router": KeyCheck(str, _one_of(ROUTER_NAMES)),                         # --router
    "step_overhead_ms": KeyCheck(NUMBER, checks.time_ms_or_zero),   # --step-overhead-ms
    "ranges": KeyCheck(NUMBER, checks.num_replications),            # --ranges
    "scatter_cv": KeyCheck(NUMBER, checks.scatter_cv),              # --scatter-cv
    "scatter_rho": KeyCheck(NUMBER, checks.correlation),            # --scatter-rho
    "scatter_run_cv": KeyCheck(NUMBER, checks.scatter_cv),          # --scatter-run-cv
    "ranges_seed": KeyCheck(NUMBER, checks.seed),                   # --ranges-seed
}
SCHEDULER_KEYS = {                                                          # [[schedulers]]
    "name": KeyCheck(str, _one_of(tuple(SCHEDULERS))),                      # --scheduler
    **{key: KeyCheck(NUMBER, checks.scheduler_size, axis=True)      # --max-num-seqs, ...
       for key in SCHEDULER_SETTINGS},
}
SLO_KEYS = {                                                                # [[slos]]
    "name": KeyCheck(str, _identifier),
    "ttft_ms": KeyCheck(NUMBER, checks.time_ms),                    # --slo-ttft-ms
    "tpot_ms": KeyCheck(NUMBER, checks.time_ms),                    # --slo-tpot-ms
    "attainment": KeyCheck(NUMBER, checks.fraction),                # capacity's --attainment
}
TABLE_KEYS = {"schedulers": SCHEDULER_KEYS, "slos": SLO_KEYS}               # lists of tables ([[schedulers]])


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
    """The config at `path`, every key checked as its flag is (TOP_KEYS), the grid's size bounded
    (MAX_SWEEP_POINTS) before it is built; an InputError naming the file and the key otherwise."""
    path = Path(path)
    data = read_toml(path, "a sweep config (TOML)")
    values = checked_table(path, data, TOP_KEYS, "", extra=tuple(TABLE_KEYS))
    for key in ("trace", "step_models", "schedulers"):
        if key not in data:
            raise InputError(f"{path}: missing key {key!r}")
    base = path.resolve().parent
    schedulers = [_scheduler(path, i, entry) for i, entry in enumerate(_tables(path, "schedulers", data["schedulers"]))]
    rates = values.get("rates_rps", [None])
    replicas = values.get("replicas", [1])
    step_models = [_step_model(path, i, _relative(base, spec)) for i, spec in enumerate(values["step_models"])]
    engines = _host_defaults(path, values.get("host_defaults"), step_models)
    _check_grid_size(path, schedulers, len(step_models) * len(engines) * len(replicas) * len(rates))
    settings = [(name, *combo) for name, axes in schedulers for combo in itertools.product(*axes)]
    points = tuple(SweepPoint(i, sched, *settings_, rate, n, model, engine)
                   for i, ((sched, *settings_), model, engine, n, rate) in
                   enumerate(itertools.product(settings, step_models, engines, replicas, rates)))
    return SweepConfig(
        path=path, trace=_relative(base, values["trace"]), trace_format=values.get("trace_format"),
        num_requests=values.get("num_requests"),
        duration_s=data.get("duration_s"),   # as written (600, not 600.0): part of every point's key
        seed=values.get("seed", 0), block_size=values.get("block_size", 16), kv_blocks=values.get("kv_blocks"),
        router=values.get("router", "round-robin"), step_overhead_ms=values.get("step_overhead_ms", 0.0),
        latency=values.get("latency", "ttft_ms"), slos=_slos(path, data.get("slos", [])),
        points=points, ranges=_ranges(path, values))


def checked_table(path: Path, table: dict, checks: dict[str, KeyCheck], scope: str,
                  extra: tuple[str, ...] = ()) -> dict:
    """Each key of `table` checked by its KeyCheck (axes as lists), `extra` keys (tables, checked by
    their own readers) left out; an unknown key is refused with a close match where there is one.
    `scope` is the key's place for messages: "" at the top, "schedulers[0]." in a table."""
    known = (*checks, *extra)
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {scope}{close[0]}?)" if close else f"; known: {', '.join(sorted(known))}"
            raise InputError(f"{path}: unknown key {scope}{key}{hint}")
    return {key: _checked_value(checks[key], value, f"{path}: {scope}{key}")
            for key, value in table.items() if key in checks}


def _checked_value(check: KeyCheck, value, what: str):
    if not check.axis:
        return _checked_one(check, value, what, "")
    if not isinstance(value, list):
        return [_checked_one(check, value, what, " or a non-empty list of them")]
    if not value:
        raise InputError(f"{what} must be {_kind_name(check.kind)} or a non-empty list of them, got []")
    return [_checked_one(check, v, f"{what}[{i}]", "") for i, v in enumerate(value)]


def _checked_one(check: KeyCheck, value, what: str, or_list: str):
    """The TOML type first (no string for a number, no bool for anything), then the flag's check."""
    if isinstance(value, bool) or not isinstance(value, check.kind):
        raise InputError(f"{what} must be {_kind_name(check.kind)}{or_list}, got {shown(value)}")
    return check.check(value, what)


def _check_grid_size(path: Path, schedulers: list[tuple[str, list[list]]], per_setting: int) -> None:
    """The number of points, counted from the axes' lengths, at most MAX_SWEEP_POINTS."""
    num_settings = sum(math.prod(len(axis) for axis in axes) for _, axes in schedulers)
    num_points = num_settings * per_setting
    if num_points > MAX_SWEEP_POINTS:
        raise InputError(f"{path}: the grid has {num_points:,} points (the schedulers' settings x step_models x "
                         f"host_defaults x replicas x rates_rps), more than the {MAX_SWEEP_POINTS:,} a sweep may "
                         f"have; split it into several sweeps")


def _scheduler(path: Path, i: int, entry: dict) -> tuple[str, list[list]]:
    """A [[schedulers]] table: its name and the axes of its settings ([None]: the scheduler's default)."""
    values = checked_table(path, entry, SCHEDULER_KEYS, f"schedulers[{i}].")
    if "name" not in values:
        raise InputError(f"{path}: schedulers[{i}]: missing key 'name' (one of {', '.join(SCHEDULERS)})")
    return values["name"], [values.get(key, [None]) for key in SCHEDULER_SETTINGS]


def _step_model(path: Path, i: int, spec: str) -> str:
    """const:MS or linear:A,B,C, checked as --step-model is; else a directory, whose tables are read
    when the sweep runs (their errors name their files)."""
    label = f"{path}: step_models[{i}]"
    if parse_builtin_step_model(spec, label=label) is None and not Path(spec).is_dir():
        raise InputError(f"{label} {spec!r}: expected const:MS, linear:A,B,C or a T_step table directory")
    return spec


def _host_defaults(path: Path, names: list[str] | None, step_models: list[str]) -> list[str | None]:
    """The engines of `host_defaults` (a name or a list), None for "none"; [None] without the key.
    Calibrated terms win over an engine's defaults, as with --host-defaults: such tables are refused."""
    if names is None:
        return [None]
    if len(set(names)) < len(names):
        raise InputError(f"{path}: host_defaults lists an engine twice: {names}")
    engine = next((name for name in names if name != NO_HOST_DEFAULTS), None)
    calibrated = next((spec for spec in step_models if has_calibrated_terms(spec)), None)
    if engine is not None and calibrated is not None:
        raise InputError(f"{path}: host_defaults {engine!r}: step model {calibrated} already has calibrated host "
                         f"terms; drop host_defaults, or list the uncalibrated tables")
    return [None if name == NO_HOST_DEFAULTS else name for name in names]


def _ranges(path: Path, values: dict) -> SweepRanges | None:
    """SweepRanges from `ranges = N` and its settings (checked as their flags); None without it (or with 0)."""
    num = values.get("ranges", 0)
    if num == 0:
        given = [key for key in RANGES_KEYS if key in values]
        if given:
            raise InputError(f"{path}: {', '.join(given)} need(s) ranges = N (N > 0 replications per point)")
        return None
    return SweepRanges(num, values.get("scatter_cv", 0.0), values.get("scatter_rho", 0.0),
                       values.get("ranges_seed", 0), values.get("scatter_run_cv", 0.0))


def _slos(path: Path, entries) -> tuple[Slo, ...]:
    """The [[slos]] tables; each needs ttft_ms and/or tpot_ms, and a name of its own (it names columns)."""
    slos = []
    for i, entry in enumerate(_tables(path, "slos", entries)):
        values = checked_table(path, entry, SLO_KEYS, f"slos[{i}].")
        name = values.get("name", f"slo{i}")
        if "ttft_ms" not in values and "tpot_ms" not in values:
            raise InputError(f"{path}: slos[{i}]: give ttft_ms and/or tpot_ms")
        twin = next((j for j, slo in enumerate(slos) if slo.name == name), None)
        if twin is not None:
            raise InputError(f"{path}: slos[{i}].name {name!r} is already the name of slos[{twin}]; "
                             f"each SLO names its own columns")
        slos.append(Slo(name, values.get("ttft_ms"), values.get("tpot_ms"), values.get("attainment", 0.9)))
    return tuple(slos)


def _tables(path: Path, key: str, value) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InputError(f"{path}: {key} must be a list of tables ([[{key}]]), got {shown(value)}")
    if key == "schedulers" and not value:
        raise InputError(f"{path}: give at least one [[schedulers]] table")
    return value


def _kind_name(kind) -> str:
    return "a string" if kind is str else "a number"


def _relative(base: Path, text: str) -> str:
    """A path relative to the config's directory, when it names an existing file or directory there."""
    candidate = base / text
    return str(candidate) if not Path(text).is_absolute() and candidate.exists() else text
