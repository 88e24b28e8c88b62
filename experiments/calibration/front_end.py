"""The front end's shape: how the per-request delay spreads, and its part per active stream.

Once the step terms are fitted, the per-request delay (simulator.frontend) gets a log-normal sigma
and a part per stream active at the request's arrival, and its median is searched again with them.
This search adds to the loss TTFT's quantiles among the requests that arrived at light and at heavy
load and TTFT's slope on the active streams (request_stats.FRONT_OBJECTIVE). The shape stays only
where it cuts that loss by a quarter (MIN_GAIN) against the best constant front end, without buying
the front-end statistics with the summary ones, and only above the loss the measured statistics'
sampling noise alone would give.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from stepcal.experiments.calibration.objective import MIN_GAIN, OBJECTIVE, _Fit
from stepcal.experiments.calibration.request_stats import FRONT_OBJECTIVE
from stepcal.experiments.calibration.search import START, START_MAX, _powell_best
from stepcal.simulator.step_model import HostTerms

SHAPE_TERMS = ("per_request_ms", "per_request_sigma", "per_stream_ms")   # the front end's distribution
SHAPE_START_SIGMA = 0.3   # a moderate spread, where the data cannot suggest one
SHAPE_MIN_BUDGET = 40     # simulations of the shape search, at least: Powell needs a few per line search
CONSTANT_BUDGET = 15      # simulations of the best constant front end the shape must beat


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
    from scipy.optimize import minimize_scalar  # lazy: loads scipy
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
