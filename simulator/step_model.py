"""StepTimeModel: a step batch in, milliseconds out; and the built-in what-if models."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from stepcal.core.batch import StepBatch, StepFeatures, feature_row
from stepcal.core.errors import InputError
from stepcal.simulator.frontend import FrontEnd


@runtime_checkable
class StepTimeModel(Protocol):
    def step_ms(self, batch: StepBatch) -> float: ...

    def decode_run_ms(self, kv_lens: np.ndarray, num_steps: int) -> np.ndarray: ...


class FeatureStepModel:
    """Base for models that read only the batch features.

    Both the one-step and the decode-run paths go through `features_ms`, so that the
    simulator's fast path gives bit-identical step times to its step-by-step path.
    """

    def features_ms(self, features: StepFeatures) -> np.ndarray:
        raise NotImplementedError

    def step_ms(self, batch: StepBatch) -> float:
        return self.row_ms(feature_row(batch.q_lens, batch.kv_lens))

    def row_ms(self, row: tuple) -> float:
        """One batch from its feature_row() tuple. Models may override this with plain float
        arithmetic, provided it gives the same bits as features_ms."""
        return float(self.features_ms(StepFeatures.from_row(row))[0])

    def decode_run_ms(self, kv_lens: np.ndarray, num_steps: int) -> np.ndarray:
        return self.features_ms(StepFeatures.decode_run(np.asarray(kv_lens), num_steps))


@dataclass(frozen=True)
class ConstStepModel(FeatureStepModel):
    step_time_ms: float

    def features_ms(self, features: StepFeatures) -> np.ndarray:
        return np.full(len(features), float(self.step_time_ms))

    def row_ms(self, row: tuple) -> float:
        return float(self.step_time_ms)

    def describe(self) -> str:
        return f"const:{self.step_time_ms:g}"


@dataclass(frozen=True)
class LinearStepModel(FeatureStepModel):
    """step_ms = A + B·num_tokens + C·Σ(s_i + q_i)."""
    base_ms: float
    per_token_ms: float
    per_context_token_ms: float

    def features_ms(self, features: StepFeatures) -> np.ndarray:
        context = features.kv_sum + features.num_tokens
        return self.base_ms + self.per_token_ms * features.num_tokens + self.per_context_token_ms * context

    def row_ms(self, row: tuple) -> float:
        # the same operations in the same order as features_ms: identical bits, no numpy call
        num_tokens, kv_sum = float(row[1]), float(row[7])
        return self.base_ms + self.per_token_ms * num_tokens + self.per_context_token_ms * (kv_sum + num_tokens)

    def describe(self) -> str:
        return f"linear:{self.base_ms:g},{self.per_token_ms:g},{self.per_context_token_ms:g}"


def parse_builtin_step_model(spec: str, label: str = "--step-model") -> FeatureStepModel | None:
    """`const:MS` or `linear:A,B,C`; None when spec names neither (e.g. a table directory).
    `label` names where the spec came from in error messages (a flag, or a config file's key)."""
    kind, _, args = spec.partition(":")
    if kind not in ("const", "linear") or not _:
        return None
    try:
        values = [float(x) for x in args.split(",")]
    except ValueError:
        raise InputError(f"{label} {spec!r}: values must be numbers") from None
    if not all(math.isfinite(v) for v in values):
        raise InputError(f"{label} {spec!r}: values must be finite numbers")
    if kind == "const":
        if len(values) != 1 or values[0] <= 0:
            raise InputError(f"{label} {spec!r}: expected const:MS with MS > 0")
        return ConstStepModel(values[0])
    if len(values) != 3 or min(values) < 0 or sum(values) <= 0:
        raise InputError(f"{label} {spec!r}: expected linear:A,B,C with non-negative A,B,C")
    return LinearStepModel(*values)


STEP_TERMS = ("per_step_ms", "per_seq_ms", "per_token_ms")   # the host terms added to each step's time


@dataclass(frozen=True)
class HostTerms:
    """Engine host work that kernel profiles miss, in ms: per step, per sequence, per token of a step;
    and the request path before the scheduler sees a request (HTTP, tokenisation: TTFT and E2E only),
    simulator.frontend.FrontEnd: per request (a log-normal's median, and its sigma), per prompt token,
    and per stream active at the request's arrival. A meta.json with only the first four keys (before
    the front end was a distribution) is the constant case.

    `base_scale` multiplies the base model's step times before the terms are added: the one correction
    downwards a calibration has, for a base that prices the run too slow (a kernel profile taken at
    another clock, or in a slower moment of a shared machine). Host terms only add time. 1 (the
    default, and what a meta.json without the key means): the base as it is."""
    per_step_ms: float = 0.0
    per_seq_ms: float = 0.0
    per_token_ms: float = 0.0
    per_request_ms: float = 0.0
    per_request_sigma: float = 0.0
    per_prompt_token_ms: float = 0.0
    per_stream_ms: float = 0.0
    base_scale: float = 1.0

    # the fields that correct a calibration's base rather than price the engine (no engine default has them)
    BASE_FIELDS = ("base_scale",)

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InputError(f"host_terms: {name} must be a finite number >= 0, got {value!r}")
        if not self.base_scale > 0:
            raise InputError(f"host_terms: base_scale must be > 0, got {self.base_scale!r}")

    @classmethod
    def from_dict(cls, data: dict | None) -> HostTerms:
        data = data or {}
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise InputError(f"host_terms: unknown keys {sorted(unknown)}")
        return cls(**{k: float(v) for k, v in data.items()})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def engine_names(cls) -> set[str]:
        """The terms an engine's published defaults give (experiments/data/serving_defaults.json)."""
        return set(cls.__dataclass_fields__) - set(cls.BASE_FIELDS)

    @property
    def front_end(self) -> FrontEnd:
        return FrontEnd(self.per_request_ms, self.per_request_sigma, self.per_prompt_token_ms, self.per_stream_ms)


@dataclass(frozen=True)
class TermUncertainty:
    """How sure a calibration is of its host terms: their covariance (ms^2), from the fit's sandwich
    estimate (experiments.calibration). `--ranges` draws the terms from it, one draw per
    replication, as it draws the tables' spread; the terms trade off (per step against per sequence),
    so the covariance, not the standard errors alone, is what keeps the draws as sure as the fit."""
    names: tuple[str, ...]
    covariance: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        matrix = np.asarray(self.covariance, dtype=np.float64)
        fields = HostTerms.__dataclass_fields__
        if matrix.shape != (len(self.names), len(self.names)) or not np.all(np.isfinite(matrix)):
            raise InputError(f"host term covariance: expected a finite {len(self.names)}x{len(self.names)} matrix")
        if any(name not in fields for name in self.names):
            raise InputError(f"host term covariance: unknown terms {sorted(set(self.names) - set(fields))}")

    @classmethod
    def from_std_err(cls, std_err: dict) -> TermUncertainty:
        """Independent terms (a calibration that stored standard errors only); None errors left out."""
        names = tuple(name for name, se in std_err.items() if se is not None)
        return cls(names, tuple(tuple(float(std_err[a]) ** 2 if a == b else 0.0 for b in names) for a in names))

    def draw(self, z: np.ndarray) -> dict[str, float]:
        """Each term's error for standard normal z (one per name): L z with L L' the covariance
        (Cholesky: the first term moves with the first z alone; a singular covariance by its
        eigenvectors instead)."""
        matrix = np.asarray(self.covariance, dtype=np.float64)
        matrix = (matrix + matrix.T) / 2.0
        try:
            root = np.linalg.cholesky(matrix)
        except np.linalg.LinAlgError:
            values, vectors = np.linalg.eigh(matrix)
            root = vectors * np.sqrt(np.clip(values, 0.0, None))
        return dict(zip(self.names, (root @ np.asarray(z, dtype=np.float64)).tolist()))


class HostTermsModel(FeatureStepModel):
    """A base model plus calibrated host terms. The request path is not step time: the simulator
    delays each request's entry into the scheduler by it (`front_end`, see SimConfig.front_end).
    `uncertainty`, when the calibration measured it, is what `--ranges` draws the terms from."""

    def __init__(self, base, terms: HostTerms, uncertainty: TermUncertainty | None = None) -> None:
        self.base, self.terms, self.uncertainty = base, terms, uncertainty

    @property
    def per_request_ms(self) -> float:
        return self.terms.per_request_ms

    @property
    def front_end(self) -> FrontEnd:
        return self.terms.front_end

    def _extra(self, num_seqs, num_tokens):
        t = self.terms
        return t.per_step_ms + t.per_seq_ms * num_seqs + t.per_token_ms * num_tokens

    def _with_host(self, base_ms, num_seqs, num_tokens):
        return base_ms * self.terms.base_scale + self._extra(num_seqs, num_tokens)

    def features_ms(self, features: StepFeatures) -> np.ndarray:
        return self._with_host(self.base.features_ms(features), features.num_seqs, features.num_tokens)

    def row_ms(self, row: tuple) -> float:
        return self._with_host(self.base.row_ms(row), float(row[0]), float(row[1]))

    def step_ms(self, batch: StepBatch) -> float:
        if isinstance(self.base, FeatureStepModel):
            return self.row_ms(feature_row(batch.q_lens, batch.kv_lens))
        return self._with_host(float(self.base.step_ms(batch)), float(batch.num_seqs), float(batch.num_tokens))

    def decode_run_ms(self, kv_lens: np.ndarray, num_steps: int) -> np.ndarray:
        if isinstance(self.base, FeatureStepModel):
            return super().decode_run_ms(kv_lens, num_steps)
        b = float(len(kv_lens))
        return self._with_host(np.asarray(self.base.decode_run_ms(kv_lens, num_steps)), b, b)

    def describe(self) -> str:
        base = self.base.describe() if hasattr(self.base, "describe") else type(self.base).__name__
        return f"{base} + host terms {self.terms.to_dict()}"


class DrawnHostTermsModel(HostTermsModel):
    """One `--ranges` replication of a calibrated model: its host terms moved by one draw from their
    covariance (simulator.ranges). The step terms move jointly and each may go below zero: a fit at
    one load trades per-step time against per-sequence time, and clipping each term at zero would
    break that trade and push every draw up. Only the step's total is held up, at STEP_FLOOR of its
    undrawn time (as the scatter's factors are). The request path's terms are clipped at zero in
    `terms`: each is a delay or a spread of its own."""
    STEP_FLOOR = 0.05

    def __init__(self, model: HostTermsModel, terms: HostTerms, step_shift_ms: tuple[float, float, float]) -> None:
        super().__init__(model.base, terms, model.uncertainty)
        self.step_shift_ms = step_shift_ms     # added (per step, per sequence, per token), any sign

    def _with_host(self, base_ms, num_seqs, num_tokens):
        undrawn = base_ms * self.terms.base_scale + self._extra(num_seqs, num_tokens)
        per_step, per_seq, per_token = self.step_shift_ms
        drawn = undrawn + per_step + per_seq * num_seqs + per_token * num_tokens
        return np.maximum(drawn, self.STEP_FLOOR * undrawn)


class ScaledStepModel(FeatureStepModel):
    """A base model's step times times a constant factor. Validation uses it to ask how much of an
    error is step time: rescaled so its total matches a measured run's total step time, whatever
    error is left comes from queueing, scheduling and KV capacity."""

    def __init__(self, base: FeatureStepModel, factor: float) -> None:
        if not isinstance(base, FeatureStepModel):
            raise TypeError(f"ScaledStepModel needs a FeatureStepModel base, got {type(base).__name__}")
        if not factor > 0:
            raise ValueError(f"scale factor must be positive, got {factor}")
        self.base, self.factor = base, float(factor)

    @property
    def per_request_ms(self) -> float:
        return float(getattr(self.base, "per_request_ms", 0.0))

    @property
    def front_end(self) -> FrontEnd:
        return getattr(self.base, "front_end", FrontEnd())

    def features_ms(self, features: StepFeatures) -> np.ndarray:
        return self.factor * self.base.features_ms(features)

    def row_ms(self, row: tuple) -> float:
        return self.factor * self.base.row_ms(row)

    def describe(self) -> str:
        base = self.base.describe() if hasattr(self.base, "describe") else type(self.base).__name__
        return f"{base} x {self.factor:.4g}"
