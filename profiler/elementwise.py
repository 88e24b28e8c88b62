"""The `elementwise` op: a step's work besides its GEMMs and attention, timed on the model's own code.

Per token (point.m tokens, one fresh sequence), under the names Vidur's mlp.csv gives them, so
that costmodel.compose sums them as it sums Vidur's (per layer x layers, the embedding once):
- emb: the embedding lookup and the RoPE tables' rows of the step's positions (once per step);
- input_layernorm, post_attention_layernorm: a layer's two RMSNorms;
- attn_rope: the QKV output split into heads, RoPE on queries and keys;
- q_norm, k_norm: a Qwen3-style layer's per-head RMSNorms of queries and keys (ModelSpec.qk_norm);
- mlp_act: SwiGLU's silu(gate) * up (layer 0, or the first dense layer of a MoE model);
- add: a layer's residual adds, both of them (Vidur's profiler times one).
Per sequence (point.m sequences, one decode token each):
- sample: the final norm of the emitting rows and greedy sampling's argmax over their logits
  (the LM head between them is a GEMM, priced as one);
- kv_store: one layer's store of the new tokens' K/V into the engine's paged pool (and, on the
  CPU, into each sequence's read copy: profiler.engine.paged), a Python loop over sequences.

On the CPU with a small model these are about half of a decode step (2-layer `tiny`, one decode:
0.7 of 1.3 ms), mostly per-call framework cost, which no roofline gives. Inputs are random, of
the shapes the model computes; one buffer set (in a step the activations were just written: they
are in cache, unlike the weights the GEMMs rotate). On CUDA they are
timed eagerly, launches included, as our engine runs them (not replayed from a CUDA graph).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from stepcal.core.errors import InputError
from stepcal.profiler.engine.paged import held_batch
from stepcal.profiler.model import step_inputs
from stepcal.profiler.op_context import OpContext
from stepcal.profiler.point import Point

KV_STORE_CONTEXT = 64      # tokens cached per sequence of a kv_store point (a store does not read them)


def elementwise_run(point: Point, ctx: OpContext, block_size: int) -> Callable[[int], None]:
    """run(i) of one element-wise point."""
    model, gen, rows = ctx.model(), ctx.generator(point), point.m
    spec, dev, dt = ctx.spec, ctx.device, ctx.torch_dtype

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(device=dev, dtype=dt)

    if point.name == "kv_store":
        return _kv_store_run(model, rows, block_size, gen)
    if point.name == "sample":
        hidden, logits = randn(rows, spec.hidden_size), randn(rows, spec.vocab_size)
        emit_rows = torch.arange(rows, device=dev)
        return lambda i: (model.final_norm(hidden[emit_rows]), logits.argmax(dim=-1))
    layer = _layer(model, point.name)
    x = randn(rows, spec.hidden_size)
    if point.name == "emb":
        inputs = step_inputs([torch.randint(0, spec.vocab_size, (rows,), generator=gen)], [0], [True], dev, None)
        return lambda i: model.embed_tokens(inputs)
    if point.name == "input_layernorm":
        return lambda i: layer.input_norm(x)
    if point.name == "post_attention_layernorm":
        return lambda i: layer.post_attn_norm(x)
    if point.name == "attn_rope":
        qkv = randn(rows, spec.q_size + 2 * spec.kv_size)
        cos, sin = model.rotary.tables(torch.arange(rows, device=dev), rows, dt)
        return lambda i: layer.rope(qkv, cos, sin, norm_heads=False)
    if point.name in ("q_norm", "k_norm"):
        if layer.q_norm is None:
            raise InputError(f"elementwise: model spec {spec.name!r} has no per-head norms (qk_norm) to time {point.name} on")
        heads = spec.num_heads if point.name == "q_norm" else spec.num_kv_heads
        norm, by_head = getattr(layer, point.name), randn(rows, heads, spec.head_dim)
        return lambda i: norm(by_head)
    if point.name == "mlp_act":
        gate_up = randn(rows, 2 * spec.ffn_size)
        return lambda i: layer.activation(gate_up)
    if point.name == "add":
        attn_out, ffn_out = randn(rows, spec.hidden_size), randn(rows, spec.hidden_size)
        return lambda i: (x + attn_out) + ffn_out
    raise InputError(f"elementwise: unknown operator {point.name!r}")


def _layer(model, name: str):
    """The layer whose modules a per-token point times: the first with a dense FFN for mlp_act."""
    if name != "mlp_act":
        return model.layers[0]
    dense = [layer for layer in model.layers if hasattr(layer, "ffn_size")]   # a MoE layer builds experts instead
    if not dense:
        raise InputError(f"elementwise: model spec {model.spec.name!r} has no dense FFN layer to time mlp_act on")
    return dense[0]


def _kv_store_run(model, num_seqs: int, block_size: int, gen: torch.Generator) -> Callable[[int], None]:
    """One layer's store of num_seqs decode tokens, on a batch held as the engine holds it."""
    spec = model.spec
    inputs, _ = held_batch(model, [1] * num_seqs, [KV_STORE_CONTEXT] * num_seqs, block_size, gen)
    k = torch.randn(num_seqs, spec.num_kv_heads, spec.head_dim, generator=gen).to(model.device, model.dtype)
    v = torch.randn(num_seqs, spec.num_kv_heads, spec.head_dim, generator=gen).to(model.device, model.dtype)
    # A store writes at each sequence's s_i and advances nothing: every call stores the same tokens.
    return lambda i: inputs.kv.store(0, k, v, inputs)
