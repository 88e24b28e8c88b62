"""Predictions with ranges: replications of a simulation that each draw

- the cost model's error: per T_step term one standard normal z, held for the whole run (a fitted
  model is biased, not noisy): the term's grid moves to time + z x its spread (the tables' own
  spread of the regressor's trees; `Term.biased`), never below zero as terms are; and the calibrated
  host terms (`stepcal calibrate`), jointly from the covariance of their fit (TermUncertainty);
- the front end's per-request delays (simulator.frontend), when they are a distribution;
- the device's step-to-step scatter (scatter.Scatter): each step's time times (1 + e_k), e an AR(1)
  series with coefficient of variation `cv` and lag-one autocorrelation `rho`, indexed by the replica's step
  number, so that decode runs and step-by-step simulation draw the same factors;
- the device's speed over a whole run: every step of a replica times one log-normal level of mean
  one and coefficient of variation `run_cv` (a shared machine runs the same workload 5-30% faster
  or slower from one run to the next: the measured repeats' difference in total step time). Two
  things widen it, both exact for normal log levels:
  - `run_cv_pairs` > 0: run_cv is an estimate from that many pairs of runs (a chi-square of as many
    degrees of freedom; three pairs are off by up to 2x either way), so the level's z is drawn from
    Student's t with run_cv_pairs degrees of freedom, the predictive law of a new run's level (asked
    for by --scatter-run-cv-pairs: with three pairs it over-covers where run_cv came out right);
  - `model_level_repeats` > 0: the model's own level was fitted to a run of that many repeats
    (`stepcal calibrate`), so it carries that run's speed: a new run differs from it by
    run_cv x sqrt(1 + 1 / model_level_repeats);
  - `bias_cv` > 0: the level error the calibration could not remove (host terms only add time, so
    tables that price the calibration run too high keep the excess), added in quadrature.

`replicate` runs them (seeded: replication i uses seed + i) and `ranges_block` turns their summaries
into the `ranges` block of summary.json: for every number in the summary, the median over the
replications and the 5th and 95th percentiles (a 90% interval).
"""
from __future__ import annotations

import copy
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from functools import partial

import numpy as np

from stepcal.simulator.simulation import Simulation
from stepcal.simulator.step_model import STEP_TERMS, DrawnHostTermsModel, HostTermsModel

INTERVAL = (5.0, 95.0)   # percentiles of the replications: a 90% interval


HOST = "host:"   # drawn host terms are named host:<term> (host:per_step_ms), after the tables' terms


def term_names(model) -> list[str]:
    """The terms a model's error can be drawn for: the T_step terms with a spread, then the calibrated
    host terms with an uncertainty ([] for const:/linear: models, which have neither)."""
    base = model.base if isinstance(model, HostTermsModel) else model
    terms = getattr(base, "terms", None)
    names = [t.name for t in terms] if isinstance(terms, list) else []
    uncertainty = getattr(model, "uncertainty", None) if isinstance(model, HostTermsModel) else None
    return names + ([HOST + name for name in uncertainty.names] if uncertainty is not None else [])


def with_bias(model, z_by_term: dict[str, float], spread_scale: float = 1.0):
    """The model with its terms' error drawn (z x spread x spread_scale); calibrated host terms drawn
    from their covariance when the calibration measured it (_drawn_host_terms), else kept."""
    if isinstance(model, HostTermsModel):
        base = HostTermsModel(with_bias(model.base, z_by_term, spread_scale), model.terms, model.uncertainty)
        return _drawn_host_terms(base, z_by_term, spread_scale)
    if not term_names(model) or spread_scale == 0.0 or not any(z_by_term.values()):
        return model
    # Each term moves its own grid (Term.biased): the copy keeps the tables' fast one-step path.
    drawn = copy.copy(model)
    drawn.terms = [term.biased(z_by_term.get(term.name, 0.0) * spread_scale) for term in model.terms]
    return drawn


def _drawn_host_terms(model: HostTermsModel, z_by_term: dict[str, float], spread_scale: float) -> HostTermsModel:
    """The model with its host terms drawn: the step terms as a shift of any sign (the step's total is
    held up; DrawnHostTermsModel), the request path's terms clipped at zero."""
    uncertainty = model.uncertainty
    if uncertainty is None or spread_scale == 0.0:
        return model
    delta = uncertainty.draw(np.array([z_by_term.get(HOST + name, 0.0) for name in uncertainty.names]))
    delta = {name: spread_scale * d for name, d in delta.items()}
    front = {name: max(getattr(model.terms, name) + d, 0.0) for name, d in delta.items()
             if name not in STEP_TERMS and name != "base_scale"}
    # the base's scale moves with its error, held up as the step's total is
    base_scale = model.terms.base_scale
    front["base_scale"] = max(base_scale + delta.get("base_scale", 0.0), DrawnHostTermsModel.STEP_FLOOR * base_scale)
    shift = tuple(delta.get(name, 0.0) for name in STEP_TERMS)
    return DrawnHostTermsModel(model, replace(model.terms, **front), shift)


def draw_bias(model, seed: int) -> dict[str, float]:
    """One replication's z per term (standard normal, from the seed)."""
    rng = np.random.default_rng([seed, 0x62696173])
    return {name: float(rng.standard_normal()) for name in term_names(model)}


def ranges_block(summaries: list[dict]) -> dict:
    """{key: {"median", "low", "high"}} for every number of the summaries (nested dicts kept nested),
    over the replications; None where a replication has no value."""
    def walk(values: list):
        first = values[0]
        if isinstance(first, dict):
            return {key: walk([v.get(key) if isinstance(v, dict) else None for v in values])
                    for key in first if _is_numeric_tree(first[key])}
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) < len(values) or not numbers:
            return None
        low, median, high = np.percentile(np.asarray(numbers, dtype=np.float64), [INTERVAL[0], 50.0, INTERVAL[1]])
        return {"median": float(median), "low": float(low), "high": float(high)}
    return walk(summaries)


def _is_numeric_tree(value) -> bool:
    if isinstance(value, dict):
        return any(_is_numeric_tree(v) for v in value.values())
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value is None


def replicate(trace, model, config, num_replications: int, seed: int = 0, spread_scale: float = 1.0,
              workers: int = 1) -> list[dict]:
    """The summaries of num_replications simulations of `trace`, replication i drawing the model's
    error and the scatter (config.scatter) from seed + i; `workers` > 1 runs them in a process pool
    (the same summaries, in the same order)."""
    run = partial(_summary, trace, model, config, spread_scale=spread_scale)
    seeds = replication_seeds(num_replications, seed)
    if workers <= 1 or num_replications <= 1:
        return [run(s) for s in seeds]
    with ProcessPoolExecutor(max_workers=min(workers, num_replications)) as pool:
        return list(pool.map(run, seeds))


def replication_seeds(num_replications: int, seed: int) -> list[int]:
    """Replication i uses seed + i."""
    return [seed + i for i in range(num_replications)]


def run_replication(trace, model, config, seed: int, spread_scale: float = 1.0):
    """One replication (a SimResult): the model's error, the scatter and the front end drawn from `seed`."""

    drawn = with_bias(model, draw_bias(model, seed), spread_scale)
    config = replace(config, scatter_seed=seed, front_end_seed=seed, record_batches=False)
    return Simulation(trace, drawn, config).run()


def _summary(trace, model, config, seed: int, spread_scale: float) -> dict:
    return run_replication(trace, model, config, seed, spread_scale).summary
