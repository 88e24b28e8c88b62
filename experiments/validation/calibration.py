"""Calibration: fit the host terms that kernel profiles miss, from one measured run's request log.

The terms (per step, per sequence, per token of a step; per request for the request path) are
found by simulating the measured workload with the base step model plus the terms and matching
the measured TTFT, TPOT and E2E distributions: a bounded Powell search over four numbers, each
evaluation one deterministic simulation.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from experiments.validation.errors import stat_error
from experiments.validation.measured import MeasuredRun, sim_config_for
from simulator.measured_run import RunStats
from simulator.step_model import HostTerms, HostTermsModel

# (metric, statistic) pairs the fit matches; P99 is left out on purpose: it is what we validate.
OBJECTIVE = (("ttft_ms", "mean"), ("ttft_ms", "p50"), ("ttft_ms", "p90"),
             ("tpot_ms", "mean"), ("tpot_ms", "p50"), ("tpot_ms", "p90"),
             ("e2e_ms", "p50"), ("e2e_ms", "p90"))
TERM_NAMES = tuple(f.name for f in fields(HostTerms))    # the search vector's order
FIRST_TERMS = ("per_step_ms", "per_request_ms")          # searched first; the others only where they earn it
START = 0.01       # where a term's search starts, in units of its scale
MIN_GAIN = 0.25    # per-sequence and per-token terms must cut the loss by a quarter to be kept

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

    def to_dict(self) -> dict:
        """The `calibration` record of meta.json (errors keyed "metric.stat")."""
        return {"host_terms": self.terms.to_dict(), "loss_before": self.loss_before, "loss_after": self.loss_after,
                "errors_before": _keyed(self.errors_before), "errors_after": _keyed(self.errors_after),
                "num_simulations": self.num_simulations, "wall_s": self.wall_s,
                "objective": [f"{m}.{s}" for m, s in OBJECTIVE]}


def _keyed(errors: Errors) -> dict:
    return {f"{metric}.{stat}": error for (metric, stat), error in errors.items()}


def _errors(run: MeasuredRun, summary: dict) -> Errors:
    simulated = RunStats.from_summary(summary)
    return {(m, s): stat_error(simulated, run.stats, m, s) for m, s in OBJECTIVE}


def _loss(errors: Errors) -> float:
    """Mean squared log-ratio of simulated to measured: symmetric in over- and under-prediction."""
    terms = [math.log1p(e) ** 2 for e in errors.values() if e is not None and e > -1]
    return float(np.mean(terms)) if terms else math.inf


def _term_vector(**values: float) -> np.ndarray:
    """A search vector (TERM_NAMES order) with the named terms set and the others zero."""
    x = np.zeros(len(TERM_NAMES))
    for name, value in values.items():
        x[TERM_NAMES.index(name)] = value
    return x


def _host_terms(x: np.ndarray, scale: np.ndarray) -> HostTerms:
    return HostTerms(**{name: float(v) for name, v in zip(TERM_NAMES, x * scale)})


def calibrate(run: MeasuredRun, base_model, max_simulations: int = 300) -> Calibration:
    from scipy.optimize import minimize

    from simulator.simulation import simulate
    t0 = time.perf_counter()
    count = 0
    scale = _step_scale_ms(run)

    def evaluate(x: np.ndarray) -> tuple[float, Errors]:
        nonlocal count
        count += 1
        terms = _host_terms(np.maximum(x, 0.0), scale)
        model = HostTermsModel(base_model, terms)
        summary = simulate(run.trace, model, sim_config_for(run, 0.0, terms.per_request_ms)).summary
        errors = _errors(run, summary)
        return _loss(errors), errors

    def search(x0: np.ndarray, names: tuple[str, ...], budget: int) -> tuple[np.ndarray, float, Errors]:
        free = [TERM_NAMES.index(name) for name in names]

        def full(z):
            x = np.zeros(len(TERM_NAMES))
            x[free] = z
            return x
        result = minimize(lambda z: evaluate(full(z))[0], x0=x0[free], method="Powell",
                          bounds=[(0.0, 2.0)] * len(free), options={"maxfev": budget, "xtol": 1e-3, "ftol": 1e-4})
        best = full(np.maximum(result.x, 0.0))
        return (best, *evaluate(best))

    none = np.zeros(len(TERM_NAMES))
    loss0, errors0 = evaluate(none)
    # The terms are in units of a typical measured step, so that one step size suits all four.
    # Per step and per request first; per sequence and per token only where they earn their place:
    # at a low calibration load most steps hold one or two sequences, so a per-sequence term is
    # nearly a per-step one and the fit cannot tell them apart, and the wrong pick extrapolates
    # badly (one quickstart chose 0.79 ms per sequence instead of per step, and its 90% load came
    # out 3x too slow).
    best, loss1, errors1 = search(np.full(len(TERM_NAMES), START), FIRST_TERMS, max_simulations // 3)
    if loss1 > 0:
        x4, loss4, errors4 = search(best + _term_vector(per_seq_ms=START, per_token_ms=START), TERM_NAMES,
                                    max_simulations - max_simulations // 3)
        if loss4 < (1.0 - MIN_GAIN) * loss1:
            best, loss1, errors1 = x4, loss4, errors4
    if loss1 > loss0:   # never return terms worse than none
        best, loss1, errors1 = none, loss0, errors0
    return Calibration(_host_terms(best, scale), loss0, loss1, errors0, errors1, count, time.perf_counter() - t0)


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
                         max_simulations: int = 300) -> Calibration:
    """The work of `stepcal calibrate`: fit host terms of `step_model` (re-fitted from its base when it
    has some) on the measured run, and write OUT as a step-model directory: a copy of the tables with
    `host_terms` and a `calibration` record in meta.json (for const: / linear:, a small directory
    naming the model)."""
    import shutil
    import tempfile

    from experiments.step_models import resolve_step_model
    from experiments.validation.measured import load_measured_run
    from simulator.io import atomic_output_dir, atomic_write_json
    from simulator.metrics import clean_json
    from simulator.readers import read_json

    run = load_measured_run(measured)
    model = resolve_step_model(step_model)
    base = model.base if isinstance(model, HostTermsModel) else model   # re-fit from the base, not on top
    result = calibrate(run, base, max_simulations=max_simulations)
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
        meta["calibration"] = clean_json({**result.to_dict(), "measured_run": str(measured)})
        atomic_write_json(staging / "meta.json", meta)
    return result
