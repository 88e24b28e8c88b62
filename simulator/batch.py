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
    def of(cls, request_ids, q_lens, kv_lens) -> "StepBatch":
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

    def features(self) -> "StepFeatures":
        return StepFeatures.from_batches([self])


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
    def from_batches(cls, batches) -> "StepFeatures":
        rows = [_batch_row(b.q_lens, b.kv_lens) for b in batches]
        cols = np.array(rows, dtype=np.float64).reshape(len(rows), len(FEATURE_NAMES))
        return cls(*(cols[:, i] for i in range(len(FEATURE_NAMES))))

    @classmethod
    def decode_run(cls, kv_lens: np.ndarray, num_steps: int) -> "StepFeatures":
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

    @classmethod
    def from_columns(cls, columns) -> "StepFeatures":
        """From a mapping (a DataFrame or dict) holding every feature column."""
        return cls(*(np.asarray(columns[name], dtype=np.float64) for name in FEATURE_NAMES))

    def as_dict(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in FEATURE_NAMES}


def _batch_row(q_lens: np.ndarray, kv_lens: np.ndarray) -> tuple:
    q = np.asarray(q_lens, dtype=np.int64)
    s = np.asarray(kv_lens, dtype=np.int64)
    dec = (q == 1) & (s > 0)
    pre = ~dec
    qp, sp = q[pre], s[pre]
    attn_work = float((qp * sp).sum()) + float((qp * (qp + 1)).sum()) / 2.0
    sd = s[dec]
    return (len(q), int(q.sum()), int(dec.sum()), int(sd.sum()), int(sd.max()) if len(sd) else 0,
            int(qp.sum()), attn_work, int(s.sum()))


def batch_row(q_lens, kv_lens) -> dict:
    """The derived quantities of one batch as a plain dict (for logs and profile rows)."""
    return dict(zip(FEATURE_NAMES, _batch_row(np.asarray(q_lens), np.asarray(kv_lens))))
