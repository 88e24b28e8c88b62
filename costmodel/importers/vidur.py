"""Vidur's per-layer operator profile (`mlp.csv`): operator times by num_tokens and TP degree; and
its network profile (`all_reduce.csv`): all-reduce times by message size and number of GPUs.

Each row of mlp.csv times one transformer layer's operators at one num_tokens; it becomes one
record per operator. The four projections are GEMMs whose (n, k) follow from the model's
dimensions and Vidur's tensor-parallel sharding; the rest are small per-token operators.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.model_spec import elementwise_widths_of, gemm_shapes_of
from stepcal.costmodel.records import check_positive, check_times, make_records, require_columns

KEY_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp",
               "num_tokens", "num_tensor_parallel_workers")
# Vidur op -> our GEMM sub-operation name (core.model_spec.gemm_shapes_of).
GEMM_OPS = {"attn_pre_proj": "qkv_proj", "attn_post_proj": "o_proj",
            "mlp_up_proj": "gate_up_proj", "mlp_down_proj": "down_proj"}
ELEMENTWISE_OPS = ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
STAT = "median"   # the statistic Vidur itself trains on


def import_table(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    """mlp.csv, or a network profile (all_reduce.csv) by its columns."""
    if f"time_stats.all_reduce.{STAT}" in frame.columns:
        return import_all_reduce(frame, path)
    return import_mlp(frame, path)


def import_all_reduce(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    """network/.../all_reduce.csv: an all-reduce of `size` bytes over `num_workers` GPUs, one row per
    rank; rank 0's rows are kept (every rank waits for the same collective). The message is
    recorded in 2-byte elements, the activations' width in fp16/bf16 serving."""
    col = f"time_stats.all_reduce.{STAT}"
    require_columns(frame, ("num_workers", "size", col), path=path, what="Vidur all_reduce.csv")
    frame = frame.reset_index(drop=True)
    check_times(frame, col, path=path)
    check_positive(frame, ("num_workers", "size"), path=path)
    if "rank" in frame.columns:
        frame = frame[frame["rank"] == 0]
    cols = dict(row=frame.index.to_numpy(), op="all_reduce", name="vidur_nccl", tp=frame["num_workers"].to_numpy(dtype=np.float64),
                num_tokens=frame["size"].to_numpy(dtype=np.float64) / 2, width=np.ones(len(frame)),
                time_ms=frame[col].to_numpy(dtype=np.float64))
    return make_records(cols, source="vidur", file=path)


def import_mlp(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    require_columns(frame, KEY_COLUMNS, path=path, what="Vidur mlp.csv")
    frame = frame.reset_index(drop=True)
    check_positive(frame, [c for c in KEY_COLUMNS if c != "use_gated_mlp"], path=path)
    ops = [op for op in (*GEMM_OPS, *ELEMENTWISE_OPS) if f"time_stats.{op}.{STAT}" in frame.columns]
    if not ops:
        raise InputError(f"{path}: not a Vidur mlp.csv file: no time_stats.<op>.{STAT} columns")
    parts = []
    for op in ops:
        col = f"time_stats.{op}.{STAT}"
        check_times(frame, col, path=path)
        parts.append(_op_records(frame, op, frame[col].to_numpy(dtype=np.float64), path))
    return pd.concat(parts, ignore_index=True)


def _op_records(frame: pd.DataFrame, op: str, time_ms: np.ndarray, path: str) -> pd.DataFrame:
    tp = frame["num_tensor_parallel_workers"].to_numpy(dtype=np.float64)
    hidden = frame["n_embd"].to_numpy(dtype=np.float64)
    heads = frame["n_head"].to_numpy(dtype=np.float64)
    head_dim = hidden / heads
    # What one GPU holds under Vidur's tensor-parallel split (KV heads: at least one).
    heads, kv_heads = heads / tp, np.maximum(frame["n_kv_head"].to_numpy(dtype=np.float64) / tp, 1.0)
    ffn = frame["n_expanded_embd"].to_numpy(dtype=np.float64) / tp
    tokens = frame["num_tokens"].to_numpy(dtype=np.float64)
    cols = dict(row=np.arange(len(frame)), num_tokens=tokens, tp=tp, time_ms=time_ms,
                num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
    if op in GEMM_OPS:
        gated = frame["use_gated_mlp"].astype(str).str.lower().isin(["true", "1", "1.0"]).to_numpy()
        vocab = frame["vocab_size"].to_numpy(dtype=np.float64) / tp
        n, k = gemm_shapes_of(hidden, heads, kv_heads, head_dim, ffn, vocab, gated)[GEMM_OPS[op]]
        cols.update(op="gemm", name=GEMM_OPS[op], m=tokens, n=n, k=k)
    else:
        cols.update(op="elementwise", name=op,
                    width=elementwise_width(op, hidden, heads, kv_heads, head_dim, ffn))
    # Vidur profiles in fp16 / bf16 alike; both are two bytes per element.
    cols["dtype"] = "bfloat16"
    return make_records(cols, source="vidur", file=path)


def elementwise_width(op, hidden, heads, kv_heads, head_dim, ffn):
    """Elements touched per token by one of Vidur's small operators (bytes = width x 2), from
    the sizes one GPU holds (heads, KV heads and FFN width after the tensor-parallel split)."""
    widths = elementwise_widths_of(hidden, heads, kv_heads, head_dim, ffn)
    return np.asarray(widths[op], dtype=np.float64) * np.ones_like(np.asarray(hidden, dtype=np.float64))
