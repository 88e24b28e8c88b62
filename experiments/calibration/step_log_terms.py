"""Step terms read off a measured run's step log: what each logged step took beyond the base tables'
price, regressed on the step's shape (a constant, its sequences, its tokens).

A request log sees the step terms only through latencies that also hold queueing and the front end,
and at a light calibration load it cannot tell a step's cost from a token's. Over the 60 held-out
runs of 15 CPU campaigns (calibrated at 30% load, checked at 60% and 90%), the request search's terms
priced the engine's decode-only steps at a median measured/predicted of 0.88 (0.63-1.03; within 7%
in 17 runs) and its prefill steps at 1.04: the per-step term took what belongs to prefill tokens.
The step log times every batch the engine ran, from one token to thousands; its terms priced decode
steps at 0.99 (0.91-1.04; within 7% in 54 runs) and prefill steps at 1.01. The request search stays
for runs without a log (an imported `vllm bench` run: calibration.search).

Terms only add time. Where the base prices the log too high even with them (the regression's constant
would go below zero), the base's times are scaled down instead, to the log's total (at most by half,
BASE_SCALE_BOUNDS, which the request search keeps too), and no step term is added.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepcal.experiments.validation.measured import MeasuredRun
from stepcal.experiments.validation.steps import predict_steps
from stepcal.simulator.step_model import STEP_TERMS

MIN_STEPS = 50          # fewer logged steps than this: no regression, the request search prices the terms
NEEDED = ("duration_ms", "num_seqs", "num_tokens", "request_ids", "q_lens", "kv_lens")   # a batch's shape, priceable
BLOCK_STEPS = 50        # consecutive steps share a cluster of the standard errors (the device's scatter is AR(1))
COLUMNS = STEP_TERMS
BASE_SCALE_BOUNDS = (0.5, 1.0)   # the base's step times may be scaled down by up to half, never up


@dataclass(frozen=True)
class StepLogTerms:
    terms: dict             # name -> ms, >= 0 (non-negative least squares)
    std_err: dict           # name -> ms, cluster-robust (None for a term held at zero by its bound)
    num_steps: int
    total_error_before: float   # base tables' total / measured total - 1, on the log
    total_error_after: float    # with the terms
    base_scale: float = 1.0     # < 1: the base priced the log too high, scaled to its total, terms zero
    base_scale_std_err: float | None = None

    def to_dict(self) -> dict:
        method = (f"non-negative least squares of each logged step's measured minus base time on "
                  f"{', '.join(self.terms)}; standard errors clustered over blocks of {BLOCK_STEPS} consecutive steps")
        if self.base_scale < 1.0:
            method = ("the base priced the log too high with the terms at zero: its times scaled to the log's "
                      f"total; standard error clustered over blocks of {BLOCK_STEPS} consecutive steps")
        return {"terms": self.terms, "std_err": self.std_err, "num_steps": self.num_steps,
                "total_error_before": self.total_error_before, "total_error_after": self.total_error_after,
                "base_scale": self.base_scale, "base_scale_std_err": self.base_scale_std_err, "method": method}


def step_log_terms(run: MeasuredRun, base_model, held: tuple[str, ...] = ()) -> StepLogTerms | None:
    """The step terms of `base_model` on `run`'s step log (every repeat's); `held`: terms left at zero.
    None where the run logged fewer than MIN_STEPS steps, or no batch shapes (a log of times alone)."""
    from scipy.optimize import nnls  # lazy: loads scipy
    steps = run.steps
    if len(steps) < MIN_STEPS or any(column not in steps for column in NEEDED):
        return None
    names = [name for name in COLUMNS if name not in held]
    measured = steps["duration_ms"].to_numpy(dtype=np.float64)
    base = predict_steps(base_model, steps)
    features = {"per_step_ms": np.ones(len(steps)), "per_seq_ms": steps["num_seqs"].to_numpy(dtype=np.float64),
                "per_token_ms": steps["num_tokens"].to_numpy(dtype=np.float64)}
    design = np.column_stack([features[name] for name in names])
    coef, _ = nnls(design, measured - base)
    predicted = base + design @ coef
    if predicted.sum() > measured.sum() * (1.0 + 1e-9):   # no term is below zero: the base itself is too slow
        return _scaled(steps, measured, base, names)
    inside = coef > 0
    covariance = _cluster_covariance(design[:, inside], measured - predicted, _clusters(steps))
    std_err = dict.fromkeys(names)
    for j, name in enumerate(np.asarray(names)[inside]):
        std_err[name] = float(np.sqrt(max(covariance[j, j], 0.0)))
    return StepLogTerms({name: float(c) for name, c in zip(names, coef)}, std_err, len(steps),
                        float(base.sum() / measured.sum() - 1.0), float(predicted.sum() / measured.sum() - 1.0))


def _scaled(steps, measured: np.ndarray, base: np.ndarray, names: list[str]) -> StepLogTerms:
    """The base's times scaled to the log's total, within BASE_SCALE_BOUNDS, the terms at zero; the
    scale's standard error that of a ratio of totals, its residuals summed over each cluster."""
    scale = float(np.clip(measured.sum() / base.sum(), *BASE_SCALE_BOUNDS))
    residual_sums = np.bincount(_clusters(steps), weights=measured - scale * base)
    std_err = float(np.sqrt(np.sum(residual_sums ** 2)) / base.sum())
    return StepLogTerms(dict.fromkeys(names, 0.0), dict.fromkeys(names), len(steps), float(base.sum() / measured.sum() - 1.0),
                        float(scale * base.sum() / measured.sum() - 1.0), scale, std_err)


def _clusters(steps) -> np.ndarray:
    """A cluster label per step: blocks of BLOCK_STEPS consecutive steps of one repeat and replica."""
    keys = [steps[c] for c in ("repeat", "replica") if c in steps] or [np.zeros(len(steps), dtype=int)]
    block = steps.groupby(keys, sort=False).cumcount() // BLOCK_STEPS
    return steps.groupby([*keys, block], sort=False).ngroup().to_numpy()


def _cluster_covariance(design: np.ndarray, residual: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """(X'X)^-1 (sum over clusters of X_c' r_c r_c' X_c) (X'X)^-1: residuals of neighbouring steps move
    together (the device's speed drifts, a prefill slows the steps after it), which the plain sandwich
    would count as independent and so under-state."""
    if design.shape[1] == 0:
        return np.zeros((0, 0))
    bread = np.linalg.pinv(design.T @ design)
    scores = np.zeros((clusters.max() + 1, design.shape[1]))
    np.add.at(scores, clusters, design * residual[:, None])
    return bread @ (scores.T @ scores) @ bread
