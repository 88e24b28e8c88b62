"""The validation record (validation.json): per metric and statistic, measured, simulated, error,
noise floor; throughput, preemptions, the step level, and the errors left with step time matched.

Every figure is (simulated - measured) / measured, with the measured run-to-run noise floor beside
it when the measured run has repeats.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from stepcal.core.artifact import ArtifactKind, artifact_header, read_artifact_meta
from stepcal.core.errors import InputError
from stepcal.core.measured_run import METRICS, STATS, MetricStats, RunStats
from stepcal.core.metrics import clean_json
from stepcal.experiments.validation.errors import ErrorCell, relative_error, stat_error
from stepcal.experiments.validation.machine_speed import speed_vs_profile
from stepcal.experiments.validation.measured import MeasuredRun
from stepcal.experiments.validation.steps import StepLevelError
from stepcal.simulator.simulation import simulate
from stepcal.simulator.step_model import FeatureStepModel, ScaledStepModel

VALIDATION_SCHEMA_VERSION = 1
VALIDATION_KIND = ArtifactKind(kind="stepcal.validation", schema_version=VALIDATION_SCHEMA_VERSION,
                               what="a validation", written_by="`stepcal validate`", file="validation.json",
                               aliases=(None,))


@dataclass(frozen=True)
class Preemptions:
    measured: int | None
    simulated: int | None

    def to_dict(self) -> dict:
        return {"measured": self.measured, "simulated": self.simulated}


@dataclass(frozen=True)
class StepMatched:
    """Errors left once step time is right in total: the model rescaled by `scale`, simulated again."""
    scale: float
    errors: dict[str, MetricStats]     # per metric, the relative error of each statistic
    throughput_rps: float | None

    @classmethod
    def from_dict(cls, data: dict | None) -> StepMatched | None:
        if not data:
            return None
        return cls(data["scale"], {m: MetricStats.of(data["metrics"], m) for m in data["metrics"]},
                   data.get("throughput_rps"))

    def error(self, metric: str, stat: str) -> float | None:
        return self.errors[metric].get(stat)

    def to_dict(self) -> dict:
        return {"scale": self.scale, "metrics": {m: s.to_dict() for m, s in self.errors.items()},
                "throughput_rps": self.throughput_rps}


@dataclass(frozen=True)
class PrefixReuse:
    """Prefix caching, measured against simulated: the share of prompt tokens reused at admission,
    and how many requests reused exactly the same number of tokens in both runs (the policy is
    deterministic: it differs only where timing changed what was cached when a request arrived)."""
    measured_hit_rate: float | None
    simulated_hit_rate: float | None
    num_same_cached: int
    num_compared: int

    @classmethod
    def of(cls, measured_requests, simulated_requests) -> PrefixReuse | None:
        if "num_cached_tokens" not in measured_requests or "num_cached_tokens" not in simulated_requests:
            return None
        both = measured_requests[["request_id", "num_cached_tokens", "num_prompt_tokens"]].merge(
            simulated_requests[["request_id", "num_cached_tokens"]], on="request_id", suffixes=("_m", "_s"))
        prompt = both["num_prompt_tokens"].sum()
        return cls(float(both["num_cached_tokens_m"].sum() / prompt) if prompt else None,
                   float(both["num_cached_tokens_s"].sum() / prompt) if prompt else None,
                   int((both["num_cached_tokens_m"] == both["num_cached_tokens_s"]).sum()), len(both))

    @classmethod
    def from_dict(cls, data: dict | None) -> PrefixReuse | None:
        return None if not data else cls(data.get("measured_hit_rate"), data.get("simulated_hit_rate"),
                                         data.get("num_same_cached", 0), data.get("num_compared", 0))

    def to_dict(self) -> dict:
        return {"measured_hit_rate": self.measured_hit_rate, "simulated_hit_rate": self.simulated_hit_rate,
                "num_same_cached": self.num_same_cached, "num_compared": self.num_compared}


@dataclass(frozen=True)
class ValidationRecord:
    """validation.json: the simulated run of a measured workload against the measured run."""
    measured_run: str
    num_requests: int
    num_repeats: int
    num_finished_both: int
    num_finished_only_measured: int
    num_finished_only_simulated: int
    metrics: dict[str, dict[str, ErrorCell]]     # metric -> statistic -> cell
    throughput_rps: ErrorCell
    preemptions: Preemptions
    step_level: StepLevelError
    speed_probe_ms: list | None = None
    step_model: str | None = None
    step_matched: StepMatched | None = None
    prefix_reuse: PrefixReuse | None = None   # when the measured run cached prefixes
    ranges: dict | None = None                # validate --ranges: the replications and their coverage
    step_split: dict | None = None            # predicted step time by part (experiments.validation.split)
    slowed_repeats: list | None = None        # repeats the machine slowed: {repeat, ratio, start_s, end_s}
    beyond_fitted: dict | None = None         # measured steps beyond the tables' fitted batches (extrapolated)
    profile_speed_probe_ms: list | None = None    # the same probe while the tables' profiles were taken
    host_defaults: dict | None = None         # the engine terms --host-defaults added (host_defaults.AddedHostTerms)
    timeseries: dict | None = None            # the engine's queue over time against the replay's (validation.timeseries)

    @property
    def speed_vs_profile(self) -> float | None:
        """The machine's slowdown during the run against the profile (experiments.validation.machine_speed)."""
        return speed_vs_profile(self.speed_probe_ms, self.profile_speed_probe_ms)

    def cell(self, metric: str, stat: str) -> ErrorCell:
        return self.metrics[metric][stat]

    @classmethod
    def from_dict(cls, data: dict) -> ValidationRecord:
        """A validation.json as read back (by reports and the campaign's headline)."""
        preemptions = data.get("num_preemptions") or {}
        return cls(data.get("measured_run"), data.get("num_requests"), data.get("num_repeats", 1),
                   data.get("num_finished_both"), data.get("num_finished_only_measured", 0),
                   data.get("num_finished_only_simulated", 0),
                   {m: {s: ErrorCell.from_dict(c) for s, c in stats.items()} for m, stats in data["metrics"].items()},
                   ErrorCell.from_dict(data.get("throughput_rps") or {}),
                   Preemptions(preemptions.get("measured"), preemptions.get("simulated")),
                   StepLevelError.from_dict(data.get("step_level") or {}), data.get("speed_probe_ms"),
                   data.get("step_model"), StepMatched.from_dict(data.get("step_matched")),
                   PrefixReuse.from_dict(data.get("prefix_reuse")), data.get("ranges"), data.get("step_split"),
                   data.get("slowed_repeats"), data.get("beyond_fitted"), data.get("profile_speed_probe_ms"),
                   data.get("host_defaults"), data.get("timeseries"))

    def to_dict(self) -> dict:
        """validation.json's content: the header (kind, schema_version, tool_version), then the record."""
        return clean_json({
            **artifact_header(VALIDATION_KIND), "measured_run": self.measured_run, "num_requests": self.num_requests, "num_repeats": self.num_repeats,
            "num_finished_both": self.num_finished_both,
            "num_finished_only_measured": self.num_finished_only_measured,
            "num_finished_only_simulated": self.num_finished_only_simulated,
            "metrics": {m: {s: cell.to_dict() for s, cell in stats.items()} for m, stats in self.metrics.items()},
            "throughput_rps": self.throughput_rps.to_dict(),
            "num_preemptions": self.preemptions.to_dict(),
            "step_level": self.step_level.to_dict(),
            "speed_probe_ms": self.speed_probe_ms,
            "step_model": self.step_model,
            "step_matched": None if self.step_matched is None else self.step_matched.to_dict(),
            "prefix_reuse": None if self.prefix_reuse is None else self.prefix_reuse.to_dict(),
            "ranges": self.ranges,
            "step_split": self.step_split,
            "slowed_repeats": self.slowed_repeats,
            "beyond_fitted": self.beyond_fitted,
            "profile_speed_probe_ms": self.profile_speed_probe_ms,
            "speed_vs_profile": self.speed_vs_profile,
            "host_defaults": self.host_defaults,
            "timeseries": self.timeseries,
        })


# What every validation.json has held; the later additions (num_repeats, step_matched, ...) are optional.
RECORD_KEYS = ("measured_run", "num_requests", "num_finished_both", "metrics", "throughput_rps", "step_level")
RECORD_WHAT = "the validation.json of `stepcal validate`"


def read_record(path: str | Path) -> ValidationRecord:
    """A validation.json read back (reports, the campaign's headline); InputError naming the file and
    the key for anything ValidationRecord.from_dict cannot take, or for a newer schema than this
    stepcal reads. Files written before the header (no kind, no schema_version) read as version 1."""
    path = Path(path)
    data = read_artifact_meta(path.parent, replace(VALIDATION_KIND, file=path.name), RECORD_KEYS)
    metrics = data["metrics"]
    if not isinstance(metrics, dict) or not metrics:
        raise InputError(f"{path}: metrics must be an object of metrics ({RECORD_WHAT}), got {metrics!r}")
    for metric, stats in metrics.items():
        if not isinstance(stats, dict):
            raise InputError(f"{path}: metrics.{metric} must be an object of statistics, got {stats!r}")
        for stat, cell in stats.items():
            _check_numbers(path, f"metrics.{metric}.{stat}", cell, nullable=False)
    _check_numbers(path, "throughput_rps", data["throughput_rps"], nullable=True)
    level = data["step_level"]
    if isinstance(level, dict):      # its noise_floor is an object of its own
        _check_numbers(path, "step_level.noise_floor", level.get("noise_floor"), nullable=True)
        level = {k: v for k, v in level.items() if k != "noise_floor"}
    _check_numbers(path, "step_level", level, nullable=True)
    for key in ("num_preemptions", "step_matched"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise InputError(f"{path}: {key} must be an object, got {data[key]!r}")
    matched = data.get("step_matched")
    if matched and not (_number_or_null(matched.get("scale")) and isinstance(matched.get("metrics"), dict)):
        raise InputError(f"{path}: step_matched must hold scale and metrics, got {matched!r}")
    return ValidationRecord.from_dict(data)


def _check_numbers(path: Path, key: str, value, nullable: bool) -> None:
    """`value` is an object of numbers or nulls (or null itself where allowed)."""
    if value is None and nullable:
        return
    if not isinstance(value, dict) or not all(_number_or_null(v) for v in value.values()):
        raise InputError(f"{path}: {key} must be an object of numbers or null, got {value!r}")


def _number_or_null(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def compare(run: MeasuredRun, simulated_requests, simulated: RunStats, step_level: StepLevelError,
            step_model: str | None = None, step_matched: StepMatched | None = None) -> ValidationRecord:
    """The validation record: per metric and statistic, measured, simulated, error, noise floor."""
    measured_ids = set(run.requests.loc[run.requests["finish_s"].notna(), "request_id"])
    simulated_ids = set(simulated_requests.loc[simulated_requests["finish_s"].notna(), "request_id"])
    noise = run.noise_floor or RunStats.from_summary({})
    metrics = {metric: {stat: ErrorCell.of(run.stats.stat(metric, stat), simulated.stat(metric, stat),
                                           noise.stat(metric, stat)) for stat in STATS}
               for metric in METRICS}
    return ValidationRecord(
        str(run.path), len(run.trace), run.num_repeats, len(measured_ids & simulated_ids),
        len(measured_ids - simulated_ids), len(simulated_ids - measured_ids), metrics,
        ErrorCell.of(run.stats.throughput_rps, simulated.throughput_rps, noise.throughput_rps),
        Preemptions(run.stats.num_preemptions, simulated.num_preemptions), step_level, run.speed_probe_ms,
        step_model, step_matched,
        PrefixReuse.of(run.requests, simulated_requests)
        if run.meta.prefix_caching_on and run.trace.prefix_hash_ids is not None else None)


def step_matched_errors(run: MeasuredRun, model, step_level: StepLevelError, config) -> StepMatched | None:
    """Errors left once step time is right in total: the model rescaled by measured / predicted total
    over the measured step log, the same workload simulated again. What remains is queueing,
    scheduling and KV capacity; the difference to the plain errors is step time's share.
    None without a step log, or for a model that is not a FeatureStepModel."""
    if step_level.total_error is None or not isinstance(model, FeatureStepModel):
        return None
    scaled = rescaled_to_total(model, step_level.total_error)
    simulated = RunStats.from_summary(clean_json(simulate(run.trace, scaled, config).summary))
    errors = {metric: MetricStats(**{stat: stat_error(simulated, run.stats, metric, stat) for stat in STATS})
              for metric in METRICS}
    return StepMatched(scaled.factor, errors, relative_error(simulated.throughput_rps, run.stats.throughput_rps))


def rescaled_to_total(model, total_error: float):
    """The model scaled so that its total over the measured step log equals the measured total
    (total_error: predicted / measured - 1, as step_level_error reports it)."""
    return ScaledStepModel(model, 1.0 / (1.0 + total_error))
