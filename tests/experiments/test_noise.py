import numpy as np
import pytest

from stepcal.core.batch import StepBatch
from stepcal.experiments.validation.noise import NoisyStepModel, StepNoise, estimate_noise
from stepcal.simulator.step_model import ConstStepModel


def ar1(rng, n, sigma, rho):
    x = np.empty(n)
    x[0] = sigma * rng.standard_normal()
    for t in range(1, n):
        x[t] = rho * x[t - 1] + np.sqrt(1 - rho * rho) * sigma * rng.standard_normal()
    return x


def test_estimate_noise_recovers_sigma_and_rho_of_two_repeats():
    rng = np.random.default_rng(0)
    batch_ms = rng.uniform(1.0, 8.0, 20000)           # each batch's own time: cancels in the log ratio
    ms_0 = batch_ms * np.exp(ar1(rng, len(batch_ms), 0.25, 0.9))
    ms_1 = 1.2 * batch_ms * np.exp(ar1(rng, len(batch_ms), 0.25, 0.9))   # repeat 1 on a slower machine
    noise = estimate_noise(ms_0, ms_1)
    assert noise.sigma_log == pytest.approx(0.25, rel=0.1)
    assert noise.rho == pytest.approx(0.9, abs=0.02)
    flat = estimate_noise(batch_ms, 1.5 * batch_ms)   # a pure speed difference is no scatter
    assert flat.sigma_log == pytest.approx(0.0, abs=1e-12) and flat.rho == 0.0


def test_noisy_model_keeps_the_mean_and_correlates_consecutive_steps():
    model = NoisyStepModel(ConstStepModel(2.0), StepNoise(0.3, 0.95), seed=1)
    batch = StepBatch.of([0], [1], [10])
    times = np.array([model.step_ms(batch) for _ in range(40000)])
    assert times.mean() == pytest.approx(2.0, rel=0.05)
    logs = np.log(times)
    assert logs.std() == pytest.approx(0.3, rel=0.1)
    assert np.corrcoef(logs[:-1], logs[1:])[0, 1] == pytest.approx(0.95, abs=0.02)
    with pytest.raises(RuntimeError, match="fast_path=False"):
        model.decode_run_ms(np.array([10]), 3)
