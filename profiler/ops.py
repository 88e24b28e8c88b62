"""Kernel builders: turn a grid point into a `run(i)` to time, on the model's own code paths.

- gemm: F.linear of an [m, k] input with an [n, k] weight (what nn.Linear runs in the model).
- attn_prefill / attn_decode: `profiler.model.attend` of one layer over caches holding s_i + q_i
  tokens (the new K/V already appended, as in the model).
- step: the device part of an engine iteration (its `device_ms`: the forward and greedy sampling),
  every sequence emitting a token: timed inside a real engine held at the batch where one can be
  (decodes and fresh prefills: profiler.engine.probe), else on the engine's paged KV pool with the
  inputs built once (a chunk over a cached prefix). (Profiles from before the `host` op timed
  `forward_step` on contiguous caches, input building included.)
- overhead: the host-side input building of a step (`prepare_step`, token tensors from Python
  ints included), for b sequences.
- host: the engine's whole host path for one batch (profiler.engine.probe.EngineProbe): a real
  iteration of the engine held at the batch, its `host_ms` (schedule, input building, appending
  tokens, on_step_done): what a step costs besides the `step` op. Decodes and fresh prefills only.
- elementwise: one of the step's operators besides GEMMs and attention (norms, RoPE, activation,
  residual adds, embedding; final norm and sampling, KV stores): profiler.elementwise.
- moe: `profiler.moe.routed_experts` of one MoE layer (no router, no shared experts: what a
  fused-experts kernel computes) for m tokens routed as the point's distribution says
  (profiler.routing.routed_expert_ids), with the model's experts, top-k and widths.

Inputs are rotated through several buffer sets when `rotate_bytes` asks for it (about twice the L2
size: the GPU's, or one CPU core's) so that a small shape is not timed from a warm cache.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stepcal.core.model_spec import ModelSpec
from stepcal.profiler.batches import is_probe_batch
from stepcal.profiler.elementwise import KV_STORE_CONTEXT, elementwise_run
from stepcal.profiler.engine.paged import held_batch
from stepcal.profiler.engine.probe import EngineProbe, probe_tokens
from stepcal.profiler.model import KVCache, attend, prepare_step
from stepcal.profiler.moe import routed_experts
from stepcal.profiler.op_context import OpContext
from stepcal.profiler.point import Point
from stepcal.profiler.routing import routed_expert_ids
from stepcal.profiler.serve import Workload

MAX_BUFFER_SETS = 8
STEP_BLOCK_SIZE = 16     # the engine's default KV block size (`stepcal measure`)


@dataclass
class Kernel:
    run: Callable[[int], None]
    graph_safe: bool = False        # may be captured into a CUDA graph
    host_side: bool = False         # host work: timed with perf_counter on any device
    self_timed: bool = False        # run(i) returns its own milliseconds (profiler.timing.SelfTimer)


def num_buffer_sets(set_bytes: int, rotate_bytes: int) -> int:
    """Buffer sets so that their total exceeds rotate_bytes (1 when one set already does)."""
    if rotate_bytes <= 0 or set_bytes <= 0:
        return 1
    return int(min(MAX_BUFFER_SETS, max(1, math.ceil(rotate_bytes / set_bytes))))


def build_kernel(point: Point, ctx: OpContext) -> Kernel:
    return BUILDERS[point.op](point, ctx)


def estimate_bytes(point: Point, ctx: OpContext) -> int:
    """Memory a point needs on its device (rough, on the safe side), for a pre-check."""
    spec, nbytes = ctx.spec, ctx.dtype_bytes
    if point.op == "gemm":
        set_bytes = (point.m * point.k + point.n * point.k) * nbytes
        return num_buffer_sets(set_bytes, ctx.rotate_bytes) * set_bytes + 2 * point.m * point.n * nbytes
    if point.op == "moe":
        return _moe_bytes(point, ctx)
    if point.op == "serve":
        return _serve_bytes(point, ctx)
    if point.op == "elementwise":   # the model's weights, a few activations, and for sample the logits
        weights = 0 if ctx.model_built else spec.num_params * nbytes
        width = 4 * spec.hidden_size + 2 * spec.ffn_size + spec.q_size + 2 * spec.kv_size + spec.vocab_size
        kv = point.m * (KV_STORE_CONTEXT + 1) * 2 * spec.num_layers * spec.kv_size * nbytes
        return weights + point.m * width * nbytes + (kv if point.name == "kv_store" else 0)
    tokens, kv_tokens = point.num_tokens, point.kv_tokens
    if point.op in ("attn_prefill", "attn_decode", "overhead"):
        set_bytes = kv_tokens * 2 * spec.kv_size * nbytes + tokens * spec.q_size * nbytes
        masks = sum(q * (s + q) for q, s in zip(point.q_lens, point.kv_lens) if q > 1 and s > 0)
        sets = num_buffer_sets(set_bytes, ctx.rotate_bytes) if point.op != "overhead" else 1
        return sets * set_bytes + 2 * tokens * spec.q_size * nbytes + masks
    weights = 0 if ctx.model_built else spec.num_params * nbytes
    if point.op in ("host", "step") and is_probe_batch(point.q_lens, point.kv_lens):
        kv_tokens, tokens = probe_tokens(point.q_lens, point.kv_lens)   # a whole engine: its pool, its largest step
    kv = kv_tokens * 2 * spec.num_layers * spec.kv_size * nbytes
    activations = activation_bytes(spec, tokens, nbytes)
    masks = sum(q * (s + q) for q, s in zip(point.q_lens, point.kv_lens) if q > 1 and s > 0)
    return weights + kv + 2 * activations + len(point.q_lens) * spec.vocab_size * 4 + masks


def _serve_bytes(point: Point, ctx: OpContext) -> int:
    """A served workload: the weights, its K/V twice (the engine's pool and, on the CPU, each request's
    read copy) and the activations of its largest step (every prompt in flight at once)."""
    spec, nbytes, workload = ctx.spec, ctx.dtype_bytes, Workload.parse(point.name)
    weights = 0 if ctx.model_built else spec.num_params * nbytes
    kv = workload.max_tokens_in_flight() * 2 * spec.num_layers * spec.kv_size * nbytes
    activations = activation_bytes(spec, workload.concurrency * workload.prompt[1], nbytes)
    return weights + 2 * kv + 2 * activations + workload.concurrency * spec.vocab_size * 4


def activation_bytes(spec: ModelSpec, num_tokens: int, nbytes: int) -> int:
    """One layer's activations of a step of num_tokens tokens: residual, norms, attention's q/k/v
    and output, the FFN's widest moment."""
    return num_tokens * (4 * spec.hidden_size + ffn_activation_width(spec) + spec.q_size + 2 * spec.kv_size) * nbytes


def ffn_activation_width(spec: ModelSpec) -> int:
    """Elements per token an FFN holds at once: a dense SwiGLU's gate, up and product, or a MoE
    layer's router scores, top-k gathered inputs, gates, ups, products and outputs, plus the
    shared experts' SwiGLU; the larger where a model has both kinds of layer."""
    widths = [3 * spec.ffn_size] if spec.num_ffn_dense_layers else []
    if spec.is_moe:
        shared = 3 * spec.num_shared_experts * spec.expert_ffn_size
        routed = spec.experts_per_token * (2 * spec.hidden_size + 3 * spec.expert_ffn_size)
        widths.append(spec.num_experts + routed + spec.hidden_size + shared)
    return max(widths)


def _moe_set_bytes(spec: ModelSpec, num_tokens: int, nbytes: int) -> int:
    """One buffer set of the moe op: the tokens' inputs and every expert's weights."""
    return (num_tokens * spec.hidden_size + 3 * spec.num_experts * spec.hidden_size * spec.expert_ffn_size) * nbytes


def _moe_bytes(point: Point, ctx: OpContext) -> int:
    spec, nbytes, tokens = ctx.spec, ctx.dtype_bytes, point.m
    set_bytes = _moe_set_bytes(spec, tokens, nbytes)
    slots = tokens * spec.experts_per_token
    # Per slot: gathered input, gate and up, product, expert output; int64 ids, order, rows.
    work = slots * ((2 * spec.hidden_size + 3 * spec.expert_ffn_size) * nbytes + 3 * 8)
    return num_buffer_sets(set_bytes, ctx.rotate_bytes) * set_bytes + work + tokens * spec.hidden_size * nbytes


def _gemm(point: Point, ctx: OpContext) -> Kernel:
    gen, dev, dt = ctx.generator(point), ctx.device, ctx.torch_dtype
    set_bytes = (point.m * point.k + point.n * point.k) * ctx.dtype_bytes
    sets = num_buffer_sets(set_bytes, ctx.rotate_bytes)
    xs = [_randn((point.m, point.k), gen, dev, dt) for _ in range(sets)]
    ws = [_randn((point.n, point.k), gen, dev, dt, scale=point.k ** -0.5) for _ in range(sets)]

    def run(i: int) -> None:
        F.linear(xs[i % sets], ws[i % sets])

    return Kernel(run, graph_safe=True)


def _attention(point: Point, ctx: OpContext) -> Kernel:
    """One layer's attention of the batch over caches of s_i + q_i tokens."""
    spec, gen = ctx.spec, ctx.generator(point)
    set_bytes = point.kv_tokens * 2 * spec.kv_size * ctx.dtype_bytes
    sets = num_buffer_sets(set_bytes, ctx.rotate_bytes)
    queries, inputs = [], []
    for _ in range(sets):
        caches = []
        for q, s in zip(point.q_lens, point.kv_lens):
            cache = KVCache(1, spec.num_kv_heads, spec.head_dim, dtype=ctx.torch_dtype,
                            device=ctx.device, capacity=s + q)
            cache.fill_random(s + q, gen)      # the chunk's own K/V are appended already
            cache.truncate(s)
            caches.append(cache)
        ids = [torch.zeros(q, dtype=torch.long) for q in point.q_lens]
        inputs.append(prepare_step(ids, caches, [True] * len(caches), ctx.device))
        queries.append(_randn((point.num_tokens, spec.num_heads, spec.head_dim), gen, ctx.device,
                              ctx.torch_dtype))

    def run(i: int) -> None:
        attend(queries[i % sets], 0, inputs[i % sets])

    return Kernel(run, graph_safe=True)


def _step(point: Point, ctx: OpContext) -> Kernel:
    """The engine's device work of one iteration (its device_ms): timed inside a real engine held at
    the batch where one can be (profiler.engine.probe), else on the engine's own KV pool."""
    if is_probe_batch(point.q_lens, point.kv_lens):
        return Kernel(EngineProbe(ctx.model(), point.q_lens, point.kv_lens, part="device"), self_timed=True)
    return _paged_step(point, ctx)


def _paged_step(point: Point, ctx: OpContext) -> Kernel:
    """The engine's device work of one iteration outside an engine: its paged KV pool (stores into the blocks, and on
    the CPU into each sequence's read copy, which attention reads; a gather of the blocks on CUDA),
    the forward and greedy sampling, in a tight loop: 5-10% faster than inside the engine on the
    CPU (on contiguous caches, 11-22%: tiny, 1 to 16 decodes, interleaved in one process)."""
    model, q_lens, kv_lens = ctx.model(), list(point.q_lens), list(point.kv_lens)
    # Inputs are built once: building them is host work, the `host` op's (as in the engine, whose
    # device_ms is the forward and the sampling only).
    inputs, copies = held_batch(model, q_lens, kv_lens, STEP_BLOCK_SIZE, ctx.generator(point))

    def run(i: int) -> None:
        for copy, s in zip(copies, kv_lens):
            copy.length = s                    # rewind: every call sees the same batch
        model.run_step(inputs).argmax(dim=-1)   # greedy sampling, as the engine does

    return Kernel(run)


def _overhead(point: Point, ctx: OpContext) -> Kernel:
    """Token tensors from Python ints, positions, masks, emit rows, copies to the device."""
    spec = ctx.spec
    caches = []
    for q, s in zip(point.q_lens, point.kv_lens):
        cache = KVCache(1, spec.num_kv_heads, spec.head_dim, dtype=ctx.torch_dtype,
                        device=ctx.device, capacity=s + q)
        cache.length = s                       # contents are never read
        caches.append(cache)
    token_lists = [[(7 * j + 3) % spec.vocab_size for j in range(q)] for q in point.q_lens]
    emit = [True] * len(caches)

    def run(i: int) -> None:
        ids = [torch.tensor(t, dtype=torch.long) for t in token_lists]
        prepare_step(ids, caches, emit, ctx.device)

    return Kernel(run, host_side=True)


def _host(point: Point, ctx: OpContext) -> Kernel:
    """One real engine iteration at the point's batch; the kernel returns its host ms itself."""
    return Kernel(EngineProbe(ctx.model(), point.q_lens, point.kv_lens, part="host"), self_timed=True)


def _moe(point: Point, ctx: OpContext) -> Kernel:
    """One MoE layer's routed experts over the point's tokens and routing."""
    spec, gen, dev, dt = ctx.spec, ctx.generator(point), ctx.device, ctx.torch_dtype
    experts, hidden, ffn, top_k = spec.num_experts, spec.hidden_size, spec.expert_ffn_size, spec.experts_per_token
    sets = num_buffer_sets(_moe_set_bytes(spec, point.m, ctx.dtype_bytes), ctx.rotate_bytes)
    xs = [_randn((point.m, hidden), gen, dev, dt) for _ in range(sets)]
    gate_ups = [_randn((experts, 2 * ffn, hidden), gen, dev, dt, scale=hidden ** -0.5) for _ in range(sets)]
    downs = [_randn((experts, hidden, ffn), gen, dev, dt, scale=ffn ** -0.5) for _ in range(sets)]
    ids = torch.from_numpy(routed_expert_ids(point.name, point.m, experts, top_k)).to(dev)
    # Equal weights: the kernel's work does not depend on their values.
    weights = torch.full((point.m, top_k), 1.0 / top_k, dtype=dt, device=dev)

    def run(i: int) -> None:
        routed_experts(xs[i % sets], ids, weights, gate_ups[i % sets], downs[i % sets])

    # Not graph-safe: the host reads how many tokens each expert got, as the model does.
    return Kernel(run)


def _randn(shape, gen: torch.Generator, device, dtype, scale: float = 1.0) -> torch.Tensor:
    """Seeded normals. On CUDA they are drawn on the device (an 8B LM head is a gigabyte),
    seeded from the CPU generator so that a point's inputs do not depend on earlier points."""
    if str(device).startswith("cuda"):
        dev_gen = torch.Generator(device=device).manual_seed(int(torch.randint(2**31, (1,), generator=gen)))
        return torch.randn(shape, generator=dev_gen, device=device, dtype=dtype) * scale
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def _elementwise(point: Point, ctx: OpContext) -> Kernel:
    """A step's work besides GEMMs and attention, one operator (profiler.elementwise)."""
    return Kernel(elementwise_run(point, ctx, STEP_BLOCK_SIZE))


BUILDERS = {"gemm": _gemm, "attn_prefill": _attention, "attn_decode": _attention,
            "step": _step, "overhead": _overhead, "host": _host, "moe": _moe, "elementwise": _elementwise}
