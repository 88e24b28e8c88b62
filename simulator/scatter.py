"""The device's scatter of step time, as a replication draws it: each step's time times (1 + e_k),
e an AR(1) series indexed by the replica's step number, times one speed level per run (see ranges for
what each parameter stands for and how replications use them)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepcal.core.errors import InputError


@dataclass(frozen=True)
class Scatter:
    """Scatter of step time: multiplicative, AR(1) from step to step, times a level per run."""
    cv: float = 0.0      # standard deviation of e_k
    rho: float = 0.0     # lag-one autocorrelation of e_k
    run_cv: float = 0.0  # coefficient of variation of the run's speed level
    run_cv_pairs: int = 0         # pairs of runs run_cv was estimated from (0: taken as exact)
    model_level_repeats: int = 0  # repeats of the run the model's level was fitted to (0: none)
    bias_cv: float = 0.0  # the model's level error its calibration left (Calibration.bias_cv)

    def __post_init__(self) -> None:
        if not (np.isfinite(self.cv) and self.cv >= 0):
            raise InputError(f"--scatter-cv must be a non-negative number, got {self.cv}")
        if not (np.isfinite(self.rho) and -1 < self.rho < 1):
            raise InputError(f"--scatter-rho must lie in (-1, 1), got {self.rho}")
        if not (np.isfinite(self.run_cv) and self.run_cv >= 0):
            raise InputError(f"--scatter-run-cv must be a non-negative number, got {self.run_cv}")
        if not (np.isfinite(self.bias_cv) and self.bias_cv >= 0):
            raise InputError(f"scatter: bias_cv must be a non-negative number, got {self.bias_cv}")
        for flag, value in (("--scatter-run-cv-pairs", self.run_cv_pairs),
                            ("--scatter-model-repeats", self.model_level_repeats)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise InputError(f"{flag} must be a non-negative whole number, got {value!r}")

    @property
    def level_sigma(self) -> float:
        """Standard deviation of the log of a run's level relative to the model's."""
        sigma = float(np.sqrt(np.log1p(self.run_cv ** 2)))
        if self.model_level_repeats:
            sigma *= float(np.sqrt(1.0 + 1.0 / self.model_level_repeats))
        return float(np.hypot(sigma, np.sqrt(np.log1p(self.bias_cv ** 2))))

    @property
    def is_zero(self) -> bool:
        return self.cv == 0.0 and self.run_cv == 0.0 and self.bias_cv == 0.0


class ScatterSeries:
    """The factors (1 + e_k) of one replica's steps k = 0, 1, ..., drawn in chunks as needed.

    Factors are floored at 0.05: a step never takes less than 5% of its modelled time."""
    CHUNK = 4096

    def __init__(self, scatter: Scatter, seed: int, replica: int) -> None:
        self.scatter = scatter
        self.rng = np.random.default_rng([seed, replica, 0x73636174])
        self.factors = np.zeros(0)
        self._last = 0.0
        self.level = run_level(scatter, seed, replica)

    def take(self, start: int, count: int) -> np.ndarray:
        while len(self.factors) < start + count:
            self.factors = np.concatenate((self.factors, self._chunk()))
        return self.factors[start:start + count]

    def _chunk(self) -> np.ndarray:
        cv, rho = self.scatter.cv, self.scatter.rho
        shocks = self.rng.standard_normal(self.CHUNK) * cv * np.sqrt(1.0 - rho * rho)
        e = np.empty(self.CHUNK)
        last = self._last
        for k, shock in enumerate(shocks.tolist()):   # AR(1); a chunk of 4096 steps costs ~1 ms
            last = rho * last + shock
            e[k] = last
        self._last = last
        return np.maximum(1.0 + e, 0.05) * self.level


def run_level(scatter: Scatter, seed: int, replica: int) -> float:
    """One replica's speed level: exp(sigma z - sigma^2 / 2), z standard normal, or Student's t of
    run_cv_pairs degrees of freedom (z over the root of a chi-square's mean). Its own streams: the step
    factors do not move with it, and z is the same draw whatever run_cv_pairs is."""
    sigma = scatter.level_sigma
    z = float(np.random.default_rng([seed, replica, 0x7370656564]).standard_normal())
    if scatter.run_cv_pairs:
        pairs = scatter.run_cv_pairs
        z /= float(np.sqrt(np.random.default_rng([seed, replica, 0x70616972]).chisquare(pairs) / pairs))
    return float(np.exp(sigma * z - sigma * sigma / 2.0))
