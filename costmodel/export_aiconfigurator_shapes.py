"""The shapes an AIConfigurator export times: one frame per kernel table in AIConfigurator's own
columns (without `latency`), on the grid of costmodel.aiconfigurator_contract.SHAPES.

GEMMs, attention and all-reduce are written on the whole grid, whatever the model: AIConfigurator
looks up the shapes of the model it is asked about, at any tensor-parallel degree. A MoE table is
written for the fitted model's expert shape only (its grid is a list of models' shapes, not a
product), at AIConfigurator's tensor and expert splits (those of the expert-parallel degree that
divide the model's experts).
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from stepcal.core.model_spec import ModelSpec
from stepcal.costmodel.aiconfigurator_contract import SHAPES, TABLES


def _frame(table: str, rows: list[tuple], columns: tuple[str, ...], **constant) -> pd.DataFrame:
    """Rows of shape columns (integers) plus constant columns (text, or integers where the contract
    says so)."""
    frame = pd.DataFrame(rows, columns=list(columns)).astype(np.int64)
    kinds = TABLES[table].columns
    for name, value in constant.items():
        frame[name] = np.int64(value) if kinds.get(name) == "int64" else str(value)
    return frame


def gemm_shapes(dtype: str) -> pd.DataFrame:
    rows = list(itertools.product(SHAPES.gemm_m, SHAPES.gemm_nk, SHAPES.gemm_nk))
    return _frame("gemm_perf", rows, ("m", "n", "k"), gemm_dtype=dtype, op_name="gemm")


def _head_pairs(prefill: bool) -> list[tuple[int, int]]:
    """(query heads, KV heads) on one GPU: grouped-query ratios, and multi-head for prefill."""
    pairs = []
    for heads in SHAPES.heads:
        kv_choices = sorted(set(SHAPES.kv_heads) | ({heads} if prefill else set()))
        pairs += [(heads, kv) for kv in kv_choices if kv <= heads and heads % kv == 0]
    return pairs


def prefill_shapes(kv_dtype: str, head_dim: int) -> pd.DataFrame:
    points = [(b, isl) for b in SHAPES.prefill_batch for isl in SHAPES.prefill_isl
              if b * isl <= SHAPES.prefill_max_tokens]
    rows = [(b, isl, h, kv, head_dim, 0) for h, kv in _head_pairs(True) for b, isl in points]
    return _frame("context_attention_perf", rows,
                  ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "step"),
                  beam_width=1, attn_dtype="bfloat16", kv_cache_dtype=kv_dtype, op_name="context_attention")


def decode_shapes(kv_dtype: str, head_dim: int) -> pd.DataFrame:
    points = [(b, s) for b in SHAPES.decode_batch for s in SHAPES.decode_step
              if b * (s + 1) <= SHAPES.decode_max_tokens]
    rows = [(b, 1, h, kv, head_dim, s) for h, kv in _head_pairs(False) for b, s in points]
    return _frame("generation_attention_perf", rows,
                  ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "step"),
                  beam_width=1, attn_dtype="bfloat16", kv_cache_dtype=kv_dtype, op_name="generation_attention")


def allreduce_shapes(backend: str, dtype: str) -> pd.DataFrame:
    rows = list(itertools.product(SHAPES.allreduce_gpus, SHAPES.allreduce_sizes))
    return _frame("custom_allreduce_perf", rows, ("num_gpus", "message_size"), allreduce_dtype=dtype,
                  backend=backend, op_name="all_reduce")


def moe_shapes(spec: ModelSpec, distribution: str, dtype: str) -> pd.DataFrame:
    """The model's expert shape on AIConfigurator's splits: experts split by tensor parallelism
    (moe_tp_size), or by expert parallelism (moe_ep_size, where it divides the experts)."""
    splits = [(tp, 1) for tp in SHAPES.moe_tp] + [(1, ep) for ep in SHAPES.moe_ep
                                                   if ep > 1 and spec.num_experts % ep == 0]
    rows = [(t, spec.hidden_size, spec.expert_ffn_size, spec.experts_per_token, spec.num_experts, tp, ep)
            for tp, ep in splits for t in SHAPES.moe_tokens]
    return _frame("moe_perf", rows, ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                                     "moe_tp_size", "moe_ep_size"),
                  moe_dtype=dtype, distribution=distribution, op_name="moe")


def _mla_heads() -> list[tuple[int, int]]:
    heads = sorted({h for total in SHAPES.mla_heads_x_tp for h in (1, 2, 4, 8, 16, 32, 64, 128) if h <= total})
    return [(h, total // h) for h in heads for total in SHAPES.mla_heads_x_tp if h <= total]


def mla_prefill_shapes(kv_dtype: str) -> pd.DataFrame:
    points = [(b, isl) for b in SHAPES.prefill_batch for isl in SHAPES.prefill_isl + (32768,)
              if b * isl <= SHAPES.mla_prefill_max_tokens]
    rows = [(h, b, isl, tp, 0) for h, tp in _mla_heads() for b, isl in points]
    return _frame("context_mla_perf", rows, ("num_heads", "batch_size", "isl", "tp_size", "step"),
                  mla_dtype="bfloat16", kv_cache_dtype=kv_dtype, op_name="context_mla")


def mla_decode_shapes(kv_dtype: str) -> pd.DataFrame:
    points = [(b, s) for b in SHAPES.mla_decode_batch for s in SHAPES.mla_decode_step
              if b * (s + 1) <= SHAPES.mla_decode_max_tokens]
    rows = [(h, b, 1, tp, s) for h, tp in _mla_heads() for b, s in points]
    return _frame("generation_mla_perf", rows, ("num_heads", "batch_size", "isl", "tp_size", "step"),
                  mla_dtype="bfloat16", kv_cache_dtype=kv_dtype, op_name="generation_mla")
