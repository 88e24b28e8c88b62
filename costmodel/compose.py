"""Composition: the T_step terms of a model on a device, from per-operator regressors.

T_step(batch) = layers × (GEMMs at Σq tokens + small per-token ops + attention) + LM head
+ overhead, and under tensor parallelism two all-reduces per layer. Each term is evaluated on a
grid (costmodel.tables looks it up); grid points past the profiled range take the regressor's
own extrapolation (linear in FLOPs and bytes for the physics-informed family).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from costmodel import grid
from costmodel.features import design
from costmodel.fitting import FitResult
from costmodel.importers.vidur import elementwise_width
from costmodel.records import make_records
from costmodel.regressors import predict_with_spread
from costmodel.terms import DecodeAttention, FeatureCurve, PrefillAttention, Term
from simulator.model_spec import ModelSpec, Parallelism

LAYER_GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# Vidur's per-layer small operators; `emb` runs once per step, not per layer.
PER_LAYER_ELEMENTWISE = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")


@dataclass(frozen=True)
class Axes:
    num_tokens: np.ndarray
    num_seqs: np.ndarray
    kv_mean: np.ndarray
    prefill_tokens: np.ndarray
    prefill_ctx: np.ndarray

    @classmethod
    def default(cls) -> Axes:
        return cls(num_tokens=grid.axis(1, 65536, 72), num_seqs=grid.axis(1, 4096, 40),
                   kv_mean=grid.axis(1, 131072, 36), prefill_tokens=grid.axis(1, 65536, 36),
                   prefill_ctx=grid.axis(1, 131072, 36))


def _elementwise_width(name: str, spec: ModelSpec, parallelism: Parallelism) -> float:
    """Elements per token one GPU's copy of a small per-layer operator touches."""
    p = parallelism
    return float(elementwise_width(name, spec.hidden_size, p.split(spec.num_heads),
                                   p.kv_heads(spec.num_kv_heads), spec.head_dim,
                                   p.split(spec.ffn_size)))


def predict_records(result: FitResult, target: str, columns: dict, dtype: str):
    fit = result.targets[target]
    frame = make_records({**columns, "dtype": dtype}, source="grid", file="grid")
    d = design(target, frame)
    return predict_with_spread(fit.estimator, d.X)


def op_grids(result: FitResult, spec: ModelSpec, parallelism: Parallelism,
             axes: Axes) -> pd.DataFrame:
    """Per-layer time of each operator over num_tokens (the layout Vidur's mlp.csv takes)."""
    T = axes.num_tokens
    parts = []
    if "gemm" in result.targets:
        shapes = spec.gemm_shapes(parallelism)
        for name in LAYER_GEMMS:
            n, k = shapes[name]
            mean, spread = predict_records(result, "gemm", dict(
                row=np.arange(len(T)), op="gemm", m=T, n=np.full(len(T), n), k=np.full(len(T), k)),
                spec.dtype)
            parts.append(pd.DataFrame({"op": name, "num_tokens": T, "time_ms": mean,
                                       "spread_ms": spread}))
    for name in ("emb",) + PER_LAYER_ELEMENTWISE:
        target = f"elementwise:{name}"
        if target in result.targets:
            mean, spread = predict_records(result, target, dict(
                row=np.arange(len(T)), op="elementwise", name=name, num_tokens=T,
                tp=np.full(len(T), float(parallelism.tp)),
                width=np.full(len(T), _elementwise_width(name, spec, parallelism))), spec.dtype)
            parts.append(pd.DataFrame({"op": name, "num_tokens": T, "time_ms": mean,
                                       "spread_ms": spread}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["op", "num_tokens", "time_ms", "spread_ms"])


def compose_terms(result: FitResult, spec: ModelSpec, parallelism: Parallelism, axes: Axes,
                  ops: pd.DataFrame) -> list[Term]:
    L = spec.num_layers
    terms = []
    per_layer = ops[ops["op"].isin(LAYER_GEMMS + PER_LAYER_ELEMENTWISE)]
    if len(per_layer):
        sums = per_layer.groupby("num_tokens")[["time_ms", "spread_ms"]].sum()
        once = ops[ops["op"] == "emb"].set_index("num_tokens")
        time_ms = L * sums["time_ms"].to_numpy()
        spread = L * sums["spread_ms"].to_numpy()
        if len(once):
            time_ms = time_ms + once["time_ms"].reindex(sums.index).to_numpy()
            spread = spread + once["spread_ms"].reindex(sums.index).to_numpy()
        names = sorted(set(per_layer["op"]))
        terms.append(FeatureCurve("linear", "num_tokens", sums.index.to_numpy(dtype=np.float64),
                                  time_ms, spread, f"{L} layers x ({' + '.join(names)}) at num_tokens"))
    lm = lm_head_ops(result, spec, parallelism, axes)
    if len(lm):
        # One LM-head row per sequence in the step: decodes and prompts that finish emit a token.
        terms.append(FeatureCurve("lm_head", "num_seqs", axes.num_seqs, lm["time_ms"].to_numpy(),
                                  lm["spread_ms"].to_numpy(), "LM head GEMM at one row per sequence"))
    if "attn_decode" in result.targets:
        terms.append(_decode_term(result, spec, parallelism, axes))
    if "attn_prefill" in result.targets:
        terms.append(_prefill_term(result, spec, parallelism, axes))
    if parallelism.tp > 1 and all_reduce_target(result) is not None:
        terms.append(_all_reduce_term(result, spec, parallelism, axes))
    if "overhead" in result.targets:
        B = axes.num_seqs
        mean, spread = predict_records(result, "overhead", dict(
            row=np.arange(len(B)), op="overhead", num_seqs=B, num_tokens=B), spec.dtype)
        terms.append(FeatureCurve("overhead", "num_seqs", B, mean, spread,
                                  "host overhead per step by batch size"))
    return terms


def all_reduce_target(result: FitResult) -> str | None:
    """The all-reduce regressor composition uses: a CUDA-graph implementation where profiled
    (what serving engines replay for decode steps), else the first one."""
    names = sorted(t for t in result.targets if t.split(":", 1)[0] == "all_reduce")
    graph = [t for t in names if "graph" in t]
    return (graph or names or [None])[0]


def _all_reduce_term(result, spec: ModelSpec, parallelism: Parallelism, axes: Axes) -> Term:
    """Tensor parallelism's all-reduces of the hidden state: two per layer (after the attention
    output projection and after the MLP's down projection), num_tokens x hidden elements each."""
    target = all_reduce_target(result)
    T = axes.num_tokens
    name = target.split(":", 1)[1] if ":" in target else None
    mean, spread = predict_records(result, target, dict(
        row=np.arange(len(T)), op="all_reduce", name=name, num_tokens=T,
        tp=np.full(len(T), float(parallelism.tp)),
        width=np.full(len(T), float(spec.hidden_size))), spec.dtype)
    per_step = 2 * spec.num_layers
    return FeatureCurve("all_reduce", "num_tokens", T, per_step * mean, per_step * spread,
                        f"{per_step} all-reduces ({spec.num_layers} layers x 2) of num_tokens x "
                        f"hidden over {parallelism.tp} GPUs")


def _heads(spec: ModelSpec, parallelism: Parallelism, n: int) -> dict:
    """Attention's head columns for n grid points: the heads one GPU holds."""
    return dict(num_heads=np.full(n, float(parallelism.split(spec.num_heads))),
                num_kv_heads=np.full(n, float(parallelism.kv_heads(spec.num_kv_heads))),
                head_dim=np.full(n, float(spec.head_dim)))


def _decode_term(result, spec: ModelSpec, parallelism: Parallelism, axes: Axes) -> Term:
    b, kv = np.meshgrid(axes.num_seqs, axes.kv_mean, indexing="ij")
    b, kv = b.ravel(), kv.ravel()
    zeros = np.zeros(len(b))
    mean, spread = predict_records(result, "attn_decode", dict(
        row=np.arange(len(b)), op="attn_decode", num_seqs=b, num_tokens=b, num_decode=b,
        decode_kv_sum=b * kv, decode_kv_max=kv, prefill_tokens=zeros, prefill_attn_work=zeros,
        kv_sum=b * kv, **_heads(spec, parallelism, len(b))), spec.dtype)
    shape = (len(axes.num_seqs), len(axes.kv_mean))
    return DecodeAttention("decode_attn", (axes.num_seqs, axes.kv_mean),
                           spec.num_layers * mean.reshape(shape), spec.num_layers * spread.reshape(shape),
                           f"{spec.num_layers} layers x decode attention by batch and mean KV length")


def _prefill_term(result, spec: ModelSpec, parallelism: Parallelism, axes: Axes) -> Term:
    T, c = np.meshgrid(axes.prefill_tokens, axes.prefill_ctx, indexing="ij")
    T, c = T.ravel(), c.ravel()
    # A representative batch with T new tokens attending to c tokens each on average: one
    # sequence over a cached prefix when c is long enough, else equal prompts from scratch.
    one = c >= (T + 1) / 2
    q = np.where(one, T, np.maximum(2 * c - 1, 1))
    seqs = np.where(one, 1.0, T / q)
    kv = np.where(one, c - (T + 1) / 2, 0.0)
    zeros = np.zeros(len(T))
    mean, spread = predict_records(result, "attn_prefill", dict(
        row=np.arange(len(T)), op="attn_prefill", num_seqs=seqs, num_tokens=T, num_decode=zeros,
        decode_kv_sum=zeros, decode_kv_max=zeros, prefill_tokens=T, prefill_attn_work=T * c,
        kv_sum=seqs * kv, **_heads(spec, parallelism, len(T))), spec.dtype)
    shape = (len(axes.prefill_tokens), len(axes.prefill_ctx))
    return PrefillAttention("prefill_attn", (axes.prefill_tokens, axes.prefill_ctx),
                            spec.num_layers * mean.reshape(shape), spec.num_layers * spread.reshape(shape),
                            f"{spec.num_layers} layers x prefill attention by new tokens and mean context")


def lm_head_ops(result: FitResult, spec: ModelSpec, parallelism: Parallelism,
                axes: Axes) -> pd.DataFrame:
    if "gemm" not in result.targets:
        return pd.DataFrame(columns=["op", "num_tokens", "time_ms", "spread_ms"])
    B = axes.num_seqs
    n, k = spec.gemm_shapes(parallelism)["lm_head"]
    mean, spread = predict_records(result, "gemm", dict(
        row=np.arange(len(B)), op="gemm", m=B, n=np.full(len(B), n), k=np.full(len(B), k)),
        spec.dtype)
    return pd.DataFrame({"op": "lm_head", "num_tokens": B, "time_ms": mean, "spread_ms": spread})
