"""The stages of a calibration: which host terms are fitted, in which order, and which are held.

1. The step terms. Where the run has a step log with batch shapes they are read off it
   (step_log_terms) and only the per-request term is searched. Otherwise they are searched on the
   request log (search): per step and per request first (FIRST_TERMS; per token too where TTFT's
   slope shows the base missing a token's cost), then all four, kept only where that cuts the loss
   by a quarter (MIN_GAIN).
2. Held terms. Tables that profile the host path over sequences already price a sequence, better
   than a light-load run can (held_terms); a request log whose TTFT and TPOT do not rise with
   prompt tokens cannot price a token (untold_terms).
3. The base's scale. Host terms only add time, so a base that prices the run too slow is scaled
   down instead, where that fits better (_fit_base_scale).
4. The front end's shape (front_end), and a standard error for every fitted term (uncertainty).
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from stepcal.experiments.calibration.front_end import SHAPE_MIN_BUDGET, SHAPE_TERMS, _fit_shape
from stepcal.experiments.calibration.objective import MIN_GAIN, _Fit, _loss
from stepcal.experiments.calibration.request_stats import PREFILL_SLOPE_KEY, SLOPE_KEY
from stepcal.experiments.calibration.result import Calibration
from stepcal.experiments.calibration.search import (
    TERM_NAMES,
    _search_all_four,
    _slope_gap_ms,
    _start_vector,
    _step_scale_ms,
    _StepSearch,
    _term_vector,
    _tpot_gap_start,
)
from stepcal.experiments.calibration.step_log_terms import BASE_SCALE_BOUNDS, StepLogTerms, step_log_terms
from stepcal.experiments.calibration.uncertainty import _std_errors
from stepcal.experiments.validation.measured import MeasuredRun
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.step_model import STEP_TERMS, HostTerms, HostTermsModel

FIRST_TERMS = ("per_step_ms", "per_request_ms")          # searched first; the others only where they earn it
SCALE_BUDGET = 20  # simulations of the base scale's search (bounded Brent: a 1e-3 bracket in about 15)


def calibrate(run: MeasuredRun, base_model, max_simulations: int = 300, start: HostTerms | None = None,
              uncertainty: bool = True, scatter: Scatter | None = None, step_log: bool = True) -> Calibration:
    """Fit the host terms of `base_model` on `run`. `start` (e.g. an engine's published defaults) is where
    the search starts; its per-prompt-token term is kept as it is (a workload of similar prompts cannot
    tell it from the median). `scatter` (simulator.ranges.Scatter: the device's step scatter, measured
    on the run's repeats) is the noise the uncertainty is sized on; None: a bootstrap of the requests.
    Stage budgets, in simulations: a third of max_simulations for the first two step terms and for
    each of three searches of all four (_search_all_four; four where TPOT's slope gap gives one more
    start, _tpot_gap_start), SCALE_BUDGET + 1 for the base's scale on the
    request log, a third for the front end's shape; plus 2k + 4 (+ NOISE_SEEDS with a scatter) for
    the uncertainty."""
    t0 = time.perf_counter()
    fit = _Fit(run, base_model, scatter if scatter is not None and scatter.cv > 0 else None)
    start = start or HostTerms()
    held = held_terms(base_model)
    from_log = step_log_terms(run, base_model, tuple(held)) if step_log else None
    if from_log is None:
        held |= untold_terms(fit)
    # held as they are: a per-prompt-token default, and the scale the step log gave the base
    fixed = {"per_prompt_token_ms": start.per_prompt_token_ms,
             "base_scale": from_log.base_scale if from_log is not None else 1.0}
    space = _StepSearch(fit, _step_scale_ms(run), fixed)
    none = np.zeros(len(TERM_NAMES))
    terms0 = space.terms(none)
    errors0 = fit.errors(terms0)
    loss0 = _loss(errors0, fit.weights)
    x_start = _start_vector(space, start, terms0)
    third = max_simulations // 3
    if from_log is not None:
        best, loss1, fitted = _from_step_log(space, from_log, x_start, third)
    else:
        best, loss1, fitted = _from_request_log(space, start, terms0, x_start, third, held)
        if loss1 > loss0:   # never return terms worse than none
            best, loss1, fitted = none, loss0, []
    terms = space.terms(best)
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


def _from_step_log(space: _StepSearch, from_log: StepLogTerms, x_start: np.ndarray, budget: int
                   ) -> tuple[np.ndarray, float, list[str]]:
    """The step terms as the step log priced them, and the per-request term searched with them held
    (the front end's search moves it again); the best vector, its loss and the fitted terms."""
    x_log = _term_vector(per_request_ms=x_start[TERM_NAMES.index("per_request_ms")])
    for name, value in from_log.terms.items():
        x_log[TERM_NAMES.index(name)] = value / space.scale_ms[TERM_NAMES.index(name)]
    best, loss = space.search(x_log, ("per_request_ms",), budget, keep=x_log)
    # Their errors are sized as the request search's (_std_errors over them all): the regression's
    # own count the log's scatter about its line, not what the line misses at other loads, and
    # --ranges drawn from them held 103 of 160 of one quickstart's held-out cells (the request
    # search's 135).
    fitted = [*(from_log.terms if from_log.base_scale == 1.0 else ["base_scale"]), "per_request_ms"]
    return best, loss, fitted


def _from_request_log(space: _StepSearch, start: HostTerms, bare: HostTerms, x_start: np.ndarray, budget: int,
                      held: dict) -> tuple[np.ndarray, float, list[str]]:
    """The step terms searched on the request log, those in `held` left at zero; the per-token term
    joins the first search, started at the gap, where TTFT's slope says the base misses a prompt
    token's cost (measured against the simulation under `bare`) and `start` sets none."""
    # Per step and per request first; per sequence and per token only where they earn their place:
    # at a low calibration load most steps hold one or two sequences, so a per-sequence term is
    # nearly a per-step one and the fit cannot tell them apart, and the wrong pick extrapolates
    # badly (one quickstart chose 0.79 ms per sequence instead of per step, and its 90% load came
    # out 3x too slow).
    fit, scale_ms = space.fit, space.scale_ms
    x_start, first = x_start.copy(), FIRST_TERMS
    gap_ms = _slope_gap_ms(fit, bare)
    if gap_ms > 0 and start.per_token_ms == 0:   # a prompt token costs more than the base says
        x_start[TERM_NAMES.index("per_token_ms")] = gap_ms / scale_ms[TERM_NAMES.index("per_token_ms")]
        first = (*FIRST_TERMS, "per_token_ms")
    searched = tuple(name for name in TERM_NAMES if name not in held)
    return _search_step_terms(space.search, x_start, budget, searched, first,
                              lambda x: _tpot_gap_start(fit, space.terms, x, scale_ms))


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


def _fit_base_scale(fit: _Fit, terms: HostTerms, loss: float, fitted: list[str]) -> tuple[HostTerms, float, list[str]]:
    """The base's step times scaled down (base_scale < 1), the step terms at zero and the per-request
    median as fitted (the front end's search moves it again): kept where that fits the run better than
    `terms` (loss `loss`). Host terms only add time, so a base that prices the run too slow kept its
    excess: the quickstart's profiled tables priced all twelve calibration runs of six campaigns 0.2-5.3%
    slow (their step totals), ten of them with every step term under 0.04 ms, and their held-out loads
    as slow. The step terms go to zero with it: at a calibration load a scale and a per-step term move
    the statistics alike, and a base too slow needs no step time added."""
    from scipy.optimize import minimize_scalar  # lazy: loads scipy
    bare = replace(terms, **dict.fromkeys(STEP_TERMS, 0.0))
    result = minimize_scalar(lambda x: fit.loss(replace(bare, base_scale=float(x))), bounds=BASE_SCALE_BOUNDS,
                             method="bounded", options={"xatol": 1e-3, "maxiter": SCALE_BUDGET})
    at_bound = replace(bare, base_scale=BASE_SCALE_BOUNDS[0])
    candidate = min((replace(bare, base_scale=float(result.x)), at_bound), key=fit.loss)
    candidate_loss = fit.loss(candidate)
    if candidate.base_scale < 1.0 and candidate_loss < loss:
        return candidate, candidate_loss, ["base_scale", *(["per_request_ms"] if "per_request_ms" in fitted else [])]
    return terms, loss, fitted


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
