"""The step batch: one engine iteration, and the derived quantities every stage uses.

Request i brings q_lens[i] new tokens on top of kv_lens[i] tokens already in its KV cache.
Prefill, decode, mixed and chunked-prefill steps are all this one object.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FEATURE_NAMES = ("num_seqs", "num_tokens", "num_decode", "decode_kv_sum", "decode_kv_max",
                 "prefill_tokens", "prefill_attn_work", "kv_sum")


@dataclass(frozen=True, slots=True)
class StepBatch:
    request_ids: tuple[int, ...]
    q_lens: np.ndarray   # int64, new tokens per request (1 for a decode)
    kv_lens: np.ndarray  # int64, tokens already in the request's KV cache

    @classmethod
    def of(cls, request_ids, q_lens, kv_lens) -> StepBatch:
        return cls(tuple(int(r) for r in request_ids), np.asarray(q_lens, dtype=np.int64),
                   np.asarray(kv_lens, dtype=np.int64))

    @property
    def num_seqs(self) -> int:
        return len(self.q_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.q_lens.sum())

    @property
    def is_decode(self) -> np.ndarray:
        """A decode brings one token over a non-empty cache."""
        return (self.q_lens == 1) & (self.kv_lens > 0)

    @property
    def is_pure_decode(self) -> bool:
        return bool(self.is_decode.all())

    def features(self) -> StepFeatures:
        return StepFeatures.from_row(feature_row(self.q_lens, self.kv_lens))


@dataclass(frozen=True, slots=True)
class StepFeatures:
    """The derived quantities of many step batches, one array per feature (struct of arrays)."""
    num_seqs: np.ndarray
    num_tokens: np.ndarray
    num_decode: np.ndarray
    decode_kv_sum: np.ndarray
    decode_kv_max: np.ndarray
    prefill_tokens: np.ndarray
    prefill_attn_work: np.ndarray   # Σ q·(s + (q+1)/2) over prefills: causal attention pairs
    kv_sum: np.ndarray              # Σ s over all sequences

    def __len__(self) -> int:
        return len(self.num_seqs)

    @classmethod
    def from_batches(cls, batches) -> StepFeatures:
        rows = [feature_row(b.q_lens, b.kv_lens) for b in batches]
        cols = np.array(rows, dtype=np.float64).reshape(len(rows), len(FEATURE_NAMES)).T
        return cls(*cols)

    @classmethod
    def from_row(cls, row: tuple) -> StepFeatures:
        """One batch's features from its feature_row() tuple."""
        return cls(*np.array(row, dtype=np.float64).reshape(len(FEATURE_NAMES), 1))

    @classmethod
    def decode_run(cls, kv_lens: np.ndarray, num_steps: int) -> StepFeatures:
        """Features of num_steps consecutive decode steps over the same sequences, in closed form.

        Step j (0-based) sees every cache grown by j tokens.
        """
        b = len(kv_lens)
        j = np.arange(num_steps, dtype=np.float64)
        full = np.full(num_steps, float(b))
        zeros = np.zeros(num_steps)
        kv_sum = float(kv_lens.sum()) + b * j
        return cls(num_seqs=full, num_tokens=full.copy(), num_decode=full.copy(),
                   decode_kv_sum=kv_sum, decode_kv_max=float(kv_lens.max()) + j,
                   prefill_tokens=zeros, prefill_attn_work=zeros.copy(), kv_sum=kv_sum.copy())

    def head(self, n: int) -> StepFeatures:
        """The first n batches."""
        return StepFeatures(*(getattr(self, name)[:n] for name in FEATURE_NAMES))

    @classmethod
    def from_columns(cls, columns) -> StepFeatures:
        """From a mapping (a DataFrame or dict) holding every feature column."""
        return cls(*(np.asarray(columns[name], dtype=np.float64) for name in FEATURE_NAMES))

    def as_dict(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in FEATURE_NAMES}


def feature_row(q_lens, kv_lens) -> tuple:
    """The FEATURE_NAMES values of one batch, in order."""
    # Plain Python over lists: for the few dozen sequences of a step this beats numpy's per-call cost.
    num_decode = decode_kv_sum = decode_kv_max = prefill_tokens = pair_sum = tri_sum = 0
    q_list, s_list = q_lens.tolist(), kv_lens.tolist()
    for q, s in zip(q_list, s_list):
        if q == 1 and s > 0:
            num_decode += 1
            decode_kv_sum += s
            decode_kv_max = max(decode_kv_max, s)
        else:
            prefill_tokens += q
            pair_sum += q * s
            tri_sum += q * (q + 1)
    return (len(q_list), sum(q_list), num_decode, decode_kv_sum, decode_kv_max, prefill_tokens,
            pair_sum + tri_sum / 2.0, sum(s_list))


def batch_row(q_lens, kv_lens) -> dict:
    """The derived quantities of one batch as a plain dict (for logs and profile rows)."""
    return dict(zip(FEATURE_NAMES, feature_row(np.asarray(q_lens), np.asarray(kv_lens))))
