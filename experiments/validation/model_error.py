"""The step model's own error as `--ranges` replications draw it, from what the fit measured on rows
it held out (meta.json `model_error`, written by costmodel.build).

Each T_step term is priced by one or more fitted targets (TableMeta.term_targets: `linear` by the
GEMM regressor, `decode_attn` by the decode attention one, ...). A replication draws, per term and
per region, one factor held for the whole run (a fitted model is biased, not noisy):

- region `inside`: batches within the measured range of every axis of the term (meta.json
  `axes.measured`), drawn from the `random` split's residuals (points among those fitted);
- region `beyond`: a batch past the largest measured value of an axis, drawn from the `extrapolation`
  split's residuals (the fit trained on the smaller half of the sizes and scored on the larger).

The draw is empirical: the fit stored, per target and split, its held-out rows' log(predicted /
measured) at the quantiles 0, 0.05, ..., 1 (costmodel.evaluation.log_residual_quantiles). One uniform u
per term and region picks the value at quantile u (linear between them), the same u for each of the
term's targets (their errors are taken to move together, which widens rather than narrows), averaged
over them; the term's time is divided by exp(that). Where the residuals are drawn, the tables' spread
of that term is not (it guesses at the same error). Tables fitted before the residuals were stored
say their residuals are not known and are widened by a lognormal of sigma = MAPE x sqrt(pi / 2) (the
normal whose mean absolute value is the MAPE) from `held_out_errors`, on top of the tables' spread; a
term with neither is "not known" and is not drawn.

Residuals of points timed once (a profile's served steps) hold that timing's noise, which the
replications draw apart as the step scatter, and which averages out over a run's many steps. So a
target's residuals are pulled towards their median until their spread (half the 16th-84th percentile
range, a normal's sigma) has lost that noise's variance: timed_once x log(1 + repeat_cv^2) (meta.json
model_error); to the median alone where the noise is all of the spread, and not at all where either
is unknown.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

import numpy as np

from stepcal.core.batch import FEATURE_NAMES
from stepcal.costmodel.table_meta import TableMeta
from stepcal.simulator.step_model import HostTermsModel

REGIONS = {"inside": "random", "beyond": "extrapolation"}   # region -> the held-out split it draws from
MAPE_TO_SIGMA = math.sqrt(math.pi / 2.0) / 100.0             # a MAPE in % -> a normal's sigma
MAPE_ONLY = "residuals not known: widened by the recorded MAPE"
SEED_TAG = 0x686f6c64                                         # the draws' own random stream


@dataclass(frozen=True)
class TermError:
    """What a term's error is drawn from: per region, the residual quantiles of each of its targets
    (`residuals`), or a lognormal's sigma (`sigma`, recorded MAPE only); `columns` and `fitted_max`:
    the feature_row positions of the term's axes and the largest measured value of each."""
    name: str
    targets: tuple[str, ...]
    residuals: dict            # region -> tuple of quantile tuples, one per target
    sigma: dict                # region -> sigma of the log factor (MAPE fallback)
    columns: tuple[int, ...] = ()
    fitted_max: tuple[float, ...] = ()

    @property
    def kind(self) -> str:
        return "held-out residuals" if self.residuals else (MAPE_ONLY if self.sigma else "not known")

    def log_ratio(self, region: str, rng: np.random.Generator) -> float:
        """One draw of log(predicted / measured) in `region` (0.0 where nothing is known)."""
        u, z = float(rng.random()), float(rng.standard_normal())
        held = self.residuals.get(region) or self.residuals.get("inside")
        if held:
            return float(np.mean([_at(u, values) for values in held]))
        sigma = self.sigma.get(region, self.sigma.get("inside"))
        return float(sigma * z) if sigma else 0.0

    def size(self, region: str) -> float | None:
        """Half the 5th-95th percentile range of the log factor in `region` (~1.645 sigma), for the record."""
        held = self.residuals.get(region) or self.residuals.get("inside")
        if held:
            lows, highs = zip(*[(_at(0.05, values), _at(0.95, values)) for values in held])
            return round(float((np.mean(highs) - np.mean(lows)) / 2.0), 4)
        sigma = self.sigma.get(region, self.sigma.get("inside"))
        return round(1.645 * sigma, 4) if sigma else None


@dataclass(frozen=True)
class ModelError:
    """Every T_step term's error (TermError) and the profile's repeat scatter (the median over the
    T_step's targets of costmodel.evaluation.repeat_cv; None: unknown)."""
    terms: tuple[TermError, ...]
    repeat_cv: float | None = None

    @property
    def is_known(self) -> bool:
        return any(t.kind != "not known" for t in self.terms)

    def draw(self, seed: int) -> dict[str, dict[str, float]]:
        """{term: {region: factor on its time}} of one replication (seeded; terms in table order)."""
        rng = np.random.default_rng([seed, SEED_TAG])
        return {t.name: {region: float(np.exp(-t.log_ratio(region, rng))) for region in REGIONS}
                for t in self.terms}

    def record(self) -> dict:
        """What a ranges block says of the model's error: per term, how it is drawn and its size."""
        return {t.name: {"drawn_from": t.kind, "targets": list(t.targets),
                         **{f"log_half_width_{region}": t.size(region) for region in REGIONS}}
                for t in self.terms}


def model_error_of(meta: TableMeta) -> ModelError:
    """The ModelError of tables with this meta.json (no terms for a model without tables)."""
    stored = meta.model_error if isinstance(meta.model_error, dict) else {}
    by_target = stored.get("targets") or {}
    measured = (meta.axes or {}).get("measured") or {}
    terms, repeat_cvs = [], []
    for name, targets in meta.term_targets().items():
        residuals, sigma = {}, {}
        for region, split in REGIONS.items():
            held = [without_timing_noise(by_target[t]["splits"][split]["log_ratio"], by_target[t]) for t in targets
                    if split in (by_target.get(t) or {}).get("splits", {})]
            if held and len(held) == len(targets):
                residuals[region] = tuple(held)
            mapes = [((meta.held_out_errors.get(t) or {}).get(split) or {}).get("mape") for t in targets]
            if targets and all(isinstance(m, (int, float)) for m in mapes):
                sigma[region] = max(mapes) * MAPE_TO_SIGMA
        repeat_cvs += [by_target[t]["repeat_cv"] for t in targets if (by_target.get(t) or {}).get("repeat_cv")]
        columns, highs = _fitted_axes(meta, name, measured)
        terms.append(TermError(name, tuple(targets), residuals, {} if residuals else sigma, columns, highs))
    return ModelError(tuple(terms), float(np.median(repeat_cvs)) if repeat_cvs else None)


def _at(u: float, sorted_values) -> float:
    """The value at quantile u of quantiles stored at 0, 1/(n-1), ..., 1 (linear between them)."""
    return float(np.interp(u, np.linspace(0.0, 1.0, len(sorted_values)), sorted_values))


def without_timing_noise(log_ratio, target: dict) -> tuple[float, ...]:
    """A target's residual quantiles pulled towards their median by the noise of its points timed once
    (module docstring); unchanged where the share or the repeat scatter is unknown."""
    values = np.asarray(log_ratio, dtype=np.float64)
    share, noise_cv = target.get("timed_once"), target.get("repeat_cv")
    if not share or not noise_cv or len(values) < 2:
        return tuple(values.tolist())
    median = _at(0.5, values)
    sigma = (_at(0.8413, values) - _at(0.1587, values)) / 2.0
    noise_var = share * np.log1p(noise_cv ** 2)   # the variance of the log of a timing of that cv
    if sigma <= 0:
        return tuple(values.tolist())
    shrink = np.sqrt(max(1.0 - noise_var / (sigma * sigma), 0.0))
    return tuple((median + (values - median) * shrink).tolist())


def _fitted_axes(meta: TableMeta, name: str, measured: dict) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The feature_row positions of term `name`'s axes that are batch features with measured values,
    and the largest measured value of each (derived axes such as kv_mean are left out)."""
    entry = meta.terms.get(name) if isinstance(meta.terms.get(name), dict) else {}
    columns, highs = [], []
    for axis in entry.get("axes") or ():
        values = measured.get(axis)
        if axis in FEATURE_NAMES and isinstance(values, list) and values:
            columns.append(FEATURE_NAMES.index(axis))
            highs.append(float(max(values)))
    return tuple(columns), tuple(highs)


@dataclass(eq=False)
class DrawnErrorTerm:
    """A T_step term times its drawn error: `inside` within the fitted range of every axis, `beyond`
    past it. Looks up as the term it wraps (evaluate, row_ms); the tables' spread is drawn on top
    only with `keeps_spread` (`biased`)."""
    inner: object
    columns: tuple[int, ...]
    fitted_max: tuple[float, ...]
    inside: float
    beyond: float
    keeps_spread: bool = False

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def axes(self) -> tuple[str, ...]:
        return self.inner.axes

    def evaluate(self, features, which: str = "time_ms") -> np.ndarray:
        values = np.asarray(self.inner.evaluate(features, which), dtype=np.float64)
        past = np.zeros(len(features), dtype=bool)
        for column, high in zip(self.columns, self.fitted_max):
            past |= np.asarray(getattr(features, FEATURE_NAMES[column])) > high
        return values * np.where(past, self.beyond, self.inside)

    def row_ms(self, row: tuple) -> float:
        past = any(row[column] > high for column, high in zip(self.columns, self.fitted_max))
        return self.inner.row_ms(row) * (self.beyond if past else self.inside)

    def biased(self, z: float) -> DrawnErrorTerm:
        """Unmoved where the held-out residuals were drawn: they measure what the tables' spread
        guesses at (the regressor's error), on rows the fit did not see, and drawing both would count
        it twice. A MAPE alone (older tables) says nothing of the error's bias or tail, so there it
        widens the spread rather than replace it."""
        return replace(self, inner=self.inner.biased(z)) if self.keeps_spread else self


def with_model_error(model, error: ModelError | None, seed: int):
    """`model` with each T_step term's error drawn for replication `seed` (under calibrated host terms,
    the tables beneath them); unchanged where nothing is known or the model has no tables."""
    if error is None or not error.is_known:
        return model
    if isinstance(model, HostTermsModel):
        return HostTermsModel(with_model_error(model.base, error, seed), model.terms, model.uncertainty)
    terms = getattr(model, "terms", None)
    if not isinstance(terms, list):
        return model
    factors = error.draw(seed)
    known = {t.name: t for t in error.terms if t.kind != "not known"}
    drawn = copy.copy(model)
    drawn.terms = [DrawnErrorTerm(term, known[term.name].columns, known[term.name].fitted_max,
                                  factors[term.name]["inside"], factors[term.name]["beyond"],
                                  keeps_spread=known[term.name].kind == MAPE_ONLY)
                   if term.name in known else term for term in terms]
    return drawn
