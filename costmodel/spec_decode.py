"""The time of a speculative decoding step: the target's verify step plus the drafter's passes.

Verify. The simulator hands a request that verifies d drafts over s cached tokens as a decode of
1 + d tokens (simulator.spec_decode.verify_feature_row): the GEMMs and element-wise work run at the
step's total tokens, and its attention is priced as decode attention over s + d keys. The shared
tables have no q > 1 decode attention, so that is the interpolation, and why it holds: FlashAttention's
decode path (vLLM's FlashAttention backend, pack-GQA) puts the 1 + d query tokens of a sequence times
the query heads that share one KV head into the rows of one tile, and reads each KV block once per
tile. While (1 + d) x heads / kv_heads rows fit one tile (64 rows, the split-KV kernel's), the memory
traffic, which bounds decode attention, is that of q = 1; past it each further tile reads the KV again,
so decode attention is scaled by the number of tiles. (Pricing it as a small prefill chunk over the
KV would use the prefill kernel's tables, measured from empty caches, far from this shape.)

The LM head and sampling run on every verified position, 1 + d rows a verifying request: the tables
price one row per sequence, so the rows the drafts add are priced on the same curves.

Drafter, k passes per step as vLLM V1's proposer runs them: the first over every token of the step
(the drafter builds its KV from the target's hidden states), the other k - 1 over one token per
sequence. An EAGLE head or MTP layers are composed from the target's own tables: each layer costs
the target's per-layer share (every term but the LM head and sampling, over its layers), plus one LM
head and sampling scaled by the drafter's vocabulary over the target's (both read the whole weight
or logits row: memory-bound, so linear in the vocabulary). EAGLE's input projection and embedding
are left out (one GEMM of hidden x 2-3 hidden at the step's tokens). A draft model brings its own
tables; n-gram lookup is a constant per step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from stepcal.core.batch import FEATURE_NAMES, StepFeatures
from stepcal.core.errors import InputError
from stepcal.costmodel.tables import TableStepModel
from stepcal.costmodel.terms import FeatureCurve
from stepcal.simulator.step_model import FeatureStepModel, HostTermsModel

VOCAB_TERMS = ("lm_head", "sampling")
BATCH_COUNT_AXES = ("num_seqs", "num_tokens", "num_decode")   # all equal to the batch size on a decode row
ATTENTION_TILE_ROWS = 64   # query rows per tile of FlashAttention's split-KV decode kernel


def table_of(model) -> TableStepModel | None:
    """The T_step tables under a model's wrappers (host terms, scaling), None for const/linear."""
    while model is not None and not isinstance(model, TableStepModel):
        model = getattr(model, "base", None)
    return model


def _positive_sum(terms, row: tuple) -> float:
    total = 0.0
    for term in terms:
        total = total + max(term.row_ms(row), 0.0)
    return total


def _positive_sum_features(terms, features: StepFeatures) -> np.ndarray:
    total = np.zeros(len(features))
    for term in terms:
        total = total + np.maximum(term.evaluate(features), 0.0)
    return total


def decode_row(row: tuple) -> tuple:
    """A drafter's later pass over the step's sequences: one token each, over the caches the step left."""
    num_seqs, num_tokens, _, _, decode_kv_max, _, _, kv_sum = row
    kv_total = kv_sum + num_tokens
    return (num_seqs, num_seqs, num_seqs, kv_total, max(decode_kv_max, kv_total / max(num_seqs, 1)), 0, 0.0, kv_total)


def decode_features(f: StepFeatures) -> StepFeatures:
    """decode_row() of many batches."""
    b = f.num_seqs
    kv_total = f.kv_sum + f.num_tokens
    zeros = np.zeros(len(f))
    return StepFeatures(num_seqs=b, num_tokens=b.copy(), num_decode=b.copy(), decode_kv_sum=kv_total,
                        decode_kv_max=np.maximum(f.decode_kv_max, kv_total / np.maximum(b, 1)),
                        prefill_tokens=zeros, prefill_attn_work=zeros.copy(), kv_sum=kv_total.copy())


class HeadPass:
    """One forward of an EAGLE head or MTP layers: num_layers of the target's layers and an LM head
    over vocab_ratio of the target's vocabulary."""

    def __init__(self, table: TableStepModel, num_layers: int, vocab_ratio: float) -> None:
        self.table, self.num_layers, self.vocab_ratio = table, num_layers, vocab_ratio
        target_layers = table.meta.num_layers or (table.meta.model_spec or {}).get("num_layers")
        if not target_layers:
            raise InputError(f"{table.path}: meta.json gives no num_layers to take a head's share of")
        self.layer_share = num_layers / float(target_layers)
        # each term's weight in one pass, in the table's order
        self.weights = [vocab_ratio if t.name in VOCAB_TERMS else self.layer_share for t in table.terms]
        # On a decode row (one token per sequence) the curves over a count of the batch take one value
        # per batch size: kept, so that the later passes evaluate only the terms that read the caches.
        self._by_count = [isinstance(t, FeatureCurve) and t.axis in BATCH_COUNT_AXES for t in table.terms]
        self._decode_cache: dict[float, list[float]] = {}

    def decode_row_ms(self, row: tuple) -> float:
        """row_ms() of a decode row (decode_row()): the same value, the batch-size terms cached."""
        cached = self._decode_cache.get(row[0])
        if cached is None:
            cached = [max(t.row_ms(row), 0.0) if by_count else None
                      for t, by_count in zip(self.table.terms, self._by_count)]
            self._decode_cache[row[0]] = cached
        return self.weighted_ms([max(t.row_ms(row), 0.0) if value is None else value
                                 for t, value in zip(self.table.terms, cached)])

    def row_ms(self, row: tuple) -> float:
        return self.weighted_ms([max(t.row_ms(row), 0.0) for t in self.table.terms])

    def weighted_ms(self, term_values: list[float]) -> float:
        """The pass's time from the table's term values at its row (each already held at >= 0)."""
        total = 0.0
        for weight, value in zip(self.weights, term_values):
            total = total + weight * value
        return total

    def features_ms(self, f: StepFeatures) -> np.ndarray:
        total = np.zeros(len(f))
        for weight, term in zip(self.weights, self.table.terms):
            total = total + weight * np.maximum(term.evaluate(f), 0.0)
        return total


@dataclass(frozen=True)
class PassesDrafter:
    """k passes of `one_pass` (a HeadPass or a draft model's step model): over the step, then k - 1
    over one token per sequence."""
    one_pass: object
    num_passes: int

    def row_ms(self, row: tuple) -> float:
        later = self.one_pass.row_ms(decode_row(row)) if self.num_passes > 1 else 0.0
        return self.one_pass.row_ms(row) + (self.num_passes - 1) * later

    def features_ms(self, f: StepFeatures) -> np.ndarray:
        first = np.asarray(self.one_pass.features_ms(f), dtype=np.float64)
        if self.num_passes == 1:
            return first
        return first + (self.num_passes - 1) * np.asarray(self.one_pass.features_ms(decode_features(f)))


@dataclass(frozen=True)
class ConstDrafter:
    time_ms: float

    def row_ms(self, row: tuple) -> float:
        return self.time_ms

    def features_ms(self, f: StepFeatures) -> np.ndarray:
        return np.full(len(f), self.time_ms)


class DraftedStepModel(FeatureStepModel):
    """The target's step time (its verify steps as decodes, decode attention scaled by the tiles the
    drafts' query rows take) plus the drafter's time, every step."""

    def __init__(self, target, drafter, attention_tiles: int = 1, label: str = "") -> None:
        self.target, self.drafter, self.label = target, drafter, label
        table = self.table = table_of(target)
        self.extra_attention = [t for t in table.terms if t.name == "decode_attn"] if table and attention_tiles > 1 else []
        self.attention_tiles = attention_tiles
        self.front_end = getattr(target, "front_end", None)
        self.per_request_ms = getattr(target, "per_request_ms", 0.0)
        # A head on the target's own tables reads the same terms at the step's row as the target:
        # evaluated once for both (the simulator's one-step path runs every step).
        one_pass = getattr(drafter, "one_pass", None)
        self._head = one_pass if isinstance(one_pass, HeadPass) and one_pass.table is table else None
        # A curve over one feature gives the same value for the same feature value: looked up once each.
        self._plan = [(t, {}, FEATURE_NAMES.index(t.axis)) if isinstance(t, FeatureCurve) else (t, None, None)
                      for t in (table.terms if table else [])]
        # The LM head and sampling run on every verified position (1 + d rows a verifying request), where
        # the tables price one row per sequence: the difference is added.
        self._logits_terms = [t for t in (table.terms if table else [])
                              if t.name in VOCAB_TERMS and isinstance(t, FeatureCurve) and t.axis == "num_seqs"]
        self._logits_memo: dict[tuple, float] = {}

    def _extra_ms(self, row: tuple) -> float:
        """Decode attention's further tiles and the LM head's and sampling's further rows, at `row`."""
        extra = (self.attention_tiles - 1) * _positive_sum(self.extra_attention, row) if self.extra_attention else 0.0
        if self._logits_terms:
            num_seqs, num_tokens, num_decode, _, _, prefill_tokens = row[:6]
            logits_rows = num_tokens - prefill_tokens + (num_seqs - num_decode)
            if logits_rows != num_seqs:   # the curves read num_seqs alone: one value per pair
                key = (logits_rows, num_seqs)
                more = self._logits_memo.get(key)
                if more is None:
                    more = self._logits_memo[key] = (_positive_sum(self._logits_terms, (logits_rows, *row[1:]))
                                                     - _positive_sum(self._logits_terms, row))
                extra = extra + more
        return extra

    def _extra_features_ms(self, f: StepFeatures) -> np.ndarray:
        """_extra_ms() of many batches."""
        extra = (self.attention_tiles - 1) * _positive_sum_features(self.extra_attention, f)
        if self._logits_terms:
            rows = replace(f, num_seqs=f.num_tokens - f.prefill_tokens + (f.num_seqs - f.num_decode))
            extra = extra + (_positive_sum_features(self._logits_terms, rows)
                             - _positive_sum_features(self._logits_terms, f))
        return extra

    def _term_values(self, row: tuple) -> list[float]:
        """Each table term's value at `row`, held at >= 0 (TableStepModel's terms, in its order)."""
        values = []
        for term, memo, column in self._plan:
            if memo is None:
                values.append(max(term.row_ms(row), 0.0))
                continue
            x = row[column]
            value = memo.get(x)
            if value is None:
                value = memo[x] = max(term.row_ms(row), 0.0)
            values.append(value)
        return values

    def row_ms(self, row: tuple) -> float:
        extra = self._extra_ms(row)
        head = self._head
        if head is None:
            return self.target.row_ms(row) + extra + self.drafter.row_ms(row)
        values = self._term_values(row)
        table_ms = 0.0
        for value in values:   # TableStepModel.row_ms's sum, in its order
            table_ms = table_ms + value
        passes = self.drafter.num_passes
        later = head.decode_row_ms(decode_row(row)) if passes > 1 else 0.0
        return self._target_ms(row, table_ms) + extra + (head.weighted_ms(values) + (passes - 1) * later)

    def _target_ms(self, row: tuple, table_ms: float) -> float:
        """The target's time at `row` from its tables' sum there, through the wrappers this knows."""
        target = self.target
        if target is self.table:
            return table_ms
        if isinstance(target, HostTermsModel) and target.base is self.table:
            return target._with_host(table_ms, float(row[0]), float(row[1]))
        return target.row_ms(row)

    def features_ms(self, features: StepFeatures) -> np.ndarray:
        extra = self._extra_features_ms(features)
        return self.target.features_ms(features) + extra + self.drafter.features_ms(features)

    def split_ms(self, row: tuple) -> dict[str, float]:
        """One step's time by part: the target's terms (verify), the extra attention tiles, the drafter."""
        table = table_of(self.target)
        parts = {t.name: max(t.row_ms(row), 0.0) for t in table.terms} if table else {}
        parts["target_other"] = self.target.row_ms(row) - sum(parts.values())
        parts["verify_extra"] = self._extra_ms(row)   # further attention tiles, LM head rows of the drafts
        parts["drafter"] = self.drafter.row_ms(row)
        return parts

    def describe(self) -> str:
        target = self.target.describe() if hasattr(self.target, "describe") else type(self.target).__name__
        return f"{target} + drafter {self.label}"


def attention_tiles(table: TableStepModel | None, num_draft_tokens: int) -> int:
    """Tiles of ATTENTION_TILE_ROWS that (1 + k) query tokens x the query heads of one KV head take."""
    if table is None or not table.meta.model_spec:
        return 1
    spec = table.meta.model_spec
    group = max(1, int(spec.get("num_heads", 1)) // max(1, int(spec.get("num_kv_heads") or spec.get("num_heads", 1))))
    return max(1, math.ceil((1 + num_draft_tokens) * group / ATTENTION_TILE_ROWS))


def make_drafter(text: str | None, method: str, num_draft_tokens: int, target, load_tables) -> tuple[object, str]:
    """The drafter of `--drafter` (head:LAYERS[,VOCAB], const:MS or a draft model's table directory),
    by default head:1 for eagle and mtp and const:0 for ngram; a draft model needs its tables.
    `load_tables(path)` loads a step model from a directory. Returns the drafter and its label."""
    if text is None:
        if method == "draft-model":
            raise InputError("--spec-decode draft-model needs --drafter DIR, the draft model's T_step tables")
        text = "const:0" if method == "ngram" else "head:1"
    kind, _, values = text.partition(":")
    if kind == "const" and values:
        time_ms = _number(values, text)
        if time_ms < 0:
            raise InputError(f"--drafter {text!r}: the constant must be >= 0 ms")
        return ConstDrafter(time_ms), text
    if kind == "head" and values:
        table = table_of(target)
        if table is None:
            raise InputError(f"--drafter {text!r}: a head is composed from the target's T_step tables; "
                             f"--step-model is not a table directory")
        parts = values.split(",")
        layers = int(_number(parts[0], text))
        vocab = _number(parts[1], text) if len(parts) > 1 else None
        if layers < 1 or len(parts) > 2 or (vocab is not None and vocab < 1):
            raise InputError(f"--drafter {text!r}: expected head:LAYERS[,VOCAB] with LAYERS >= 1 and VOCAB >= 1")
        target_vocab = float((table.meta.model_spec or {}).get("vocab_size") or 0)
        ratio = 1.0 if vocab is None or not target_vocab else vocab / target_vocab
        return PassesDrafter(HeadPass(table, layers, ratio), num_draft_tokens), text
    if not Path(text).is_dir():
        raise InputError(f"--drafter {text!r}: expected head:LAYERS[,VOCAB], const:MS or a T_step table directory")
    return PassesDrafter(load_tables(text), num_draft_tokens), f"tables:{text}"


def drafted_step_model(model, spec_decode, drafter: str | None, load_tables) -> DraftedStepModel:
    """`model` with the drafter of `--drafter` (make_drafter) for simulator.spec_decode.SpecDecodeConfig
    `spec_decode`, and the verify step's attention tiles."""
    k = spec_decode.num_draft_tokens
    one, label = make_drafter(drafter, spec_decode.method, k, model, load_tables)
    return DraftedStepModel(model, one, attention_tiles(table_of(model), k), label)


def _number(value: str, text: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"--drafter {text!r}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise InputError(f"--drafter {text!r}: {value!r} is not a finite number")
    return number
