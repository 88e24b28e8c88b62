"""Heterogeneous batches, named by a pattern, and the batches an engine can be held at.

A pattern makes a batch of varied lengths from (number of sequences, q, s) deterministically, so a
grid names the same points on every host: decodes spread log-uniformly or one long among short
ones, prefill chunks of ragged lengths.
"""
from __future__ import annotations

import numpy as np

from stepcal.core.errors import InputError
from stepcal.profiler.point import point_rng

DECODE_PATTERNS = ("uniform", "log_uniform", "one_long")
PREFILL_PATTERNS = ("uniform", "ragged")


def decode_kv_lens(pattern: str, num_seqs: int, kv_len: int) -> tuple[int, ...]:
    """KV lengths of num_seqs decodes; kv_len is the common length (uniform) or the longest.

    log_uniform: spread log-uniformly over [kv_len/64, kv_len] (one sequence at kv_len);
    one_long: one sequence at kv_len, the others at kv_len/32.
    """
    if pattern == "uniform":
        return (kv_len,) * num_seqs
    floor = max(1, kv_len // 32) if pattern == "one_long" else max(1, kv_len // 64)
    if pattern == "one_long":
        return (kv_len,) + (floor,) * (num_seqs - 1)
    if pattern == "log_uniform":
        rng = point_rng(pattern, num_seqs, kv_len)
        lens = np.exp(rng.uniform(np.log(floor), np.log(kv_len), size=num_seqs)).astype(int)
        lens[0] = kv_len
        return tuple(int(x) for x in np.clip(lens, 1, kv_len))
    raise ValueError(f"unknown decode pattern {pattern!r}")


def prefill_batch(pattern: str, num_seqs: int, q_len: int, kv_len: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Chunks of num_seqs prefills; ragged: q log-uniform in [q/8, q], s uniform in [0, s]."""
    if pattern == "uniform":
        return (q_len,) * num_seqs, (kv_len,) * num_seqs
    if pattern == "ragged":
        rng = point_rng(pattern, num_seqs, q_len, kv_len)
        low = max(1, q_len // 8)
        q = np.exp(rng.uniform(np.log(low), np.log(q_len), size=num_seqs)).round().astype(int)
        s = rng.integers(0, kv_len + 1, size=num_seqs)
        q[0], s[0] = q_len, kv_len                 # the largest chunk is always there
        return tuple(int(x) for x in np.clip(q, 1, q_len)), tuple(int(x) for x in s)
    raise ValueError(f"unknown prefill pattern {pattern!r}")


def is_probe_batch(q_lens, kv_lens) -> bool:
    """Whether every sequence is a decode (q = 1 over s > 0) or a prefill from scratch (s = 0): the
    batches an engine can be held at (profiler.engine.probe) without choosing the scheduler's chunks."""
    return all((q == 1 and s > 0) or (s == 0 and q >= 1) for q, s in zip(q_lens, kv_lens))


def check_host_batch(q_lens, kv_lens, where: str) -> None:
    """A host point's batch is one an engine can be held at (is_probe_batch)."""
    for q, s in zip(q_lens, kv_lens):
        if not is_probe_batch([q], [s]):
            raise InputError(f"{where}: a host batch holds decodes (q=1, s>0) and prefills (s=0); "
                             f"got q={q}, s={s}")
