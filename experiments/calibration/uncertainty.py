"""The standard errors of the fitted terms and their covariance.

A term's standard error comes from the sandwich (J'J)^-1 J'SJ (J'J)^-1 of the least-squares fit:
J is how the log statistics move with the terms (central differences, two simulations per term)
and S the noise of the measured log statistics about what the model gives (_noise_covariance).
That noise is the device's step-to-step scatter, measured on the run's repeats and simulated over
seeds, where the run has it; otherwise a block bootstrap over the measured requests. Where the fit
misses the run by more than that noise, S grows by the misfit ratio (_misfit_ratio): a model that
misses its calibration load is taken to miss other loads alike. For k terms this costs 2k + 4
simulations (16 more with a scatter), where refitting bootstrap resamples would cost a search each.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from stepcal.experiments.calibration.front_end import SHAPE_TERMS, _shape_scale
from stepcal.experiments.calibration.objective import OBJECTIVE, _Fit
from stepcal.experiments.calibration.request_stats import FRONT_OBJECTIVE
from stepcal.experiments.calibration.search import TERM_NAMES, _step_scale_ms
from stepcal.simulator.step_model import HostTerms

FD_STEP = 0.05     # finite-difference step of the uncertainty, in units of each term's scale
SIM_SEEDS = 4      # other front-end seeds that measure the simulation's own scatter at the fit
NOISE_SEEDS = 16   # seeds of the device's step scatter whose simulations measure the statistics' noise

UNCERTAINTY_METHOD = ("sandwich (J'J)^-1 J'SJ (J'J)^-1 of the least-squares fit: J by central differences of the "
                      "log statistics, S = the noise of the measured log statistics, times the misfit ratio "
                      "(the residual's mean square over the noise's, where above 1): ")
NOISE_METHODS = {
    "scatter": f"the device's step scatter (the run's AR(1) cv and rho) simulated over {NOISE_SEEDS} seeds, over "
               "the repeats averaged",
    "bootstrap": "block-bootstrap covariance of the measured requests' log statistics (every repeat's requests "
                 "resampled apart, statistics averaged over the repeats; 200 resamples; no step scatter measured) "
                 f"+ the simulation's scatter over {SIM_SEEDS} front-end seeds"}


def _std_errors(fit: _Fit, terms: HostTerms, fitted: list[str], with_front: bool) -> tuple[dict, dict, dict]:
    """Standard error of each fitted term (its units), None where no statistic moves with it; the
    covariance of the terms that have one ({"names", "matrix"}): `--ranges` draws them jointly, since
    terms fitted at one load trade off (simulator.step_model.TermUncertainty); and what S was
    ({"noise", "misfit_ratio"})."""
    keys = [k for k in (OBJECTIVE + FRONT_OBJECTIVE if with_front else OBJECTIVE)
            if (fit.measured(k) or 0) > 0 and (fit.stats(terms).get(k) or 0) > 0]
    if not keys:
        return dict.fromkeys(fitted), {}, {}

    def log_stats(t: HostTerms, seed: int = 0, scattered: bool = False) -> np.ndarray:
        stats = fit.stats(t, seed, scattered)
        return np.array([math.log(stats[k]) if stats.get(k) and stats[k] > 0 else math.nan for k in keys])
    # per_request_ms is in both: the shape's scale (a typical TTFT) wins, as it is the front end's median
    scales = (dict(zip(TERM_NAMES, _step_scale_ms(fit.run))) | dict(zip(SHAPE_TERMS, _shape_scale(fit)))
              | {"base_scale": 1.0})
    center = log_stats(terms)
    jac = np.zeros((len(keys), len(fitted)))
    for j, name in enumerate(fitted):
        value, h = getattr(terms, name), FD_STEP * scales[name]
        up = log_stats(replace(terms, **{name: value + h}))
        if value - h >= 0:
            jac[:, j] = (up - log_stats(replace(terms, **{name: value - h}))) / (2 * h)
        else:
            jac[:, j] = (up - center) / h
    covariance, source = _noise_covariance(fit, terms, keys, log_stats)
    residual = center - np.log([fit.measured(k) for k in keys])
    ok = np.all(np.isfinite(jac), axis=1) & np.isfinite(np.diag(covariance)) & np.isfinite(residual)
    jac, covariance = jac[ok], covariance[np.ix_(ok, ok)]
    misfit = _misfit_ratio(residual[ok], np.diag(covariance), len(fitted))
    inverse = np.linalg.pinv(jac.T @ jac)
    sandwich = misfit * (inverse @ jac.T @ covariance @ jac @ inverse)
    moves = np.linalg.norm(jac, axis=0) > 1e-12
    std_err = {name: (float(math.sqrt(max(sandwich[j, j], 0.0))) if moves[j] else None) for j, name in enumerate(fitted)}
    kept = np.flatnonzero(moves)
    covariance = {"names": [fitted[j] for j in kept], "matrix": sandwich[np.ix_(kept, kept)].tolist()}
    return std_err, (covariance if len(kept) else {}), {"noise": source, "misfit_ratio": misfit}


def _noise_covariance(fit: _Fit, terms: HostTerms, keys: list, log_stats) -> tuple[np.ndarray, str]:
    """Covariance of the noise in the measured log statistics `keys`, and its source. The simulation
    replays the measured requests themselves, so the noise that moves a fit is what the device adds:
    its step scatter (simulated over NOISE_SEEDS seeds, front-end draws with them, over the repeats
    averaged). A bootstrap of the requests also counts their variety, which simulation and measurement
    share: 10-50 times the variance of two repeats' difference on the quickstart's runs. It serves
    where no scatter was measured (a run of one repeat, an imported `vllm bench` run)."""
    if fit.scatter is not None:
        draws = np.array([log_stats(terms, seed, scattered=True) for seed in range(1, NOISE_SEEDS + 1)])
        return np.atleast_2d(np.cov(draws, rowvar=False)) / len(fit.logs), "scatter"
    covariance = fit.log_covariance(keys)
    if terms.per_request_sigma > 0:   # the simulation's own scatter over front-end seeds
        draws = np.array([log_stats(terms, seed) for seed in range(1, SIM_SEEDS + 1)] + [log_stats(terms)])
        covariance = covariance + np.diag(np.nanvar(draws, axis=0, ddof=1))
    return covariance, "bootstrap"


def _misfit_ratio(residual: np.ndarray, noise_variance: np.ndarray, num_terms: int) -> float:
    """The fit's residual mean square (over its degrees of freedom) against the noise's mean variance,
    at least 1: a model that misses its calibration run by more than the noise explains is as unsure
    as that miss (Birge's ratio, reduced chi-square). 1 where there are no degrees of freedom left."""
    dof = len(residual) - num_terms
    noise = float(np.mean(noise_variance)) if len(noise_variance) else 0.0
    if dof <= 0 or not noise > 0:
        return 1.0
    return max(1.0, float(np.sum(residual ** 2)) / dof / noise)
