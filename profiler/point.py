"""One point of a profiling sweep, and the seeded draws that make its batch or routing.

A point names one measurement by its full shape, so its key is the same on every host and a sweep
that is run again skips the keys it has done. Where a point's batch or routing is drawn at random,
the generator is seeded by the point's description (point_rng), so every host draws the same.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Point:
    """One measurement: a GEMM (m, n, k), a batch of (q_i, s_i) for attention / step / overhead, or
    the routed experts of one MoE layer over m tokens (name: the routing distribution)."""
    op: str
    name: str                                  # projection, batch pattern or routing distribution
    m: int | None = None                       # a GEMM's rows; a MoE layer's tokens
    n: int | None = None
    k: int | None = None
    q_lens: tuple[int, ...] | None = None
    kv_lens: tuple[int, ...] | None = None

    @property
    def key(self) -> str:
        """Readable prefix plus a hash of the full shape (lists can be long)."""
        shape = {"m": self.m, "n": self.n, "k": self.k, "q_lens": self.q_lens, "kv_lens": self.kv_lens}
        digest = hashlib.sha1(json.dumps([self.op, self.name, shape]).encode()).hexdigest()[:12]
        if self.q_lens is None:
            return f"{self.op}/{self.name}/m{self.m}/{digest}"
        return f"{self.op}/{self.name}/b{len(self.q_lens)}/{digest}"

    @property
    def num_tokens(self) -> int:
        return self.m if self.q_lens is None else int(sum(self.q_lens))

    @property
    def kv_tokens(self) -> int:
        """Tokens held in caches during the point (new ones included)."""
        if self.q_lens is None:
            return 0
        return int(sum(self.q_lens) + sum(self.kv_lens))


def point_rng(*parts) -> np.random.Generator:
    """A generator seeded by `parts` (JSON-serialisable): the same draws on every host."""
    seed = int(hashlib.sha1(json.dumps(parts).encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed)
