"""Attention terms of T_step: decode by batch and mean KV length, prefill by new tokens and mean
context, from the regressor of the model's attention kind (GQA: attn_*, MLA: mla_*)."""
from __future__ import annotations

import numpy as np

from stepcal.core.model_spec import ModelSpec, Parallelism
from stepcal.costmodel.grid_predict import predict_grid
from stepcal.costmodel.terms import DecodeAttention, DecodeSkew, MixedDecodeAttention, PrefillAttention, Term

MIXED_DECODE_TARGET = "attn_decode_mixed"   # decodes' attention when a prefill shares the kernel call


def attention_targets(spec: ModelSpec) -> tuple[str, str]:
    """(decode, prefill) targets for the model's attention kind."""
    return ("mla_decode", "mla_prefill") if spec.is_mla else ("attn_decode", "attn_prefill")


def attention_terms(result, spec: ModelSpec, parallelism: Parallelism, axes,
                    skew_alpha: float | None = None) -> list[Term]:
    decode, prefill = attention_targets(spec)
    terms = []
    if decode in result.targets:
        terms += _decode_terms(result, decode, spec, parallelism, axes, skew_alpha)
    if prefill in result.targets:
        terms.append(_prefill_term(result, prefill, spec, parallelism, axes))
    return terms


def _heads(spec: ModelSpec, parallelism: Parallelism, n: int) -> dict:
    """Attention's head columns for n grid points: the heads one GPU holds. MLA's tables give
    query heads only (its latent is shared by them) and the tensor-parallel degree."""
    heads = np.full(n, float(parallelism.split(spec.num_heads)))
    if spec.is_mla:
        return dict(num_heads=heads, tp=np.full(n, float(parallelism.tp)))
    return dict(num_heads=heads, num_kv_heads=np.full(n, float(parallelism.kv_heads(spec.num_kv_heads))),
                head_dim=np.full(n, float(spec.head_dim)))


def _decode_predictions(result, target: str, spec: ModelSpec, parallelism: Parallelism, axes):
    """One layer's decode attention of `target` (mean, spread) on the (num_decode, kv_mean) grid."""
    b, kv = np.meshgrid(axes.num_decode, axes.kv_mean, indexing="ij")
    b, kv = b.ravel(), kv.ravel()
    zeros = np.zeros(len(b))
    return predict_grid(result, target, dict(
        row=np.arange(len(b)), op=target, num_seqs=b, num_tokens=b, num_decode=b,
        decode_kv_sum=b * kv, decode_kv_max=kv, prefill_tokens=zeros, prefill_attn_work=zeros,
        kv_sum=b * kv, **_heads(spec, parallelism, len(b))), spec.kv_dtype or spec.dtype)


def _decode_terms(result, decode: str, spec: ModelSpec, parallelism: Parallelism, axes,
                  skew_alpha: float | None) -> list[Term]:
    """decode_attn, and where the data and composition give them decode_attn_skew and mixed_decode_attn:
    both read the pure decode grid, predicted once."""
    knots = (axes.num_decode, axes.kv_mean)
    pure, pure_spread = _decode_predictions(result, decode, spec, parallelism, axes)
    terms = [_layers_grid(DecodeAttention, "decode_attn", knots, pure, pure_spread, spec,
                          "decode attention by batch and mean KV length")]
    if skew_alpha is not None:
        grid = terms[0]
        terms.append(DecodeSkew("decode_attn_skew", grid.knots, skew_alpha * grid.time_ms,
                                abs(skew_alpha) * grid.spread_ms,
                                f"{skew_alpha:g} x (decode attention at the batch's longest KV - at its mean "
                                "KV): KV lengths that differ within a batch", alpha=skew_alpha))
    if MIXED_DECODE_TARGET in result.targets and not spec.is_mla:
        # The mixed call's decodes less the pure decode call: what a prefill in the step adds to them.
        mixed, mixed_spread = _decode_predictions(result, MIXED_DECODE_TARGET, spec, parallelism, axes)
        terms.append(_layers_grid(MixedDecodeAttention, "mixed_decode_attn", knots, mixed - pure,
                                  np.hypot(mixed_spread, pure_spread), spec,
                                  "decode attention's extra when a prefill shares the kernel call (mixed less "
                                  "pure decode), by batch and mean KV length; zero without prefill tokens"))
    return terms


def _prefill_term(result, target: str, spec: ModelSpec, parallelism: Parallelism, axes) -> Term:
    T, c = np.meshgrid(axes.prefill_tokens, axes.prefill_ctx, indexing="ij")
    T, c = T.ravel(), c.ravel()
    # A representative batch with T new tokens attending to c tokens each on average: one
    # sequence over a cached prefix when c is long enough, else equal prompts from scratch.
    one = c >= (T + 1) / 2
    q = np.where(one, T, np.maximum(2 * c - 1, 1))
    seqs = np.where(one, 1.0, T / q)
    kv = np.where(one, c - (T + 1) / 2, 0.0)
    zeros = np.zeros(len(T))
    mean, spread = predict_grid(result, target, dict(
        row=np.arange(len(T)), op=target, num_seqs=seqs, num_tokens=T, num_decode=zeros,
        decode_kv_sum=zeros, decode_kv_max=zeros, prefill_tokens=T, prefill_attn_work=T * c,
        kv_sum=seqs * kv, **_heads(spec, parallelism, len(T))), spec.kv_dtype or spec.dtype)
    return _layers_grid(PrefillAttention, "prefill_attn", (axes.prefill_tokens, axes.prefill_ctx), mean, spread,
                        spec, "prefill attention by new tokens and mean context")


def _layers_grid(kind, name: str, knots: tuple, mean, spread, spec: ModelSpec, what: str) -> Term:
    """One layer's predictions on the 2-D grid `knots`, times every layer."""
    shape = tuple(len(k) for k in knots)
    L = spec.num_layers
    return kind(name, knots, L * mean.reshape(shape), L * spread.reshape(shape),
                f"{L} layers x {spec.attention.upper()} {what}")
