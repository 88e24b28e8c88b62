"""The bounded Powell search of the host terms, and where it starts.

The search moves a vector of four terms (TERM_NAMES: per step, per sequence and per token of a
step, per request), each in units of its natural size on the measured run (_step_scale_ms), so that
one step size suits all four, inside a box of [0, 2] of those units. Every evaluation is one
deterministic simulation (objective._Fit). That loss is not smooth, so a search returns the best
point it evaluated rather than where Powell stopped (_powell_best), and the step terms are searched
from several starts and once more from the best (_search_all_four). Starts are read off the data
where it tells them: the request path from the light-load arrivals' TTFT beyond the base
(_request_start_ms), a prompt token's and a sequence's cost from the gaps between the measured and
simulated slopes (_slope_gap_ms, _tpot_gap_start), each only where the gap exceeds the measured
slope's noise (GAP_STD_ERRS).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepcal.experiments.calibration.objective import _Fit
from stepcal.experiments.calibration.request_stats import PREFILL_SLOPE_KEY, SLOPE_KEY, TPOT_SLOPE_KEY
from stepcal.experiments.validation.measured import MeasuredRun
from stepcal.simulator.step_model import STEP_TERMS, HostTerms

TERM_NAMES = (*STEP_TERMS, "per_request_ms")   # the first search's vector
START = 0.01       # where a term's search starts, in units of its scale
START_MAX = 1.9    # the highest start, inside the searches' [0, 2] box
GAP_STD_ERRS = 2.0   # a slope gap smaller than this many of the measured slope's standard errors is noise


def _term_vector(**values: float) -> np.ndarray:
    """A search vector (TERM_NAMES order) with the named terms set and the others zero."""
    x = np.zeros(len(TERM_NAMES))
    for name, value in values.items():
        x[TERM_NAMES.index(name)] = value
    return x


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


@dataclass
class _StepSearch:
    """The search space of one fit: vectors in TERM_NAMES order, each term in units of `scale_ms`
    (_step_scale_ms), with some host terms held where they are (`fixed`)."""
    fit: _Fit
    scale_ms: np.ndarray
    fixed: dict   # HostTerms fields the search does not move: a per-prompt-token default, the base's scale

    def terms(self, x: np.ndarray) -> HostTerms:
        """The host terms of the search vector `x` (a coordinate below zero counts as zero)."""
        return HostTerms(**{name: float(v) for name, v in zip(TERM_NAMES, np.maximum(x, 0.0) * self.scale_ms)},
                         **self.fixed)

    def search(self, x0: np.ndarray, names: tuple[str, ...], budget: int, keep: np.ndarray | None = None
               ) -> tuple[np.ndarray, float]:
        """Powell over `names`, the other terms at `keep` (zero by default); the best point it evaluated."""
        free = [TERM_NAMES.index(name) for name in names]

        def full(z):
            x = np.zeros(len(TERM_NAMES)) if keep is None else keep.copy()
            x[free] = np.maximum(z, 0.0)
            return x
        z, loss = _powell_best(lambda z: self.fit.loss(self.terms(full(z))), x0[free], budget)
        return full(z), loss


def _start_vector(space: _StepSearch, start: HostTerms, bare: HostTerms) -> np.ndarray:
    """Where the step search starts: each term of `start` that is set, START for the others; without
    a per-request term in `start`, the one the light-load TTFTs suggest beyond the simulation under
    `bare` (_request_start_ms), kept inside [START, START_MAX]."""
    x_start = np.array([getattr(start, name) / s if getattr(start, name) > 0 else START
                        for name, s in zip(TERM_NAMES, space.scale_ms)])
    if start.per_request_ms == 0:
        i = TERM_NAMES.index("per_request_ms")
        x_start[i] = float(np.clip(_request_start_ms(space.fit, bare) / space.scale_ms[i], START, START_MAX))
    return x_start


def _powell_best(loss, x0: np.ndarray, budget: int) -> tuple[np.ndarray, float]:
    """Bounded Powell on [0, 2] per coordinate from `x0`; the best point it evaluated and its loss.
    Bounded Powell can end on a point worse than one it saw, the loss being a simulation's and not
    smooth: from a start of loss 5.8e-5 (0.52 ms per step, 0.10 per sequence: near a simulated H100
    deployment's truth) one step search saw 1.5e-5 and returned a point of 1.6e-3, and the shape
    search returned points 6-12% above its best on three of six simulated vLLM deployments."""
    from scipy.optimize import minimize  # lazy: loads scipy
    seen = {"loss": math.inf, "x": None}   # Powell evaluates x0 first, so x is always set

    def objective(z):
        value = loss(z)
        if value < seen["loss"]:
            seen.update(loss=value, x=np.array(z, dtype=float))
        return value
    minimize(objective, x0=x0, method="Powell", bounds=[(0.0, 2.0)] * len(x0),
             options={"maxfev": budget, "xtol": 1e-3, "ftol": 1e-4})
    return seen["x"], seen["loss"]


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
