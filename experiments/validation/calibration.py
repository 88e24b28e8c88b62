"""Calibration: fit the host terms that kernel profiles miss, from one measured run's request logs.

Where the run has a step log with batch shapes, the step terms are read off it
(experiments.validation.step_log_terms) and only the per-request term is searched. Otherwise
the terms (per step, per sequence, per token of a step; per request for the request path) are
found by simulating the measured workload with the base step model plus the terms and matching
the measured TTFT, TPOT and E2E distributions and TTFT's slope on the prompt's tokens among light-load
arrivals (request_stats.SLOPE_KEY: a prompt token's cost, which the quantiles mix with the request
path) and TPOT's slope on the requests decoding alongside each one (request_stats.TPOT_SLOPE_KEY: a
sequence's cost to a step, which they mix with the per-step time) and on the prompt tokens prefilled
alongside (request_stats.PREFILL_SLOPE_KEY: a token's cost to a step, which tells it from the request
path where prompts have one length; the slopes weighed by their noise, _Fit.weights): a bounded
Powell search over four numbers, each
evaluation one deterministic simulation. Over three where the base tables have a profiled host term:
they price a sequence already, better than a run at low load can (held_terms).

Then the front end's shape (simulator.frontend): the per-request delay's log-normal sigma and its
per-stream part, with its median searched again, matching besides TTFT quantiles among the requests
that arrived at light and at heavy load (experiments.validation.request_stats). They are kept only
where they cut that loss by a quarter, as the per-sequence and per-token terms are. Every
evaluation simulates with the same front-end seed, so the loss is a smooth function of the terms
(common random numbers) and the search can compare them.

A run of several repeats is used whole: the summary statistics are the repeats' means (as validation
compares them), and the front end's statistics are taken in each repeat, its requests grouped by the
streams active in that repeat's own queue, then averaged over the repeats
(experiments.validation.request_stats). The simulation, one serving of the workload, is compared
with each repeat under that repeat's groups. With one repeat everything is as it was with repeat 0.

Each fitted term gets a standard error: the sandwich (J'J)^-1 J' S J (J'J)^-1 of the least-squares
fit, with J the sensitivity of the log statistics to the terms (central differences, two simulations
per term) and S the noise of the measured log statistics about what the model gives (_noise_covariance):
the device's step-to-step scatter, measured on the run's repeats and simulated over seeds, where the
run has it; else a block bootstrap over the measured requests. S is scaled up by the fit's misfit
ratio where the residual exceeds that noise (_misfit_ratio): what the model misses at the calibration
load it is taken to miss, in the same directions, elsewhere. It costs 2k + 4 (+ 16) simulations for k
terms, where refitting bootstrap resamples would cost a whole search each.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from stepcal.core.measured_run import RunStats
from stepcal.experiments.validation.errors import relative_error
from stepcal.experiments.validation.measured import MeasuredRun, sim_config_for
from stepcal.experiments.validation.request_stats import (
    FRONT_OBJECTIVE,
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
from stepcal.experiments.validation.step_log_terms import BASE_SCALE_BOUNDS, step_log_terms
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.step_model import STEP_TERMS, HostTerms, HostTermsModel

# (metric, statistic) pairs the fit matches; P99 is left out on purpose: it is what we validate.
SUMMARY_OBJECTIVE = (("ttft_ms", "mean"), ("ttft_ms", "p50"), ("ttft_ms", "p90"),
                     ("tpot_ms", "mean"), ("tpot_ms", "p50"), ("tpot_ms", "p90"),
                     ("e2e_ms", "p50"), ("e2e_ms", "p90"))
# and what a prompt token costs, which the summary statistics mix with the per-request time, and what a
# sequence costs a step, which they mix with the per-step time
SLOPES = (SLOPE_KEY, TPOT_SLOPE_KEY, PREFILL_SLOPE_KEY)
OBJECTIVE = (*SUMMARY_OBJECTIVE, *SLOPES)
TERM_NAMES = (*STEP_TERMS, "per_request_ms")   # the first search's vector
FIRST_TERMS = ("per_step_ms", "per_request_ms")          # searched first; the others only where they earn it
SHAPE_TERMS = ("per_request_ms", "per_request_sigma", "per_stream_ms")   # the front end's distribution
START = 0.01       # where a term's search starts, in units of its scale
START_MAX = 1.9    # the highest start, inside the searches' [0, 2] box
SCALE_BUDGET = 20  # simulations of the base scale's search (bounded Brent: a 1e-3 bracket in about 15)
SHAPE_START_SIGMA = 0.3   # a moderate spread, where the data cannot suggest one
SHAPE_MIN_BUDGET = 40     # simulations of the shape search, at least: Powell needs a few per line search
CONSTANT_BUDGET = 15      # simulations of the best constant front end the shape must beat
MIN_GAIN = 0.25    # per-sequence, per-token and front-end shape terms must cut the loss by a quarter to be kept
FD_STEP = 0.05     # finite-difference step of the uncertainty, in units of each term's scale
SIM_SEEDS = 4      # other front-end seeds that measure the simulation's own scatter at the fit
NOISE_SEEDS = 16   # seeds of the device's step scatter whose simulations measure the statistics' noise

Errors = dict   # (metric, statistic) -> relative error of the simulated statistic (None where undefined)


@dataclass
class Calibration:
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
        draws each replication's level with it too (simulator.scatter.Scatter.bias_cv).
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


UNCERTAINTY_METHOD = ("sandwich (J'J)^-1 J'SJ (J'J)^-1 of the least-squares fit: J by central differences of the "
                      "log statistics, S = the noise of the measured log statistics, times the misfit ratio "
                      "(the residual's mean square over the noise's, where above 1): ")
NOISE_METHODS = {
    "scatter": f"the device's step scatter (the run's AR(1) cv and rho) simulated over {NOISE_SEEDS} seeds, over "
               "the repeats averaged",
    "bootstrap": "block-bootstrap covariance of the measured requests' log statistics (every repeat's requests "
                 "resampled apart, statistics averaged over the repeats; 200 resamples; no step scatter measured) "
                 f"+ the simulation's scatter over {SIM_SEEDS} front-end seeds"}


def _keyed(errors: Errors) -> dict:
    return {f"{metric}.{stat}": error for (metric, stat), error in errors.items()}


def _loss(errors: Errors, weights: dict | None = None) -> float:
    """Mean squared log-ratio of simulated to measured: symmetric in over- and under-prediction;
    `weights`: a statistic's weight where not 1 (_Fit.weights)."""
    pairs = [(math.log1p(e) ** 2, (weights or {}).get(key, 1.0)) for key, e in errors.items()
             if e is not None and e > -1]
    total = sum(w for _, w in pairs)
    return float(sum(t * w for t, w in pairs) / total) if total > 0 else math.inf


def _term_vector(**values: float) -> np.ndarray:
    """A search vector (TERM_NAMES order) with the named terms set and the others zero."""
    x = np.zeros(len(TERM_NAMES))
    for name, value in values.items():
        x[TERM_NAMES.index(name)] = value
    return x


class _Fit:
    """Simulations of the measured workload under candidate terms, and their errors (cached by terms)."""

    def __init__(self, run: MeasuredRun, base_model, scatter: Scatter | None = None) -> None:
        self.run, self.base_model = run, base_model
        self.scatter = scatter     # simulator.scatter.Scatter of the device, measured on the run (or None)
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
        from stepcal.simulator.simulation import simulate
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


def calibrate(run: MeasuredRun, base_model, max_simulations: int = 300, start: HostTerms | None = None,
              uncertainty: bool = True, scatter: Scatter | None = None, step_log: bool = True) -> Calibration:
    """Fit the host terms of `base_model` on `run`. `start` (e.g. an engine's published defaults) is where
    the search starts; its per-prompt-token term is kept as it is (a workload of similar prompts cannot
    tell it from the median). `scatter` (simulator.scatter.Scatter: the device's step scatter, measured
    on the run's repeats) is the noise the uncertainty is sized on; None: a bootstrap of the requests.
    Stage budgets, in simulations: a third of max_simulations for the first two step terms and for
    each of three searches of all four (_search_all_four; four where TPOT's slope gap gives one more
    start, _tpot_gap_start), SCALE_BUDGET + 1 for the base's scale on the
    request log, a third for the front end's shape; plus 2k + 4 (+ NOISE_SEEDS with a scatter) for
    the uncertainty."""
    t0 = time.perf_counter()
    fit = _Fit(run, base_model, scatter if scatter is not None and scatter.cv > 0 else None)
    start = start or HostTerms()
    scale = _step_scale_ms(run)
    held = held_terms(base_model)
    from_log = step_log_terms(run, base_model, tuple(held)) if step_log else None
    if from_log is None:
        held |= untold_terms(fit)
    # held as they are: a per-prompt-token default, and the scale the step log gave the base
    fixed = {"per_prompt_token_ms": start.per_prompt_token_ms,
             "base_scale": from_log.base_scale if from_log is not None else 1.0}

    def step_terms(x: np.ndarray) -> HostTerms:
        return HostTerms(**{name: float(v) for name, v in zip(TERM_NAMES, np.maximum(x, 0.0) * scale)}, **fixed)

    def search(x0: np.ndarray, names: tuple[str, ...], budget: int, keep: np.ndarray | None = None
               ) -> tuple[np.ndarray, float]:
        """Powell over `names`, the other terms at `keep` (zero by default); the best point it evaluated."""
        free = [TERM_NAMES.index(name) for name in names]

        def full(z):
            x = np.zeros(len(TERM_NAMES)) if keep is None else keep.copy()
            x[free] = np.maximum(z, 0.0)
            return x
        z, loss = _powell_best(lambda z: fit.loss(step_terms(full(z))), x0[free], budget)
        return full(z), loss

    none = np.zeros(len(TERM_NAMES))
    terms0 = step_terms(none)
    errors0 = fit.errors(terms0)
    loss0 = _loss(errors0, fit.weights)
    # The terms are in units of a typical measured step, so that one step size suits all four.
    # Per step and per request first; per sequence and per token only where they earn their place:
    # at a low calibration load most steps hold one or two sequences, so a per-sequence term is
    # nearly a per-step one and the fit cannot tell them apart, and the wrong pick extrapolates
    # badly (one quickstart chose 0.79 ms per sequence instead of per step, and its 90% load came
    # out 3x too slow).
    x_start = np.array([getattr(start, name) / s if getattr(start, name) > 0 else START
                        for name, s in zip(TERM_NAMES, scale)])
    if start.per_request_ms == 0:
        i = TERM_NAMES.index("per_request_ms")
        x_start[i] = float(np.clip(_request_start_ms(fit, terms0) / scale[i], START, START_MAX))
    third = max_simulations // 3
    if from_log is not None:   # the step terms as the log priced them; the request search has the front end
        x_log = _term_vector(per_request_ms=x_start[TERM_NAMES.index("per_request_ms")])
        for name, value in from_log.terms.items():
            x_log[TERM_NAMES.index(name)] = value / scale[TERM_NAMES.index(name)]
        best, loss1 = search(x_log, ("per_request_ms",), third, keep=x_log)
        # Their errors are sized as the request search's (_std_errors over them all): the regression's
        # own count the log's scatter about its line, not what the line misses at other loads, and
        # --ranges drawn from them held 103 of 160 of one quickstart's held-out cells (the request
        # search's 135).
        fitted = [*(from_log.terms if from_log.base_scale == 1.0 else ["base_scale"]), "per_request_ms"]
    else:
        first = FIRST_TERMS
        gap_ms = _slope_gap_ms(fit, terms0)
        if gap_ms > 0 and start.per_token_ms == 0:   # a prompt token costs more than the base says
            x_start[TERM_NAMES.index("per_token_ms")] = gap_ms / scale[TERM_NAMES.index("per_token_ms")]
            first = (*FIRST_TERMS, "per_token_ms")
        best, loss1, fitted = _search_step_terms(search, x_start, third, tuple(n for n in TERM_NAMES if n not in held),
                                                 first, lambda x: _tpot_gap_start(fit, step_terms, x, scale))
        if loss1 > loss0:   # never return terms worse than none
            best, loss1, fitted = none, loss0, []
    terms = step_terms(best)
    if from_log is None:
        terms, loss1, fitted = _fit_base_scale(fit, terms, loss1, fitted)
    terms, front = _fit_shape(fit, terms, max(SHAPE_MIN_BUDGET, max_simulations // 3))
    if front["kept"]:
        fitted += [name for name in SHAPE_TERMS if name not in fitted]
    errors1 = fit.errors(terms)
    std_err, covariance, noise = (_std_errors(fit, terms, fitted, front["kept"]) if uncertainty and fitted
                                  else ({}, {}, {}))
    return Calibration(terms, loss0, _loss(errors1, fit.weights), errors0, errors1, fit.count, time.perf_counter() - t0,
                       front, std_err, covariance, len(fit.logs), noise=noise, held=held,
                       step_log=from_log.to_dict() if from_log is not None else {})


def _powell_best(loss, x0: np.ndarray, budget: int) -> tuple[np.ndarray, float]:
    """Bounded Powell on [0, 2] per coordinate from `x0`; the best point it evaluated and its loss.
    Bounded Powell can end on a point worse than one it saw, the loss being a simulation's and not
    smooth: from a start of loss 5.8e-5 (0.52 ms per step, 0.10 per sequence: near a simulated H100
    deployment's truth) one step search saw 1.5e-5 and returned a point of 1.6e-3, and the shape
    search returned points 6-12% above its best on three of six simulated vLLM deployments."""
    from scipy.optimize import minimize
    seen = {"loss": math.inf, "x": None}   # Powell evaluates x0 first, so x is always set

    def objective(z):
        value = loss(z)
        if value < seen["loss"]:
            seen.update(loss=value, x=np.array(z, dtype=float))
        return value
    minimize(objective, x0=x0, method="Powell", bounds=[(0.0, 2.0)] * len(x0),
             options={"maxfev": budget, "xtol": 1e-3, "ftol": 1e-4})
    return seen["x"], seen["loss"]


def _fit_base_scale(fit: _Fit, terms: HostTerms, loss: float, fitted: list[str]) -> tuple[HostTerms, float, list[str]]:
    """The base's step times scaled down (base_scale < 1), the step terms at zero and the per-request
    median as fitted (the front end's search moves it again): kept where that fits the run better than
    `terms` (loss `loss`). Host terms only add time, so a base that prices the run too slow kept its
    excess: the quickstart's profiled tables priced all twelve calibration runs of six campaigns 0.2-5.3%
    slow (their step totals), ten of them with every step term under 0.04 ms, and their held-out loads
    as slow. The step terms go to zero with it: at a calibration load a scale and a per-step term move
    the statistics alike, and a base too slow needs no step time added."""
    from scipy.optimize import minimize_scalar
    bare = replace(terms, **dict.fromkeys(STEP_TERMS, 0.0))
    result = minimize_scalar(lambda x: fit.loss(replace(bare, base_scale=float(x))), bounds=BASE_SCALE_BOUNDS,
                             method="bounded", options={"xatol": 1e-3, "maxiter": SCALE_BUDGET})
    at_bound = replace(bare, base_scale=BASE_SCALE_BOUNDS[0])
    candidate = min((replace(bare, base_scale=float(result.x)), at_bound), key=fit.loss)
    candidate_loss = fit.loss(candidate)
    if candidate.base_scale < 1.0 and candidate_loss < loss:
        return candidate, candidate_loss, ["base_scale", *(["per_request_ms"] if "per_request_ms" in fitted else [])]
    return terms, loss, fitted


GAP_STD_ERRS = 2.0   # a slope gap smaller than this many of the measured slope's standard errors is noise


def _request_start_ms(fit: _Fit, terms: HostTerms) -> float:
    """Where the per-request term's search starts: what the light-load arrivals' median TTFT measures
    beyond its simulation under `terms` (at light load little of it is queueing), less what two steps
    missing TPOT's median gap would explain (the step in progress at arrival and the request's own
    prefill); 0 where nothing is left (the caller starts at START). From a start near zero, Powell's
    first line search (per step) spent its budget pricing a 20 ms request path as 3.9 ms per step on a
    small simulated bench (truth: 1 ms; TPOT +73% after the fit). Without the steps' part, a base at
    half the true step time started a request path that is not there and kept some of it."""
    ttft, tpot = ("ttft_ms", "light_load.p50"), ("tpot_ms", "p50")
    stats = fit.stats(terms)
    if not all((fit.measured(k) or 0) > 0 and (stats.get(k) or 0) > 0 for k in (ttft, tpot)):
        return 0.0
    step_gap_ms = max(fit.measured(tpot) - stats[tpot], 0.0)
    return max(fit.measured(ttft) - stats[ttft] - 2.0 * step_gap_ms, 0.0)


def _slope_gap_ms(fit: _Fit, terms: HostTerms) -> float:
    """What the measured runs' TTFT rises per prompt token (light-load arrivals) beyond what the
    simulation under `terms` shows: the per-token time the base misses, where both slopes exist and
    the gap exceeds GAP_STD_ERRS of the measured slope's noise. Noise would start the per-token term
    where no token costs more: on simulated Qwen3-14B H100 deployments of prompts of many lengths
    (log-normal, sigma 0.4) the gap was 0.5 and 0.6 standard errors where the truth had no per-token
    cost (0.008 ms per token found each time) and 5.8 where it had 0.012."""
    measured, simulated = fit.measured(SLOPE_KEY), fit.stats(terms).get(SLOPE_KEY)
    if not (measured and simulated):
        return 0.0
    std_err = fit.slope_std_err(SLOPE_KEY)
    return measured - simulated if std_err is None or measured - simulated > GAP_STD_ERRS * std_err else 0.0


def _search_step_terms(search, x_start: np.ndarray, budget: int, searched: tuple[str, ...],
                       first: tuple[str, ...] = FIRST_TERMS, gap_start=None) -> tuple[np.ndarray, float, list[str]]:
    """The step terms from the request log alone: `first` (per step and per request, and per token
    where the TTFT slope says the base misses some), all of `searched` only where they cut the loss
    by MIN_GAIN (_search_all_four). `gap_start` maps the first fit to one more start of that search
    (or None): _tpot_gap_start, asked only where the per-sequence term is searched."""
    best, loss1 = search(x_start, first, budget)
    fitted = list(first)
    if loss1 > 0:
        informed = gap_start(best) if gap_start is not None and "per_seq_ms" in searched else None
        x4, loss4 = _search_all_four(search, best, x_start, budget, searched, informed)
        if loss4 < (1.0 - MIN_GAIN) * loss1:
            best, loss1, fitted = x4, loss4, list(searched)
    return best, loss1, fitted


def _tpot_gap_start(fit: _Fit, step_terms, x: np.ndarray, scale: np.ndarray) -> np.ndarray | None:
    """The first fit `x` with a sequence's and a token's time set where TPOT's slopes put them: the
    per-sequence term moved by the gap of the slope on the requests decoding alongside (ms per stream),
    the per-token term by the gap of the slope on the prompt tokens prefilled alongside (ms per token),
    each only where its gap exceeds GAP_STD_ERRS of the measured slope's noise, and the per-step term
    the opposite over the sequences and tokens of the steps a request sees, so that the calibration
    load's TPOT stays; None where neither gap counts. Powell from the first fit and afresh missed that
    basin on simulated H100 deployments of log-normal prompts: a truth of 0.5 ms per step and 0.1 per
    sequence came out 1.01 and 0 (TPOT 14% fast at four times the load), with the slope 27% off; the
    gap there puts the start at about 0.1 per sequence. The token's gap is read at the first fit, not
    at no terms: where prefills run as steps of their own, the per-step time the base misses shows in
    that slope too."""
    terms = step_terms(x)
    out, moved = x.copy(), False
    step_ms = terms.per_step_ms
    for key, name, per_step_units in ((TPOT_SLOPE_KEY, "per_seq_ms", fit.mean_batch),
                                      (PREFILL_SLOPE_KEY, "per_token_ms", fit.mean_step_tokens)):
        measured, simulated = fit.measured(key), fit.stats(terms).get(key)
        std_err = fit.slope_std_err(key)
        if not (measured and simulated and std_err) or abs(measured - simulated) <= GAP_STD_ERRS * std_err:
            continue
        value = max(0.0, getattr(terms, name) + measured - simulated)
        step_ms -= (value - getattr(terms, name)) * per_step_units()
        out[TERM_NAMES.index(name)] = value / scale[TERM_NAMES.index(name)]
        moved = True
    out[TERM_NAMES.index("per_step_ms")] = max(0.0, step_ms) / scale[TERM_NAMES.index("per_step_ms")]
    return out if moved else None


def held_terms(base_model) -> dict:
    """Step terms the search leaves at zero, and why. A base whose tables price the engine's host path
    from a profile over num_seqs (a `host` term: `stepcal profile`'s host op) gets no per-sequence
    correction. At a calibration load most steps hold one to three sequences, so a sequence's cost is
    nearly a step's: per step and per sequence came out correlated -0.82 to -0.995 in the fits on the
    quickstart's Poisson trace (less on bursty ones), and that one direction made most of the width of
    their 90% intervals at 90% load (coverage 98-100% on three campaigns of ten). The profile timed the
    host path at 1 to hundreds of sequences, which pins the slope that the run's request log cannot."""
    base = base_model.base if isinstance(base_model, HostTermsModel) else base_model   # its terms are HostTerms
    terms = getattr(base, "terms", None)   # a table's Terms; const:/linear: models have none
    for term in terms if isinstance(terms, list) else []:
        if term.name == "host" and "num_seqs" in term.axes:
            return {"per_seq_ms": "the base tables' host term prices each sequence, profiled over num_seqs"}
    return {}


UNTOLD_TOKEN = ("neither TTFT (light load) nor TPOT (the prefills alongside) rises with prompt tokens: a request "
                "log cannot tell a prompt token's cost from the per-request time")


def untold_terms(fit: _Fit) -> dict:
    """Step terms a request log cannot tell from the per-request time, held at zero. A prompt token's
    cost and the request path's delay fit the calibration run's TTFTs alike where every prompt has one
    length (as `vllm bench`'s random dataset sends by default), but only the first holds up the other
    requests' steps, which TPOT's slope on the prefills alongside shows (PREFILL_SLOPE_KEY). With
    neither slope the search had put 0.0154 ms on each token and 0.04 ms on the request, on a simulated
    vLLM deployment of Qwen3-14B on the H100 tables (1,024-token prompts at 2 req/s; truth: 1.2 ms per
    step, 0.02 per sequence, 12 ms per request, sigma 0.4, 0.3 ms per stream): at 6 req/s TPOT P50 came
    out 10% slow and TTFT P90 24% slow."""
    told = fit.measured(SLOPE_KEY) is not None or fit.measured(PREFILL_SLOPE_KEY) is not None
    return {} if told else {"per_token_ms": UNTOLD_TOKEN}


def _search_all_four(search, two_term: np.ndarray, x_start: np.ndarray, budget: int,
                     names: tuple[str, ...] = TERM_NAMES, informed: np.ndarray | None = None
                     ) -> tuple[np.ndarray, float]:
    """All four step terms (`names`: those not held) searched from two starts, the two-term fit and
    afresh (and from `informed`, where given), then once more from the best (per-sequence and
    per-token terms nudged): `budget` simulations each.

    The loss is a simulation's, so Powell stops short of its floor, and from the two-term fit alone
    it stays in that fit's basin, where the per-request term has taken what the per-token cost of
    prefill chunks explains. That was one quickstart's sarathi fit (0.59 ms per step, no per-sequence
    or per-token term, a skewed front end: loss 0.0023): TTFT P90 22% and 42% fast at 60% and 90%
    load, 10 and 0 of 40 cells in its 90% intervals. Started afresh and restarted (its directions
    reset), the search fell to 0.0003 (0.49 ms per step, 0.020 per sequence, 0.0065 per token; that
    run's step log says 0.43, 0.031, 0.010): 8% and 18% fast, 35 and 40 of 40 cells inside."""
    nudge = _term_vector(per_seq_ms=START, per_token_ms=START)
    starts = [two_term + nudge, x_start, *([] if informed is None else [informed])]
    found = min((search(x, names, budget) for x in starts), key=lambda candidate: candidate[1])
    return min((found, search(found[0] + nudge, names, budget)), key=lambda candidate: candidate[1])


def _shape_scale(fit: _Fit) -> np.ndarray:
    """Units of the shape search: a typical TTFT for the median, 1 for sigma, and that TTFT per typical
    number of active streams for the per-stream term."""
    run = fit.run
    ttft_ms = run.stats.stat("ttft_ms", "p50") or run.stats.stat("tpot_ms", "p50") or 1.0
    return np.array([ttft_ms, 1.0, ttft_ms / max(float(np.mean(_active(fit))), 1.0)])


def _active(fit: _Fit) -> np.ndarray:
    """The streams active at each request's arrival in its own repeat, every repeat's log in its order
    (the load groups hold them, by request id)."""
    return np.concatenate([groups.of_ids(log["request_id"].to_numpy(dtype=np.int64))[1]
                           for log, groups in zip(fit.logs, fit.groups)])


def _fit_shape(fit: _Fit, terms: HostTerms, budget: int) -> tuple[HostTerms, dict]:
    """Search the front end's median, sigma and per-stream term with the step terms held; keep them
    where they cut the loss over OBJECTIVE and FRONT_OBJECTIVE by a quarter against the best constant
    front end (the first search matched the summary statistics only, so its median is searched again
    on this loss before the comparison)."""
    from scipy.optimize import minimize_scalar
    keys = OBJECTIVE + FRONT_OBJECTIVE
    scale = _shape_scale(fit)

    def shaped(z: np.ndarray) -> HostTerms:
        return replace(terms, **{name: float(v) for name, v in zip(SHAPE_TERMS, np.maximum(z, 0.0) * scale)})

    def loss(z: np.ndarray) -> float:
        return fit.loss(shaped(z), keys)
    first = fit.loss(terms, keys)
    best_median = minimize_scalar(lambda m: loss(np.array([m, 0.0, 0.0])), bounds=(0.0, 2.0), method="bounded",
                                  options={"xatol": 1e-3, "maxiter": CONSTANT_BUDGET})
    constant = shaped(np.array([best_median.x, 0.0, 0.0]))
    before = fit.loss(constant, keys)
    data = _shape_start(fit, terms) / scale
    # The data's sigma holds each request's queue as simulated against as measured too, so it comes out
    # high where the queue is long (0.81 for a truth of 0.4 on bench_vllm_calibration's front end, whence
    # the search ended on a per-stream term 3.4 times the truth's); a moderate spread starts it too, and
    # the search starts from whichever of the two fits better (one simulation each).
    starts = [np.clip(z, START, START_MAX) for z in (data, np.array([data[0], SHAPE_START_SIGMA, data[2]]))]
    z0 = min(starts, key=loss)
    z, after = _powell_best(loss, z0, budget - len(starts))
    candidate = shaped(z)
    # A shape that buys the front-end quantiles with the summary statistics is not an explanation of
    # them: the summary loss may not grow by more than the quarter the shape must win.
    summary_holds = fit.loss(candidate) <= (1.0 + MIN_GAIN) * fit.loss(constant) + 1e-12
    # Nor is a shape kept that fits the measured run's sampling noise: below the loss a true model
    # would show from that noise alone (the mean bootstrap variance of the log statistics), there is
    # nothing left to explain.
    noise_floor = fit.noise_floor(keys)
    kept = after < (1.0 - MIN_GAIN) * before and before > noise_floor and summary_holds
    if kept:
        final = candidate
    else:   # the median searched again stays where it also fits the summary statistics better
        final = constant if fit.loss(constant) < fit.loss(terms) else terms
    return final, {"kept": bool(kept), "loss_first": first, "loss_before": before, "loss_after": after,
                   "noise_floor": noise_floor,
                   "errors_before": fit.errors(terms, FRONT_OBJECTIVE),
                   "errors_after": fit.errors(final, FRONT_OBJECTIVE)}


def _shape_start(fit: _Fit, terms: HostTerms) -> np.ndarray:
    """Where the shape search starts: near the answer, from one simulation without a front end. A
    request's measured TTFT minus its simulated one is about its front-end delay; the slope of that
    difference on the streams active at the request's arrival is the per-stream term, and the log of
    what remains gives the median and sigma (its mean and standard deviation). Queueing that the
    delays themselves cause is missed, which the search then corrects."""
    bare = replace(terms, per_request_ms=0.0, per_request_sigma=0.0, per_stream_ms=0.0)
    simulated = fit.simulate(bare).requests.set_index("request_id")["ttft_ms"]
    # every repeat's requests, each against the same simulation and with its own repeat's active streams
    diff_ms = np.concatenate([measured["ttft_ms"].to_numpy() - simulated.reindex(measured["request_id"]).to_numpy()
                              for measured in fit.logs])
    active = _active(fit)
    ok = np.isfinite(diff_ms)
    per_stream = 0.0
    if ok.sum() > 2 and np.var(active[ok]) > 0:
        per_stream = max(float(np.polyfit(active[ok], diff_ms[ok], 1)[0]), 0.0)
    rest = diff_ms - per_stream * active
    positive = ok & (rest > 0)
    if positive.sum() < 2:
        return np.array([max(terms.per_request_ms, 0.0), SHAPE_START_SIGMA, per_stream])
    logs = np.log(rest[positive])
    return np.array([math.exp(float(logs.mean())), float(logs.std()), per_stream])


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


def _step_scale_ms(run: MeasuredRun) -> np.ndarray:
    """Natural units of each term: a typical step, that step per sequence and per token, and TTFT."""
    step_ms = run.stats.stat("tpot_ms", "p50") or 1.0
    ttft_ms = run.stats.stat("ttft_ms", "p50") or step_ms
    steps = run.steps
    if len(steps):
        seqs, tokens = float(steps["num_seqs"].mean()), float(steps["num_tokens"].mean())
    else:
        seqs = tokens = 1.0
    scale = {"per_step_ms": step_ms, "per_seq_ms": step_ms / max(seqs, 1.0), "per_token_ms": step_ms / max(tokens, 1.0),
             "per_request_ms": ttft_ms}
    return np.array([scale[name] for name in TERM_NAMES])


def calibrate_step_model(measured: str | Path, step_model: str, out: str | Path,
                         max_simulations: int = 300, host_defaults: str | None = None,
                         scatter_runs: Sequence[str | Path] = (),
                         scatter_profiles: Sequence[str | Path] = (),
                         history: Sequence = (), step_log: bool = True,
                         retry_hint: str | None = None) -> Calibration:
    """The work of `stepcal calibrate`: fit host terms of `step_model` (re-fitted from its base when it
    has some) on the measured run, and write OUT as a step-model directory: a copy of the tables with
    `host_terms` and a `calibration` record in meta.json (for const: / linear:, a small directory
    naming the model). `host_defaults` names an engine whose published terms start the search;
    `scatter_runs`, more measured runs of the device whose repeats join the run-to-run spread, as does
    `scatter_profiles`, a profile timed in two halves (early, late), and `history`, RunPairs of the
    device's history (experiments.validation.device_history) whose runs may be gone. `step_log`: read
    the step terms off the run's step log where it has one (False: search them on the request log).
    `retry_hint`: what the warning of a slowed repeat suggests (default: measure it again)."""
    import shutil
    import tempfile

    from stepcal.core.io import atomic_output_dir, atomic_write_json
    from stepcal.core.metrics import clean_json
    from stepcal.core.readers import read_json
    from stepcal.experiments.step_models import resolve_step_model
    from stepcal.experiments.validation.measured import load_measured_run, warn_slowed
    from stepcal.experiments.validation.scatter import run_pairs, scatter_run_dirs
    run = load_measured_run(measured)
    more_runs = [run_pairs(r) for r in scatter_run_dirs(scatter_runs, own=measured)] + list(history)
    scatter = scatter_of(run, more_runs, scatter_profiles)  # before the search
    model = resolve_step_model(step_model)
    base = model.base if isinstance(model, HostTermsModel) else model   # re-fit from the base, not on top
    start = None
    if host_defaults is not None:
        from stepcal.experiments.host_defaults import host_defaults as engine_defaults
        start = engine_defaults(host_defaults)
    step_scatter = Scatter(cv=scatter["cv"], rho=scatter["rho"]) if scatter is not None else None
    # after the inputs' checks: a refusal is one line
    warn_slowed(run, "the host terms are fitted to it as measured", retry_hint)
    result = calibrate(run, base, max_simulations=max_simulations, start=start, scatter=step_scatter,
                       step_log=step_log)
    source = Path(step_model)
    with atomic_output_dir(out) as staging:
        if source.is_dir():
            with tempfile.TemporaryDirectory() as tmp:   # copy first: out may be step_model itself
                shutil.copytree(source, Path(tmp) / "t")
                for item in (Path(tmp) / "t").iterdir():
                    shutil.move(str(item), staging / item.name)
            meta = read_json(staging / "meta.json", "the meta.json of a step-model directory")
        else:
            meta = {"kind": "builtin", "step_model": step_model}
        meta["host_terms"] = result.terms.to_dict()
        meta["calibration"] = clean_json({**result.to_dict(), "measured_run": str(measured),
                                          "host_defaults": host_defaults})
        if scatter is not None or result.bias_cv > 0:   # the level the terms left goes with the device's spread
            meta["scatter"] = {**(scatter or {"cv": 0.0, "rho": 0.0, "run_cv": 0.0}), "bias_cv": result.bias_cv}
        atomic_write_json(staging / "meta.json", meta)
    return result


def scatter_of(run: MeasuredRun, scatter_runs: list, scatter_profiles: Sequence = ()) -> dict | None:
    """The scatter block calibrate stores: measured_scatter of the run, its run_cv pooled with the
    repeats of `scatter_runs` (experiments.validation.scatter.RunPairs) and the two halves of
    `scatter_profiles` (early, late), and the run's repeats as model_level_repeats
    (simulator.scatter.Scatter)."""
    from stepcal.core.errors import InputError
    from stepcal.experiments.validation.scatter import measured_scatter, profile_log_ratio
    if (scatter_runs or scatter_profiles) and run.num_repeats < 2:
        flag = "--scatter-runs" if scatter_runs else "--scatter-profiles"
        raise InputError(f"{flag} needs --measured of two or more repeats ({run.path} has one): "
                         "the step-to-step scatter comes from its own repeats")
    ratios = [profile_log_ratio(*scatter_profiles)] if scatter_profiles else []
    block = measured_scatter(run, scatter_runs, ratios)
    if block is not None:   # the calibrated terms are fitted to every repeat: the model carries their speed
        block["model_level_repeats"] = run.num_repeats
    return block
