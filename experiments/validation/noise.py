"""The scatter of step time: the same batch, timed in two repeats, differs by more than its
mean speed. Estimated from a measured run's matched batches as an AR(1) process on log step time,
and replayed in the simulator by NoisyStepModel (studies/step_noise.py asks what it explains).

If each repeat's log step time is its batch's value plus noise x that is AR(1) with stationary
standard deviation sigma and step-to-step correlation rho, the difference d = log(t_1 / t_0) of
the two repeats has standard deviation sigma * sqrt(2) and the same autocorrelation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepcal.experiments.validation.steps import matched_steps

ACF_LAG = 10        # steps: rho from the autocorrelation at this lag (lag 1 overstates slow wander)


@dataclass(frozen=True)
class StepNoise:
    sigma_log: float      # stationary standard deviation of log step time around the batch's value
    rho: float            # correlation of the noise of consecutive steps


def estimate_noise(ms_0: np.ndarray, ms_1: np.ndarray, lag: int = ACF_LAG) -> StepNoise:
    """Noise of step time from the same batches timed in two repeats, in repeat 0's order."""
    d = np.log(np.asarray(ms_1, dtype=np.float64)) - np.log(np.asarray(ms_0, dtype=np.float64))
    d = d - d.mean()   # the repeats' difference in mean speed is drift between runs, not scatter
    if len(d) <= lag + 1 or d.std() == 0:
        return StepNoise(float(d.std() / np.sqrt(2)), 0.0)
    acf = float(np.corrcoef(d[:-lag], d[lag:])[0, 1])
    rho = min(max(acf, 0.0) ** (1.0 / lag), 0.999)
    return StepNoise(float(d.std() / np.sqrt(2)), rho)


def run_noise(run) -> StepNoise | None:
    """The scatter of step time in a measured run, from the batches both its repeats ran."""
    pairs = matched_steps(run)
    return None if pairs is None else estimate_noise(pairs["ms_0"].to_numpy(), pairs["ms_1"].to_numpy())


class NoisyStepModel:
    """A step model whose every step is multiplied by exp(x - sigma^2 / 2), x an AR(1) process: the
    multipliers have mean one, so the model's total is kept. Stateful: one instance per simulation,
    and the simulator must take every step one by one (SimConfig.fast_path=False)."""

    def __init__(self, base, noise: StepNoise, seed: int) -> None:
        self.base, self.noise = base, noise
        self.rng = np.random.default_rng(seed)
        self.x = noise.sigma_log * self.rng.standard_normal()

    def step_ms(self, batch) -> float:
        sigma, rho = self.noise.sigma_log, self.noise.rho
        self.x = rho * self.x + np.sqrt(1.0 - rho * rho) * sigma * self.rng.standard_normal()
        return float(self.base.step_ms(batch)) * float(np.exp(self.x - sigma * sigma / 2.0))

    def decode_run_ms(self, kv_lens, num_steps):
        raise RuntimeError("NoisyStepModel takes steps one by one: simulate with fast_path=False")
