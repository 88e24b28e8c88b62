"""The result of a calibration, and the `calibration` record it leaves in meta.json."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from stepcal.experiments.calibration.objective import OBJECTIVE, SUMMARY_OBJECTIVE, Errors
from stepcal.experiments.calibration.request_stats import FRONT_OBJECTIVE
from stepcal.experiments.calibration.uncertainty import NOISE_METHODS, UNCERTAINTY_METHOD
from stepcal.simulator.step_model import HostTerms


@dataclass
class Calibration:
    """What a calibration found: the host terms, the loss and errors before and after them, the front
    end's shape fit, and the terms' uncertainty."""
    terms: HostTerms
    loss_before: float
    loss_after: float
    errors_before: Errors
    errors_after: Errors
    num_simulations: int
    wall_s: float
    front_end: dict = field(default_factory=dict)      # the shape fit: kept?, its loss and errors
    std_err: dict = field(default_factory=dict)        # fitted term -> standard error (None: not identifiable)
    covariance: dict = field(default_factory=dict)     # {"names", "matrix"} of the identifiable terms (ms^2)
    num_repeats: int = 1                               # measured repeats whose request logs were fitted
    noise: dict = field(default_factory=dict)          # S of the uncertainty: its source and the misfit ratio
    held: dict = field(default_factory=dict)           # term -> why it was not searched (held_terms)
    step_log: dict = field(default_factory=dict)       # StepLogTerms.to_dict() where the log priced the step terms

    @property
    def bias_cv(self) -> float:
        """What the terms leave of the model's level at the calibration load: the mean log ratio of the
        simulated statistics to the measured ones, unsigned (about 0 where the fit absorbed it). Host
        terms only add time and the base's scale takes away at most half, so a base that prices the run
        too high may keep some of its excess (before the scale: a quickstart's served-profile tables
        priced a bursty sarathi run 4-7% high with every term at zero, and their 90% intervals, drawn
        about that level with the device's spread alone, held 45% of the held-out cells). --ranges
        draws each replication's level with it too (simulator.ranges.Scatter.bias_cv).
        Over the summary statistics: the TTFT slope is a shape, not a level."""
        logs = [math.log1p(e) for key, e in self.errors_after.items()
                if key in SUMMARY_OBJECTIVE and e is not None and e > -1]
        return float(abs(np.mean(logs))) if logs else 0.0

    def to_dict(self) -> dict:
        """The `calibration` record of meta.json (errors keyed "metric.stat")."""
        front = {**self.front_end, "errors_before": _keyed(self.front_end.get("errors_before", {})),
                 "errors_after": _keyed(self.front_end.get("errors_after", {})),
                 "objective": [f"{m}.{s}" for m, s in FRONT_OBJECTIVE]}
        return {"host_terms": self.terms.to_dict(), "loss_before": self.loss_before, "loss_after": self.loss_after,
                "errors_before": _keyed(self.errors_before), "errors_after": _keyed(self.errors_after),
                "num_simulations": self.num_simulations, "wall_s": self.wall_s,
                "objective": [f"{m}.{s}" for m, s in OBJECTIVE], "front_end": front,
                "num_repeats": self.num_repeats, "held_terms": self.held, "bias_cv": self.bias_cv,
                "step_terms_from": "step log" if self.step_log else "request log", "step_log": self.step_log,
                "uncertainty": {"std_err": self.std_err,
                                "method": UNCERTAINTY_METHOD + NOISE_METHODS.get(self.noise.get("noise"), ""),
                                **self.noise, **({"covariance": self.covariance} if self.covariance else {})}}


def _keyed(errors: Errors) -> dict:
    return {f"{metric}.{stat}": error for (metric, stat), error in errors.items()}
