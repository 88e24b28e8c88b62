"""Features of each target: what a regressor sees, what the physics model is linear in, and
the size axis that the extrapolation split cuts along.

A target is a group of records one regressor learns: all GEMMs together (their shape is in the
features), each small per-token operator on its own, attention prefill, attention decode,
whole steps, host overhead, and any other imported op by name.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.batch import FEATURE_NAMES
from simulator.model_spec import DTYPE_BYTES


@dataclass(frozen=True)
class TargetKind:
    columns: tuple[str, ...]          # record columns the features are built from
    physics: tuple[str, ...]          # derived features the physics model is linear in
    size: str                         # the axis the extrapolation split cuts along
    extra: tuple[str, ...] = ()       # derived features only the trees see


KINDS = {
    "gemm": TargetKind(("m", "n", "k"), ("flops", "bytes"), "m",
                       ("m_tiles_64", "m_tiles_128", "tiles_128")),
    "elementwise": TargetKind(("num_tokens", "width", "tp"), ("bytes",), "num_tokens"),
    "attn_decode": TargetKind(("num_decode", "decode_kv_sum", "decode_kv_max", "num_heads",
                               "num_kv_heads", "head_dim"), ("flops", "bytes", "blocks"),
                              "decode_kv_max"),
    "attn_prefill": TargetKind(("num_seqs", "prefill_tokens", "prefill_attn_work", "kv_sum",
                                "num_heads", "num_kv_heads", "head_dim"),
                               ("flops", "bytes", "blocks", "seq_len"), "seq_len",
                               ("tile_work",)),
    "step": TargetKind(FEATURE_NAMES, ("num_tokens", "num_seqs", "decode_kv_sum",
                                       "prefill_attn_work"), "num_tokens"),
    "overhead": TargetKind(("num_seqs", "num_tokens"), ("num_seqs", "num_tokens"), "num_seqs"),
    # A tensor-parallel all-reduce of num_tokens x width elements over tp GPUs.
    "all_reduce": TargetKind(("tp",), ("message_bytes", "ring_bytes"), "message_bytes"),
}


def target_of(op: str, name) -> str:
    """The target a record belongs to: e.g. 'gemm', 'elementwise:add', 'attn_decode'."""
    if op == "elementwise":
        return f"elementwise:{name}"
    if op == "all_reduce" and isinstance(name, str) and name:
        return f"all_reduce:{name}"       # one target per implementation (e.g. CUDA graph or eager)
    return str(op)


def kind_of(target: str) -> str:
    return target.split(":", 1)[0]


def assign_targets(records: pd.DataFrame) -> pd.Series:
    return pd.Series([target_of(o, n) for o, n in zip(records["op"], records["name"])],
                     index=records.index, name="target")


def generic_kind(records: pd.DataFrame) -> TargetKind:
    """An imported op we know nothing about: its populated numeric shape columns, no physics."""
    cols = tuple(c for c in ("m", "n", "k") + FEATURE_NAMES + ("num_heads", "num_kv_heads",
                                                               "head_dim", "width", "tp")
                 if c in records.columns and records[c].notna().all())
    if not cols:
        cols = ("row",)
    return TargetKind(cols, (), cols[0])


def kind_for(target: str, records: pd.DataFrame) -> TargetKind:
    return KINDS.get(kind_of(target)) or generic_kind(records)


@dataclass(frozen=True)
class Design:
    """The feature matrix of one target's rows: plain columns first, then the physics ones."""
    X: np.ndarray
    names: tuple[str, ...]
    physics_index: tuple[int, ...]
    size: np.ndarray


def design(target: str, records: pd.DataFrame, kind: TargetKind | None = None) -> Design:
    kind = kind or kind_for(target, records)
    base = {c: records[c].to_numpy(dtype=np.float64) for c in kind.columns}
    if "tp" in base:
        base["tp"] = np.nan_to_num(base["tp"], nan=1.0)   # no tensor parallelism: one GPU
    derived = _derived(kind_of(target), records, base)
    names = list(kind.columns) + list(kind.extra) + [p for p in kind.physics
                                                     if p not in kind.columns]
    cols = [base.get(n, derived.get(n)) for n in names]
    X = np.column_stack(cols) if cols else np.zeros((len(records), 0))
    X = np.nan_to_num(X, nan=0.0)
    physics_index = tuple(names.index(p) for p in kind.physics)
    size = base.get(kind.size, derived.get(kind.size))
    return Design(X, tuple(names), physics_index, np.nan_to_num(np.asarray(size, dtype=np.float64)))


def _derived(kind: str, records: pd.DataFrame, base: dict) -> dict:
    dtype_bytes = np.array([DTYPE_BYTES.get(d, 2) if isinstance(d, str) else 2
                            for d in records["dtype"]], dtype=np.float64)
    if kind == "gemm":
        m, n, k = base["m"], base["n"], base["k"]
        # Tiles: a GEMM kernel covers the output in fixed tiles, so its time steps up where m
        # crosses a multiple of the tile (a partly filled tile costs a full one).
        return {"flops": 2 * m * n * k, "bytes": (m * k + n * k + m * n) * dtype_bytes,
                "m_tiles_64": np.ceil(m / 64), "m_tiles_128": np.ceil(m / 128),
                "tiles_128": np.ceil(m / 128) * np.ceil(n / 128)}
    if kind == "elementwise":
        return {"bytes": base["num_tokens"] * base["width"] * dtype_bytes}
    if kind == "all_reduce":
        message = (records["num_tokens"].to_numpy(dtype=np.float64) * records["width"].to_numpy(dtype=np.float64)
                   * dtype_bytes)
        # ring_bytes: what each GPU sends in a ring all-reduce, 2 (tp - 1) / tp of the message.
        return {"message_bytes": message, "ring_bytes": 2 * (base["tp"] - 1) / base["tp"] * message}
    if kind == "attn_decode":
        kv_sum, heads, kv_heads, hd = (base["decode_kv_sum"], base["num_heads"],
                                       base["num_kv_heads"], base["head_dim"])
        # blocks: the kernel's work items (a sequence's KV head over 256-token splits), whose
        # count sets how well a batch fills the device.
        return {"flops": 4 * kv_sum * heads * hd,
                "bytes": 2 * kv_sum * kv_heads * hd * dtype_bytes,
                "blocks": kv_heads * (np.ceil(base["decode_kv_max"] / 256) * base["num_decode"])}
    if kind == "attn_prefill":
        tokens, work, kv_sum, seqs = (base["prefill_tokens"], base["prefill_attn_work"],
                                      base["kv_sum"], base["num_seqs"])
        heads, kv_heads, hd = base["num_heads"], base["num_kv_heads"], base["head_dim"]
        q_per_seq = tokens / np.maximum(seqs, 1)
        q_tiles = np.ceil(q_per_seq / 128)
        # tile_work: 128x128 score tiles a causal FlashAttention kernel computes, whole tiles on
        # the diagonal included (what it costs, where flops counts only the useful half).
        kv_tiles = np.ceil(kv_sum / np.maximum(seqs, 1) / 128)
        tile_work = seqs * heads * (q_tiles * kv_tiles + q_tiles * (q_tiles + 1) / 2)
        # blocks: 128-query tiles per head and sequence, the unit a FlashAttention kernel schedules.
        return {"tile_work": tile_work, "flops": 4 * work * heads * hd,
                "bytes": (2 * tokens * heads + 2 * (tokens + kv_sum) * kv_heads) * hd * dtype_bytes,
                "blocks": seqs * heads * q_tiles,
                "seq_len": (tokens + kv_sum) / np.maximum(seqs, 1)}
    return {}
