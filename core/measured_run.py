"""A measured run on disk: the one owner of its layout (docs/design.md, data contracts).

    OUT/meta.json             settings and provenance (`kind: measured_run`; core.run_meta.RunMeta)
    OUT/trace.parquet         the workload that was served, in stepcal's trace format
    OUT/summary.json          repeat 0's summary, plus `noise_floor` when there are two repeats or more
    OUT/repeat_<k>/requests.parquet, steps.parquet, summary.json    each repeat's logs, k = 0, 1, ...

`stepcal measure` (profiler.engine.measure) and `stepcal import vllm-bench` write it with
`write_measured_run`; validation, calibration, reports and the campaign read it with
`read_measured_run` or the path helpers. A summary's statistics are read in one place,
`RunStats.from_summary`. pandas is imported for file I/O only, inside the functions.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.io import atomic_output_dir, atomic_write_bytes, atomic_write_json, atomic_write_parquet
from stepcal.core.metrics import PERCENTILES, clean_json
from stepcal.core.readers import read_json, read_parquet
from stepcal.core.run_meta import RunMeta
from stepcal.core.workload import read_trace

META = "meta.json"
TRACE = "trace.parquet"
SUMMARY = "summary.json"
REQUESTS = "requests.parquet"
STEPS = "steps.parquet"
# A repeat's summary.json flag: slow again in the same place when served again, so kept as the
# engine's own (profiler.engine.measure.serve_slowed_again)
SAME_PLACE = "slow_again_in_same_place"
REQUIRED = (META, TRACE, SUMMARY, f"repeat_0/{REQUESTS}", f"repeat_0/{STEPS}")

METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
STATS = ("mean",) + tuple(f"p{q}" for q in PERCENTILES)


@dataclass(frozen=True)
class MetricStats:
    """Mean and percentiles of one latency metric, as a summary.json holds them (None: absent)."""
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, summary: dict, metric: str) -> MetricStats:
        values = summary.get(metric) or {}     # a run with no finished request has null statistics
        return cls(**{stat: values.get(stat) for stat in STATS})

    def get(self, stat: str) -> float | None:
        return getattr(self, stat)

    def to_dict(self) -> dict:
        return {stat: self.get(stat) for stat in STATS}


@dataclass(frozen=True)
class RunStats:
    """What runs are compared on: each latency metric's statistics, the throughput and the preemptions.
    Also the shape of a summary's `noise_floor` (relative differences, no preemptions)."""
    metrics: dict[str, MetricStats]        # every one of METRICS
    throughput_rps: float | None = None
    num_preemptions: int | None = None

    @classmethod
    def from_summary(cls, summary: dict) -> RunStats:
        return cls({metric: MetricStats.of(summary, metric) for metric in METRICS},
                   summary.get("throughput_rps"), summary.get("num_preemptions"))

    def stat(self, metric: str, stat: str) -> float | None:
        return self.metrics[metric].get(stat)


@dataclass
class Repeat:
    """One serving of the workload: request log, step log (DataFrames) and summary.json."""
    requests: object
    steps: object
    summary: dict | None       # None where a repeat has no summary.json


@dataclass
class MeasuredRunFiles:
    path: Path
    meta: RunMeta
    trace: object              # core.trace.Trace
    summary: dict              # OUT/summary.json
    repeats: list[Repeat]


def repeat_dir(root: str | Path, k: int) -> Path:
    return Path(root) / f"repeat_{k}"


def repeat_dirs(root: str | Path) -> list[Path]:
    """A measured run's repeat_0, repeat_1, ... directories, in order, as long as each has a step log."""
    dirs = []
    while (repeat_dir(root, len(dirs)) / STEPS).exists():
        dirs.append(repeat_dir(root, len(dirs)))
    return dirs


def has_request_log(root: str | Path) -> bool:
    return (repeat_dir(root, 0) / REQUESTS).exists()


def noise_floor(summaries: list[dict]) -> dict:
    """Run-to-run relative difference of each metric statistic: |b - a| / a between the first two
    repeats (max over pairs with the first when there are more): the floor a simulator cannot beat."""
    runs = [RunStats.from_summary(s) for s in summaries]
    base = runs[0]
    floor = {}
    for metric in METRICS:
        floor[metric] = {}
        for stat in STATS:
            a = base.stat(metric, stat)
            diffs = [abs(r.stat(metric, stat) - a) / a for r in runs[1:] if a and r.stat(metric, stat) is not None]
            floor[metric][stat] = max(diffs) if diffs else None
    tput = [r.throughput_rps for r in runs if r.throughput_rps]
    floor["throughput_rps"] = (max(abs(t - tput[0]) / tput[0] for t in tput[1:]) if len(tput) > 1 else None)
    return floor


def write_measured_run(out: str | Path, trace, repeats: Sequence, meta: RunMeta,
                       extra_files: Mapping[str, bytes] | None = None) -> dict:
    """Write the layout above, atomically; `repeats` are objects with requests, steps and summary
    (an engine result or a Repeat); `extra_files` (name -> content) go beside them in the same move
    (an import keeps its source's other records). Returns OUT/summary.json's content."""
    summaries = [clean_json(r.summary) for r in repeats]
    summary = dict(summaries[0])
    if len(repeats) > 1:
        summary["noise_floor"] = noise_floor(summaries)
    with atomic_output_dir(out) as staging:
        atomic_write_parquet(trace.to_frame(), staging / TRACE)
        for k, (repeat, repeat_summary) in enumerate(zip(repeats, summaries)):
            atomic_write_parquet(repeat.requests, repeat_dir(staging, k) / REQUESTS)
            atomic_write_parquet(repeat.steps, repeat_dir(staging, k) / STEPS)
            atomic_write_json(repeat_dir(staging, k) / SUMMARY, repeat_summary)
        atomic_write_json(staging / SUMMARY, summary)
        atomic_write_json(staging / META, clean_json(meta.to_dict()))
        for name, data in (extra_files or {}).items():
            atomic_write_bytes(staging / name, data)
    return summary


@dataclass(frozen=True)
class Needs:
    """What a reader of a measured run needs beyond the files being readable: keys of meta.json and of
    every summary.json, columns of the request and step logs. Replaying a run (validation,
    calibration) needs validation.measured.REPLAY; reading one back to combine repeats needs nothing more."""
    meta_keys: tuple[str, ...] = ()
    summary_keys: tuple[str, ...] = ()
    request_columns: tuple[str, ...] = ()
    step_columns: tuple[str, ...] = ()
    # checks meta.json's settings beyond their keys (a replay: the scheduler's, see validation.measured)
    check_meta: Callable[[Path, RunMeta], None] | None = None


def read_measured_run(path: str | Path, arg_name: str = "measured run", needs: Needs = Needs()) -> MeasuredRunFiles:
    """Every file of the layout; InputError naming the file (and key or columns) when one that is
    required is missing, unreadable or lacks what `needs` asks for."""
    path = Path(path)
    for name in REQUIRED:
        if not (path / name).exists():
            raise InputError(f"{arg_name} {path}: missing {name} (expected the output of `stepcal measure` "
                             f"or `stepcal import vllm-bench`)")
    meta = RunMeta.read(path, needs.meta_keys)
    if needs.check_meta is not None:
        needs.check_meta(path / META, meta)
    summary = _read_summary(path / SUMMARY, needs)
    repeats = [Repeat(read_parquet(d / REQUESTS, "a measured run's request log", needs.request_columns),
                      read_parquet(d / STEPS, "a measured run's step log", needs.step_columns),
                      _read_summary(d / SUMMARY, needs) if (d / SUMMARY).exists() else None)
               for d in repeat_dirs(path)]
    return MeasuredRunFiles(path, meta, read_trace(path / TRACE, "stepcal"), summary, repeats)


def _read_summary(path: Path, needs: Needs) -> dict:
    summary = read_json(path, "a measured run's summary.json", needs.summary_keys)
    if needs.summary_keys:    # a replay compares every metric's statistics: each must be numbers or null
        _check_stats(path, summary, "")
        noise = summary.get("noise_floor")
        if noise is not None:
            if not isinstance(noise, dict):
                raise InputError(f"{path}: noise_floor must be an object, got {noise!r}")
            _check_stats(path, noise, "noise_floor.")
    return summary


def _check_stats(path: Path, summary: dict, prefix: str) -> None:
    for metric in METRICS:
        values = summary.get(metric)
        if values is not None and not (isinstance(values, dict) and all(v is None or _is_number(v)
                                                                          for v in values.values())):
            raise InputError(f"{path}: {prefix}{metric} must be an object of statistics (numbers or null), "
                             f"got {values!r}")
    for key in ("throughput_rps", "num_preemptions"):
        if summary.get(key) is not None and not _is_number(summary[key]):
            raise InputError(f"{path}: {prefix}{key} must be a number or null, got {summary[key]!r}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


__all__ = ["META", "METRICS", "REQUESTS", "SAME_PLACE", "STATS", "STEPS", "SUMMARY", "TRACE", "MeasuredRunFiles",
           "MetricStats", "Needs", "Repeat", "RunMeta", "RunStats", "has_request_log", "noise_floor", "read_measured_run",
           "repeat_dir", "repeat_dirs", "write_measured_run"]
