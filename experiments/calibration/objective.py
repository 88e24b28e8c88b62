"""What a calibration matches, and the loss that scores a candidate set of host terms.

A candidate is scored by serving the measured workload in simulation under it (_Fit) and comparing
statistics: TTFT, TPOT and E2E means and quantiles (SUMMARY_OBJECTIVE; P99 stays out, as validation
checks it), and three slopes that those quantiles blur together (SLOPES). TTFT's slope on the
prompt's tokens among light-load arrivals is a prompt token's cost, which the quantiles mix with
the request path; TPOT's slope on the requests decoding alongside is a sequence's cost to a step,
which they mix with the per-step time; TPOT's slope on the prompt tokens prefilled alongside is a
token's cost to a step, which tells it from the request path where every prompt has one length.
The loss is the mean squared log ratio of simulated to measured, each slope weighed by its noise
(_Fit.weights).

Every simulation draws the front end with the same seed (common random numbers), so the loss is a
deterministic function of the terms and two candidates can be compared on it.

A run of several repeats is fitted whole. The summary statistics are the repeats' means, as
validation compares them; the front end's statistics are taken within each repeat, its requests
grouped by the streams active in that repeat's own queue, and averaged over the repeats
(request_stats). One simulated serving is compared with every repeat under that repeat's groups;
with one repeat this is exactly repeat 0.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from stepcal.core.measured_run import RunStats
from stepcal.experiments.calibration.request_stats import (
    PREFILL_SLOPE_KEY,
    SLOPE_KEY,
    STREAM_SLOPE_KEY,
    TPOT_SLOPE_KEY,
    decoding_alongside_in,
    measured_group_stats,
    pooled_bootstrap_log_covariance,
    pooled_group_stats,
    prefilled_alongside,
    repeat_groups,
)
from stepcal.experiments.validation.errors import relative_error
from stepcal.experiments.validation.measured import MeasuredRun, sim_config_for
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.simulation import simulate
from stepcal.simulator.step_model import HostTerms, HostTermsModel

# (metric, statistic) pairs the fit matches; P99 is left out on purpose: it is what we validate.
SUMMARY_OBJECTIVE = (("ttft_ms", "mean"), ("ttft_ms", "p50"), ("ttft_ms", "p90"),
                     ("tpot_ms", "mean"), ("tpot_ms", "p50"), ("tpot_ms", "p90"),
                     ("e2e_ms", "p50"), ("e2e_ms", "p90"))
# and what a prompt token costs, which the summary statistics mix with the per-request time, and what a
# sequence costs a step, which they mix with the per-step time
SLOPES = (SLOPE_KEY, TPOT_SLOPE_KEY, PREFILL_SLOPE_KEY)
OBJECTIVE = (*SUMMARY_OBJECTIVE, *SLOPES)
MIN_GAIN = 0.25    # per-sequence, per-token and front-end shape terms must cut the loss by a quarter to be kept

Errors = dict   # (metric, statistic) -> relative error of the simulated statistic (None where undefined)


def _loss(errors: Errors, weights: dict | None = None) -> float:
    """Mean squared log-ratio of simulated to measured: symmetric in over- and under-prediction;
    `weights`: a statistic's weight where not 1 (_Fit.weights)."""
    pairs = [(math.log1p(e) ** 2, (weights or {}).get(key, 1.0)) for key, e in errors.items()
             if e is not None and e > -1]
    total = sum(w for _, w in pairs)
    return float(sum(t * w for t, w in pairs) / total) if total > 0 else math.inf


class _Fit:
    """Simulations of the measured workload under candidate terms, and their errors (cached by terms)."""

    def __init__(self, run: MeasuredRun, base_model, scatter: Scatter | None = None) -> None:
        self.run, self.base_model = run, base_model
        self.scatter = scatter     # simulator.ranges.Scatter of the device, measured on the run (or None)
        self.logs = run.request_logs
        self.groups = repeat_groups(self.logs)   # each repeat's, from its own queue
        self.measured_front = measured_group_stats(self.logs, self.groups)
        self.cache: dict = {}
        self.covariances: dict = {}
        self.count = 0
        self._weights: dict | None = None

    @property
    def weights(self) -> dict:
        """Statistics that count less than 1 in the loss: the slopes, by their noise (_slope_weight)."""
        if self._weights is None:
            self._weights = {key: self._slope_weight(key) for key in (*SLOPES, STREAM_SLOPE_KEY)}
        return self._weights

    def _slope_weight(self, slope_key) -> float:
        """A slope counts as a summary statistic does where its bootstrap variance is at most theirs
        (median), less in proportion where it is larger: a spread front end or a bursty trace scatters
        the light-load TTFTs about their line (5-7 times the variance on the quickstart's bursty runs,
        half to nine tenths of it on its Poisson and prefill-heavy ones)."""
        variance = self._log_variances(slope_key)
        if variance is None or variance[-1] <= 0:
            return 1.0
        return float(min(1.0, np.median(variance[:-1]) / variance[-1]))

    def _log_variances(self, slope_key) -> np.ndarray | None:
        """Bootstrap variances of the log summary statistics and, last, of the log slope (None where
        the slope or the summary statistics are undefined)."""
        keys = [k for k in (*SUMMARY_OBJECTIVE, slope_key) if (self.measured(k) or 0) > 0]
        if len(keys) < 2 or keys[-1] != slope_key:
            return None
        variance = np.diag(self.log_covariance(keys))
        return variance if np.all(np.isfinite(variance)) else None

    def mean_batch(self) -> float:
        """The sequences a measured request's TPOT sees in a step: itself and those decoding alongside,
        averaged over the requests and the repeats."""
        alongside = [np.nanmean(decoding_alongside_in(r)) for r in self.logs]
        return float(np.nanmean(alongside)) + 1.0

    def mean_step_tokens(self) -> float:
        """The tokens of the steps a measured request's TPOT sees: a token per sequence (mean_batch)
        and the prompt tokens prefilled alongside per step, averaged over the requests and repeats."""
        prefill = [np.nanmean(prefilled_alongside(r)) for r in self.logs]
        return self.mean_batch() + float(np.nanmean(prefill))

    def slope_std_err(self, slope_key) -> float | None:
        """The measured slope's bootstrap standard error, in its own units."""
        variance = self._log_variances(slope_key)
        return None if variance is None else float(self.measured(slope_key) * np.sqrt(variance[-1]))

    def loss(self, terms: HostTerms, keys=None) -> float:
        return _loss(self.errors(terms, OBJECTIVE if keys is None else keys), self.weights)

    def simulate(self, terms: HostTerms, seed: int = 0, scattered: bool = False):
        """One serving of the workload; `scattered`: with the device's step scatter drawn from `seed`."""
        self.count += 1
        config = replace(sim_config_for(self.run, 0.0, terms.front_end), front_end_seed=seed,
                         **({"scatter": self.scatter, "scatter_seed": seed} if scattered else {}))
        return simulate(self.run.trace, HostTermsModel(self.base_model, terms), config)

    def stats(self, terms: HostTerms, seed: int = 0, scattered: bool = False) -> dict:
        """{(metric, stat): simulated value} over OBJECTIVE and FRONT_OBJECTIVE."""
        key = (terms, seed, scattered)
        if key not in self.cache:
            result = self.simulate(terms, seed, scattered)
            simulated = RunStats.from_summary(result.summary)
            stats = {(m, s): simulated.stat(m, s) for m, s in SUMMARY_OBJECTIVE}
            stats.update(pooled_group_stats(result.requests, self.groups))
            self.cache[key] = stats
        return self.cache[key]

    def log_covariance(self, keys) -> np.ndarray:
        """Bootstrap covariance of the measured log statistics `keys` (computed once per key set)."""
        keys = tuple(keys)
        if keys not in self.covariances:
            self.covariances[keys] = pooled_bootstrap_log_covariance(self.logs, self.groups, list(keys))
        return self.covariances[keys]

    def noise_floor(self, keys) -> float:
        """The loss a true model would show from the measured statistics' sampling noise alone (each
        variance weighted as the loss weighs its statistic)."""
        keys = [k for k in keys if (self.measured(k) or 0) > 0]
        variances = np.diag(self.log_covariance(keys)) if keys else np.array([])
        weights = np.array([self.weights.get(k, 1.0) for k in keys])
        ok = np.isfinite(variances)
        return float(np.average(variances[ok], weights=weights[ok])) if ok.any() and weights[ok].sum() > 0 else 0.0

    def measured(self, key) -> float | None:
        return self.measured_front[key] if key in self.measured_front else self.run.stats.stat(*key)

    def errors(self, terms: HostTerms, keys=OBJECTIVE) -> Errors:
        stats = self.stats(terms)
        return {k: relative_error(stats[k], self.measured(k)) for k in keys}
