"""The validation record (validation.json): per metric and statistic, measured, simulated, error,
noise floor; throughput, preemptions, the step level, and the errors left with step time matched.

Every figure is (simulated - measured) / measured, with the measured run-to-run noise floor beside
it when the measured run has repeats.
"""
from __future__ import annotations

from dataclasses import dataclass

from experiments.validation.errors import ErrorCell, relative_error, stat_error
from experiments.validation.measured import MeasuredRun
from experiments.validation.steps import StepLevelError
from simulator.measured_run import METRICS, STATS, MetricStats, RunStats


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
                   data.get("step_model"), StepMatched.from_dict(data.get("step_matched")))

    def to_dict(self) -> dict:
        from simulator.metrics import clean_json
        return clean_json({
            "measured_run": self.measured_run, "num_requests": self.num_requests, "num_repeats": self.num_repeats,
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
        })


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
        step_model, step_matched)


def step_matched_errors(run: MeasuredRun, model, step_level: StepLevelError, config) -> StepMatched | None:
    """Errors left once step time is right in total: the model rescaled by measured / predicted total
    over the measured step log, the same workload simulated again. What remains is queueing,
    scheduling and KV capacity; the difference to the plain errors is step time's share.
    None without a step log, or for a model that is not a FeatureStepModel."""
    from simulator.metrics import clean_json
    from simulator.simulation import simulate
    from simulator.step_model import FeatureStepModel
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
    from simulator.step_model import ScaledStepModel
    return ScaledStepModel(model, 1.0 / (1.0 + total_error))
