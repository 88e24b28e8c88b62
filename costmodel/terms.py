"""The kinds of T_step term: each owns its grid, how it is written (its Parquet layout and its
meta.json entry) and how it is looked up, on StepFeatures (vectorised) and on one
core.batch.feature_row() tuple (plain floats, the simulator's one-step path: the same
operations in the same order, so the same bits).

TERM_KINDS names the kind of every term a table directory may hold. Composition
(costmodel.compose) and the whole-step fit make terms; costmodel.tables loads them. Kept apart
from the estimators so that loading tables never imports scikit-learn.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from stepcal.core.batch import FEATURE_NAMES, StepFeatures
from stepcal.core.errors import InputError
from stepcal.core.io import atomic_write_parquet
from stepcal.costmodel import grid
from stepcal.costmodel.grid import interp1_at, interp2_at

GRID_COLUMNS = ("time_ms", "spread_ms")


class Term:
    """One additive term of T_step, in ms for the whole model. Subclasses hold the grid."""
    name: str
    description: str

    @property
    def axes(self) -> tuple[str, ...]:
        raise NotImplementedError

    def frame(self) -> pd.DataFrame:
        """The term's Parquet table."""
        raise NotImplementedError

    def entry_extra(self) -> dict:
        """meta.json keys of this kind beyond the common ones."""
        return {}

    def write(self, directory: Path) -> dict:
        """Write <name>.parquet into `directory`; return the term's meta.json entry."""
        if TERM_KINDS.get(self.name) is not type(self):
            # A term written under another kind's name would load as that kind.
            raise ValueError(f"term {self.name!r} is not a {type(self).__name__} in TERM_KINDS")
        atomic_write_parquet(self.frame(), Path(directory) / f"{self.name}.parquet")
        return {"file": f"{self.name}.parquet", "axes": list(self.axes), "unit": "ms",
                "description": self.description, **self.entry_extra()}

    def evaluate(self, f: StepFeatures, which: str = "time_ms") -> np.ndarray:
        """The term's time (or, with which="spread_ms", its spread) for each batch."""
        raise NotImplementedError

    def row_ms(self, row: tuple) -> float:
        """evaluate() of one batch's feature_row(), in plain floats."""
        raise NotImplementedError

    def __getstate__(self) -> dict:
        # What __post_init__ derives (the lookup lists, the segment indexes: megabytes on the data's
        # axes) is rebuilt where the term is unpickled (a worker process), not shipped to it.
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def __post_init__(self) -> None:
        pass

    def biased(self, z: float) -> Term:
        """This term with its time moved by z spreads at every grid point: what a replication of
        simulator.ranges draws. Interpolation is linear in the values, so evaluate() of the result
        is evaluate(time) + z x evaluate(spread)."""
        return replace(self, time_ms=self.time_ms + z * self.spread_ms)


def feature_column(name: str, path) -> int:
    """The position of a batch feature in a feature_row() tuple, resolved once at load."""
    if name not in FEATURE_NAMES:
        raise InputError(f"{path}: axis {name!r} is not a batch feature; a term reads one of "
                         f"{', '.join(FEATURE_NAMES)}")
    return FEATURE_NAMES.index(name)


def require_columns(frame: pd.DataFrame, columns, path) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")


def _floats(frame: pd.DataFrame, column: str) -> np.ndarray:
    return frame[column].to_numpy(np.float64)


@dataclass(eq=False)
class FeatureCurve(Term):
    """Time on a grid of one batch feature (num_tokens, num_seqs, ...): linear between the grid
    points and along the end segments beyond them. `source`: where the values come from when not
    from fitted data (a roofline's device and constants), written into the term's meta.json entry."""
    name: str
    axis: str
    knots: np.ndarray
    time_ms: np.ndarray
    spread_ms: np.ndarray
    description: str
    source: dict | None = None
    indexed: bool = field(default=True, compare=False)   # False: binary search (same bits; benchmarks)

    def __post_init__(self) -> None:
        self._column = feature_column(self.axis, self.name)
        # Python lists for the scalar path: indexing them costs far less than indexing arrays.
        self._row_knots = self.knots.tolist()
        self._row_values = self.time_ms.tolist()
        self._index = grid.segment_index(self.knots) if self.indexed else None
        self._row_index = self._index.rows if self._index is not None else None

    @property
    def axes(self) -> tuple[str, ...]:
        return (self.axis,)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({self.axis: self.knots, "time_ms": self.time_ms,
                             "spread_ms": self.spread_ms})

    def entry_extra(self) -> dict:
        return {"source": self.source} if self.source else {}

    @classmethod
    def read(cls, name: str, entry: dict, frame: pd.DataFrame, path) -> FeatureCurve:
        axes = list(entry["axes"])
        if len(axes) != 1:
            raise InputError(f"{path}: term {name!r} takes one axis, got {axes}")
        feature_column(axes[0], path)
        require_columns(frame, axes, path)
        frame = frame.sort_values(axes[0])
        return cls(name, axes[0], _floats(frame, axes[0]), _floats(frame, "time_ms"),
                   _floats(frame, "spread_ms"), entry.get("description", ""), entry.get("source"))

    def evaluate(self, f: StepFeatures, which: str = "time_ms") -> np.ndarray:
        return grid.interp1(getattr(f, self.axis), self.knots, getattr(self, which), self._index)

    def row_ms(self, row: tuple) -> float:
        return interp1_at(float(row[self._column]), self._row_knots, self._row_values, self._row_index)


@dataclass(eq=False)
class MeanGrid(Term):
    """Time on a 2-D grid of a count of items in the batch and their mean size (a total over the
    count); zero for a batch without any. Subclasses name the two feature columns."""
    AXES: ClassVar[tuple[str, str]]     # the labels of the grid's axes (Parquet columns)
    COUNT: ClassVar[str]                # feature column: how many items
    TOTAL: ClassVar[str]                # feature column: their summed size

    name: str
    knots: tuple[np.ndarray, np.ndarray]
    time_ms: np.ndarray                 # (len(knots[0]), len(knots[1]))
    spread_ms: np.ndarray
    description: str
    indexed: bool = field(default=True, compare=False)   # False: binary search (same bits; benchmarks)

    def __post_init__(self) -> None:
        self._count_column = feature_column(self.COUNT, self.name)
        self._total_column = feature_column(self.TOTAL, self.name)
        self._row_knots = [k.tolist() for k in self.knots]
        self._row_values = self.time_ms.tolist()
        self._indexes = tuple(grid.segment_index(k) if self.indexed else None for k in self.knots)
        self._row_indexes = tuple(i.rows if i is not None else None for i in self._indexes)

    @property
    def axes(self) -> tuple[str, ...]:
        return self.AXES

    def frame(self) -> pd.DataFrame:
        x, y = np.meshgrid(*self.knots, indexing="ij")
        return pd.DataFrame({self.AXES[0]: x.ravel(), self.AXES[1]: y.ravel(),
                             "time_ms": self.time_ms.ravel(), "spread_ms": self.spread_ms.ravel()})

    @classmethod
    def read(cls, name: str, entry: dict, frame: pd.DataFrame, path) -> MeanGrid:
        if tuple(entry["axes"]) != cls.AXES:
            raise InputError(f"{path}: term {name!r} has axes {list(cls.AXES)}, "
                             f"meta.json lists {list(entry['axes'])}")
        require_columns(frame, cls.AXES, path)
        frame = frame.sort_values(list(cls.AXES))
        knots = tuple(np.unique(_floats(frame, a)) for a in cls.AXES)
        shape = tuple(len(k) for k in knots)
        if len(frame) != shape[0] * shape[1]:
            raise InputError(f"{path}: grid is not complete ({len(frame)} rows for "
                             f"{shape[0]} x {shape[1]} axis values)")
        return cls(name, knots, _floats(frame, "time_ms").reshape(shape),
                   _floats(frame, "spread_ms").reshape(shape), entry.get("description", ""))

    def evaluate(self, f: StepFeatures, which: str = "time_ms") -> np.ndarray:
        count = getattr(f, self.COUNT)
        mean = getattr(f, self.TOTAL) / np.maximum(count, 1.0)
        return np.where(count > 0, grid.interp2(count, mean, *self.knots, getattr(self, which), self._indexes), 0.0)

    def row_ms(self, row: tuple) -> float:
        count = float(row[self._count_column])
        if not count > 0:
            return 0.0
        mean = float(row[self._total_column]) / max(count, 1.0)
        return interp2_at(count, mean, *self._row_knots, self._row_values, self._row_indexes)


class DecodeAttention(MeanGrid):
    """Decode attention by the number of decodes and their mean KV length."""
    AXES = ("num_decode", "kv_mean")
    COUNT, TOTAL = "num_decode", "decode_kv_sum"


class MixedDecodeAttention(DecodeAttention):
    """What decodes add to attention when a prefill shares their step, by the number of decodes and
    their mean KV length: zero for a step without prefill tokens. A mixed batch runs one kernel call
    over both (vLLM V1's FlashAttention), which takes longer than a pure-prefill and a pure-decode
    call summed (LLMServingSim's RTX PRO 6000 profile: 2.2x at 128 decodes), so the extra is priced
    beside the two pure terms."""
    GATE = "prefill_tokens"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._gate_column = feature_column(self.GATE, self.name)

    def evaluate(self, f: StepFeatures, which: str = "time_ms") -> np.ndarray:
        return np.where(getattr(f, self.GATE) > 0, super().evaluate(f, which), 0.0)

    def row_ms(self, row: tuple) -> float:
        return super().row_ms(row) if float(row[self._gate_column]) > 0 else 0.0


@dataclass(eq=False)
class DecodeSkew(MeanGrid):
    """Decode attention's correction for KV lengths that differ within the batch: alpha x (decode
    attention at the batch's longest KV - at its mean KV), on the decode_attn grid already scaled by
    alpha (time_ms = alpha x decode_attn). A batch of uniform KV lengths, or of one decode, gets zero.
    LLMServingSim's skew profiles time skewed decode batches against their uniform mean and maximum
    controls: time = mean + alpha (maximum - mean)."""
    AXES = ("num_decode", "kv_mean")
    COUNT, TOTAL, LONGEST = "num_decode", "decode_kv_sum", "decode_kv_max"
    alpha: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._longest_column = feature_column(self.LONGEST, self.name)

    def entry_extra(self) -> dict:
        return {"alpha": self.alpha}

    @classmethod
    def read(cls, name: str, entry: dict, frame: pd.DataFrame, path) -> DecodeSkew:
        grid = super().read(name, entry, frame, path)
        alpha = entry.get("alpha", 0.0)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not np.isfinite(alpha):
            raise InputError(f"{path}: term {name!r}: alpha must be a number, got {alpha!r}")
        return replace(grid, alpha=float(alpha))

    def evaluate(self, f: StepFeatures, which: str = "time_ms") -> np.ndarray:
        count = getattr(f, self.COUNT)
        mean = getattr(f, self.TOTAL) / np.maximum(count, 1.0)
        values = getattr(self, which)
        gap = (grid.interp2(count, getattr(f, self.LONGEST), *self.knots, values, self._indexes)
               - grid.interp2(count, mean, *self.knots, values, self._indexes))
        return np.where(count > 1, gap, 0.0)

    def row_ms(self, row: tuple) -> float:
        count = float(row[self._count_column])
        if not count > 1:
            return 0.0
        mean = float(row[self._total_column]) / count
        longest = float(row[self._longest_column])
        return (interp2_at(count, longest, *self._row_knots, self._row_values, self._row_indexes)
                - interp2_at(count, mean, *self._row_knots, self._row_values, self._row_indexes))


class PrefillAttention(MeanGrid):
    """Prefill attention by new tokens and the mean context a new token attends to."""
    AXES = ("prefill_tokens", "prefill_ctx")
    COUNT, TOTAL = "prefill_tokens", "prefill_attn_work"


@dataclass(eq=False)
class AdditiveStep(Term):
    """The whole-step model: an intercept plus one 1-D grid per batch feature
    (costmodel.additive.AdditiveGridRegressor, fitted to measured steps)."""
    name: str
    features: tuple[str, ...]
    knots: tuple[np.ndarray, ...]
    values_ms: tuple[np.ndarray, ...]
    spreads_ms: tuple[np.ndarray, ...]
    intercept_ms: float
    description: str
    relative_spread: float = 0.0      # the fit's uncertainty, relative (costmodel.additive.bootstrap_relative_spread)
    indexed: bool = field(default=True, compare=False)   # False: binary search (same bits; benchmarks)

    def __post_init__(self) -> None:
        self._indexes = tuple(grid.segment_index(k) if self.indexed else None for k in self.knots)
        self._row_parts = [(feature_column(f, self.name), k.tolist(), v.tolist(), i.rows if i is not None else None)
                           for f, k, v, i in zip(self.features, self.knots, self.values_ms, self._indexes)]

    @classmethod
    def from_estimator(cls, estimator, name: str = "step", features: tuple[str, ...] = tuple(FEATURE_NAMES),
                       description: str = "whole-step time: intercept + one piecewise-linear function per "
                                          "batch feature", relative_spread: float = 0.0) -> AdditiveStep:
        """The term of a fitted costmodel.additive.AdditiveGridRegressor whose columns are `features`."""
        knots = tuple(np.asarray(k, dtype=np.float64) for k in estimator.knots_)
        values = tuple(np.asarray(v, dtype=np.float64) for v in estimator.values_)
        return cls(name, tuple(features), knots, values, tuple(np.zeros(len(v)) for v in values),
                   float(estimator.intercept_), description, float(relative_spread))

    @property
    def axes(self) -> tuple[str, ...]:
        return self.features

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({
            "feature": np.repeat(self.features, [len(k) for k in self.knots]),
            "x": np.concatenate(self.knots), "time_ms": np.concatenate(self.values_ms),
            "spread_ms": np.concatenate(self.spreads_ms)})

    def entry_extra(self) -> dict:
        extra = {"intercept_ms": self.intercept_ms}
        return {**extra, "relative_spread": self.relative_spread} if self.relative_spread else extra

    @classmethod
    def read(cls, name: str, entry: dict, frame: pd.DataFrame, path) -> AdditiveStep:
        features = tuple(entry["axes"])
        for feature in features:
            feature_column(feature, path)
        require_columns(frame, ("feature", "x"), path)
        parts = [frame[frame["feature"] == feature] for feature in features]
        return cls(name, features, tuple(_floats(p, "x") for p in parts),
                   tuple(_floats(p, "time_ms") for p in parts),
                   tuple(_floats(p, "spread_ms") for p in parts),
                   float(entry.get("intercept_ms", 0.0)), entry.get("description", ""),
                   _relative_spread(entry, path))

    def evaluate(self, f: StepFeatures, which: str = "time_ms") -> np.ndarray:
        if which != "time_ms" and self.relative_spread:
            return self.relative_spread * np.abs(self.evaluate(f))
        values = self.values_ms if which == "time_ms" else self.spreads_ms
        total = np.full(len(f), self.intercept_ms if which == "time_ms" else 0.0)
        for feature, knots, part, index in zip(self.features, self.knots, values, self._indexes):
            total = total + grid.interp1(getattr(f, feature), knots, part, index)
        return total

    def biased(self, z: float) -> AdditiveStep:
        if self.relative_spread:   # the whole fit moves together, never below 5% of itself
            factor = max(1.0 + z * self.relative_spread, 0.05)
            return replace(self, values_ms=tuple(v * factor for v in self.values_ms),
                           intercept_ms=self.intercept_ms * factor)
        return replace(self, values_ms=tuple(v + z * s for v, s in zip(self.values_ms, self.spreads_ms)))

    def row_ms(self, row: tuple) -> float:
        total = self.intercept_ms
        for column, knots, values, rows in self._row_parts:
            total = total + interp1_at(float(row[column]), knots, values, rows)
        return total


def _relative_spread(entry: dict, path) -> float:
    value = entry.get("relative_spread", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (np.isfinite(value) and value >= 0):
        raise InputError(f"{path}: relative_spread must be a non-negative number, got {value!r}")
    return float(value)


# The kind of each term a table directory may hold, by the term's name (its meta.json key).
TERM_KINDS: dict[str, type[Term]] = {
    "linear": FeatureCurve,          # layers x per-layer GEMMs (and, in tables written before the
                                     # elementwise term, the small ops too), by num_tokens
    "elementwise": FeatureCurve,     # norms, RoPE, activation, residual adds, embedding, by num_tokens
    "sampling": FeatureCurve,        # greedy sampling's read of the logits (measured: with the final norm), by num_seqs
    "kv_store": FeatureCurve,        # layers x the new tokens' KV store (measured by our profiler), by num_seqs
    "lm_head": FeatureCurve,         # by num_seqs
    "all_reduce": FeatureCurve,      # tensor parallelism's collectives, by num_tokens
    "moe": FeatureCurve,             # MoE layers x routed experts, by num_tokens
    "all_to_all": FeatureCurve,      # expert parallelism's dispatch and combine, by num_tokens
    "overhead": FeatureCurve,        # input building, by num_seqs (profiles before the host op)
    "host": AdditiveStep,            # the engine's host path of an iteration, by num_seqs and num_tokens
    "decode_attn": DecodeAttention,
    "mixed_decode_attn": MixedDecodeAttention,
    "decode_attn_skew": DecodeSkew,
    "prefill_attn": PrefillAttention,
    "step": AdditiveStep,
}


def read_term(name: str, entry: dict, frame: pd.DataFrame, path) -> Term:
    """A term from its meta.json entry and its Parquet table (`path` names it in errors)."""
    kind = TERM_KINDS.get(name)
    if kind is None:
        raise InputError(f"{path}: unknown term {name!r}; known: {', '.join(TERM_KINDS)}")
    require_columns(frame, GRID_COLUMNS, path)
    require_finite_numbers(frame, path)
    return kind.read(name, entry, frame, path)


def require_finite_numbers(frame: pd.DataFrame, path, labels: tuple[str, ...] = ("feature",)) -> None:
    """Every column but the text `labels` (AdditiveStep's feature names, ops.parquet's op) holds finite
    numbers: a grid of strings would fail deep in numpy, and a NaN or an infinity would come out of
    the simulator as a step time."""
    for column in frame.columns:
        if column in labels:
            continue
        values = frame[column]
        if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            raise InputError(f"{path}: column {column!r} must hold numbers, got {values.dtype}")
        if not np.isfinite(values.to_numpy(dtype=np.float64)).all():
            raise InputError(f"{path}: column {column!r} holds a NaN or an infinity")
