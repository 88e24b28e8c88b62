"""Relative errors of simulated against measured statistics, and one cell of the error table."""
from __future__ import annotations

from dataclasses import dataclass

from stepcal.core.measured_run import RunStats


def relative_error(predicted, measured) -> float | None:
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


def stat_error(simulated: RunStats, measured: RunStats, metric: str, stat: str) -> float | None:
    """Relative error of one statistic between two runs (None where either lacks it)."""
    return relative_error(simulated.stat(metric, stat), measured.stat(metric, stat))


@dataclass(frozen=True)
class ErrorCell:
    """One statistic of one metric: measured, simulated, error = (simulated - measured) / measured,
    and the measured run-to-run noise floor beside it (None without repeats)."""
    measured: float | None
    simulated: float | None
    error: float | None
    noise_floor: float | None = None

    @classmethod
    def of(cls, measured: float | None, simulated: float | None, noise_floor: float | None = None) -> ErrorCell:
        return cls(measured, simulated, relative_error(simulated, measured), noise_floor)

    @classmethod
    def from_dict(cls, data: dict) -> ErrorCell:
        return cls(data.get("measured"), data.get("simulated"), data.get("error"), data.get("noise_floor"))

    def to_dict(self) -> dict:
        return {"measured": self.measured, "simulated": self.simulated, "error": self.error,
                "noise_floor": self.noise_floor}
