"""A plain torch Llama-style decoder, run one step batch at a time over a KV store.

The profiler times it (op `step`) and the engine serves requests with it, so both measure the
same code. One step: request i brings q_i new tokens at positions s_i .. s_i+q_i-1 over the s_i
tokens already in its cache. The GEMMs run over all new tokens of the batch at once; attention
runs per sequence (causal within the new chunk, full over the cache) after the new K/V are
stored; the LM head runs only for the rows that emit a token. In a mixture-of-experts model the
layers after the first num_dense_layers route each token to its top-k experts (profiler.moe);
MLA attention is not implemented.

Where K/V live is a StepKV: one contiguous KVCache per sequence (the profiler's synthetic
batches, `prepare_step`), or the engine's paged pool read through block tables
(profiler.engine.paged, `step_inputs`). Both hand attention the same [1, kv_heads, s+q, head_dim]
tensors, so a sequence's outputs do not depend on which one holds its cache.

Weights are random (from a seed): the timings and the engine's scheduling do not depend on
what the model says, only on its shapes.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.bias import CausalBias, causal_lower_right

from stepcal.core.errors import InputError
from stepcal.core.model_spec import ModelSpec
from stepcal.profiler.moe import MoEFFN, RoutedExperts

TORCH_DTYPES = {"float32": torch.float32, "fp32": torch.float32,
                "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16}
FILL_BLOCK = 256   # tokens of random K/V tiled by KVCache.fill_random


def torch_dtype(name: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise InputError(f"--dtype: {name!r} is not supported by the torch model; "
                         f"known: {', '.join(TORCH_DTYPES)}") from None


def default_dtype(device: str) -> str:
    """float32 on the CPU (bf16 matmuls are slow there), bfloat16 on CUDA."""
    return "bfloat16" if str(device).startswith("cuda") else "float32"


class KVCache:
    """One request's keys and values for every layer: k, v of shape [layers, kv_heads, capacity, head_dim].

    `length` tokens are valid. The capacity grows (doubling) when a step needs more room.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device | str, capacity: int = 0) -> None:
        self.shape = (num_layers, num_kv_heads, head_dim)
        self.dtype = dtype
        self.device = torch.device(device)
        self.length = 0
        self.k = self._empty(capacity)
        self.v = self._empty(capacity)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def num_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def _empty(self, capacity: int) -> Tensor:
        layers, kv_heads, head_dim = self.shape
        return torch.empty(layers, kv_heads, capacity, head_dim, dtype=self.dtype, device=self.device)

    def reserve(self, num_tokens: int) -> None:
        """Make room for num_tokens tokens in total, keeping the valid ones."""
        if num_tokens <= self.capacity:
            return
        new_capacity = max(num_tokens, 2 * self.capacity, 16)
        k, v = self._empty(new_capacity), self._empty(new_capacity)
        k[:, :, :self.length] = self.k[:, :, :self.length]
        v[:, :, :self.length] = self.v[:, :, :self.length]
        self.k, self.v = k, v

    def truncate(self, num_tokens: int) -> None:
        """Forget every token after the first num_tokens (memory is kept for reuse)."""
        if not 0 <= num_tokens <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {num_tokens}")
        self.length = num_tokens

    def reset(self, *, free: bool = False) -> None:
        """Empty the cache, e.g. for a request preempted and later recomputed."""
        self.length = 0
        if free:
            self.k, self.v = self._empty(0), self._empty(0)

    def fill_random(self, num_tokens: int, generator: torch.Generator | None = None) -> None:
        """Pretend num_tokens tokens were already processed (random K/V): for synthetic batches.

        A block of FILL_BLOCK random tokens is tiled: as good as fresh noise for timing, and
        filling gigabytes of cache stays cheap.
        """
        self.reserve(num_tokens)
        layers, kv_heads, head_dim = self.shape
        # Drawn on the cache's device (an 8B model's block is 32 MB), seeded from `generator`.
        device_gen = torch.Generator(device=self.device)
        if generator is not None:
            device_gen.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        else:
            device_gen.seed()
        for t in (self.k, self.v):
            block = torch.randn(layers, kv_heads, min(num_tokens, FILL_BLOCK), head_dim,
                                generator=device_gen, device=self.device).to(self.dtype)
            for start in range(0, num_tokens, FILL_BLOCK):
                size = min(FILL_BLOCK, num_tokens - start)
                t[:, :, start:start + size] = block[:, :, :size]
        self.length = num_tokens


@dataclass
class StepInputs:
    """Everything one forward step needs, built on the host (its cost is the `overhead` op)."""
    token_ids: Tensor            # [T] all new tokens, sequence after sequence
    positions: Tensor            # [T] position of each new token in its sequence
    seq_rows: list[int]          # first row of sequence i in the concatenated tokens
    q_lens: list[int]            # new tokens of sequence i
    kv_lens: list[int]           # tokens in sequence i's cache before this step
    masks: list                  # causal mask of a chunk over a non-empty cache, else None
    emit_rows: Tensor            # [num_emit] rows whose logits are returned
    kv: StepKV                   # where the step stores new K/V and reads each sequence's


class StepKV(Protocol):
    """Where one step's attention stores the new K/V and finds every sequence's K/V.

    Each layer stores first, then reads: a sequence may read K/V that another sequence of the
    same step stores (a prefix cached by a request admitted in the same step)."""

    def store(self, layer: int, k: Tensor, v: Tensor, inputs: StepInputs) -> None:
        """k, v: [T, kv_heads, head_dim], the new tokens in batch order."""

    def sequences(self, layer: int, inputs: StepInputs) -> Sequence[tuple[Tensor, Tensor]]:
        """Per sequence, its keys and values [1, kv_heads, s+q, head_dim] (the new tokens stored)."""

    def advance(self, inputs: StepInputs) -> None:
        """After the step: the new tokens count as cached."""


@dataclass
class ContiguousKV:
    """A StepKV over one contiguous KVCache per sequence."""
    caches: list[KVCache]

    def store(self, layer: int, k: Tensor, v: Tensor, inputs: StepInputs) -> None:
        for row, q_len, kv_len, cache in zip(inputs.seq_rows, inputs.q_lens, inputs.kv_lens, self.caches):
            cache.k[layer, :, kv_len:kv_len + q_len] = k[row:row + q_len].transpose(0, 1)
            cache.v[layer, :, kv_len:kv_len + q_len] = v[row:row + q_len].transpose(0, 1)

    def sequences(self, layer: int, inputs: StepInputs) -> list[tuple[Tensor, Tensor]]:
        return [(cache.k[layer, :, :s + q][None], cache.v[layer, :, :s + q][None])
                for cache, s, q in zip(self.caches, inputs.kv_lens, inputs.q_lens)]

    def advance(self, inputs: StepInputs) -> None:
        for cache, s, q in zip(self.caches, inputs.kv_lens, inputs.q_lens):
            cache.length = s + q


def causal_chunk_mask(q_len: int, kv_len: int, device) -> Tensor | CausalBias | None:
    """Query j (position kv_len + j) sees keys 0 .. kv_len + j. None where SDPA needs no mask.

    On the CPU an explicit boolean mask (what SDPA would build anyway); on CUDA torch's
    lower-right causal bias, which lets SDPA keep its flash kernel for a chunk over a prefix.
    """
    if q_len == 1 or kv_len == 0:
        return None
    if torch.device(device).type == "cuda":
        return causal_lower_right(q_len, kv_len + q_len)
    key_pos = torch.arange(kv_len + q_len, device=device)
    query_pos = torch.arange(kv_len, kv_len + q_len, device=device)
    return key_pos[None, :] <= query_pos[:, None]


def prepare_step(token_ids: list[Tensor], caches: list[KVCache], emit: list[bool],
                 device: torch.device | str) -> StepInputs:
    """Host-side input building over contiguous caches (grown to fit the step)."""
    if len(caches) != len(token_ids):
        raise ValueError("token_ids, caches and emit must be non-empty lists of the same length")
    kv_lens = [c.length for c in caches]
    inputs = step_inputs(token_ids, kv_lens, emit, device, ContiguousKV(list(caches)))
    for cache, s, q in zip(caches, kv_lens, inputs.q_lens):
        cache.reserve(s + q)
    return inputs


def step_inputs(token_ids: list[Tensor], kv_lens: list[int], emit: list[bool], device: torch.device | str,
                kv: StepKV) -> StepInputs:
    """Host-side input building: concatenated ids, positions, masks, emit rows, over any StepKV."""
    if not (len(token_ids) == len(kv_lens) == len(emit)) or not token_ids:
        raise ValueError("token_ids, kv_lens and emit must be non-empty lists of the same length")
    q_lens = [int(t.numel()) for t in token_ids]
    if min(q_lens) < 1:
        raise ValueError("every sequence of a step needs at least one new token")
    seq_rows, row = [], 0
    for q_len in q_lens:
        seq_rows.append(row)
        row += q_len
    positions = torch.cat([torch.arange(s, s + q) for s, q in zip(kv_lens, q_lens)])
    emit_rows = torch.tensor([r + q - 1 for r, q, e in zip(seq_rows, q_lens, emit) if e],
                             dtype=torch.long)
    return StepInputs(
        token_ids=torch.cat([t.reshape(-1) for t in token_ids]).to(device, non_blocking=True),
        positions=positions.to(device, non_blocking=True),
        seq_rows=seq_rows, q_lens=q_lens, kv_lens=list(kv_lens),
        masks=[causal_chunk_mask(q, s, device) for q, s in zip(q_lens, kv_lens)],
        emit_rows=emit_rows.to(device, non_blocking=True), kv=kv)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-5, *, dtype=None, device=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in float32, as Llama does, so bf16 keeps its accuracy.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Rotary:
    """cos/sin tables of RoPE (rotate-half form), grown on demand."""

    def __init__(self, head_dim: int, theta: float, device) -> None:
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
        self.cos = self.sin = torch.empty(0, head_dim, device=device)

    def tables(self, positions: Tensor, num_positions: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """num_positions: 1 + the largest position (known on the host, so no device sync)."""
        needed = num_positions
        if needed > self.cos.shape[0]:
            size = max(needed, 2 * self.cos.shape[0], 256)
            t = torch.arange(size, device=self.inv_freq.device).float()
            freqs = torch.outer(t, self.inv_freq)
            emb = torch.cat([freqs, freqs], dim=-1)
            self.cos, self.sin = emb.cos(), emb.sin()
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [T, heads, head_dim]; cos, sin: [T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def attend(q: Tensor, layer: int, inputs: StepInputs) -> Tensor:
    """Attention of every sequence over its cache (new K/V already stored).

    q: [T, heads, head_dim] -> [T, heads, head_dim]. GQA: SDPA expands the KV heads.
    """
    out = torch.empty_like(q)
    for row, q_len, kv_len, mask, (keys, values) in zip(inputs.seq_rows, inputs.q_lens, inputs.kv_lens,
                                                        inputs.masks, inputs.kv.sequences(layer, inputs)):
        qi = q[row:row + q_len].transpose(0, 1)[None]          # [1, H, q, D]: SDPA's fused kernels want 4-D
        causal = q_len > 1 and kv_len == 0
        o = F.scaled_dot_product_attention(qi, keys, values, attn_mask=mask, is_causal=causal,
                                           enable_gqa=True)
        out[row:row + q_len] = o[0].transpose(0, 1)
    return out


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, index: int, *, dtype, device) -> None:
        super().__init__()
        self.index = index
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = spec.q_size, spec.kv_size
        kw = {"dtype": dtype, "device": device, "bias": False}
        self.input_norm = RMSNorm(spec.hidden_size, dtype=dtype, device=device)
        self.qkv_proj = nn.Linear(spec.hidden_size, spec.q_size + 2 * spec.kv_size, **kw)
        self.o_proj = nn.Linear(spec.q_size, spec.hidden_size, **kw)
        self.post_attn_norm = RMSNorm(spec.hidden_size, dtype=dtype, device=device)
        # Qwen3's per-head norms of queries and keys, before RoPE (ModelSpec.qk_norm)
        self.q_norm = RMSNorm(spec.head_dim, dtype=dtype, device=device) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, dtype=dtype, device=device) if spec.qk_norm else None
        self._build_ffn(spec, kw)

    def _build_ffn(self, spec: ModelSpec, kw: dict) -> None:
        """The dense SwiGLU FFN (a MoE layer builds its experts instead)."""
        self.ffn_size = spec.ffn_size
        self.gate_up_proj = nn.Linear(spec.hidden_size, 2 * spec.ffn_size, **kw)
        self.down_proj = nn.Linear(spec.ffn_size, spec.hidden_size, **kw)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, inputs: StepInputs) -> Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.rope(self.qkv_proj(self.input_norm(x)), cos, sin)
        inputs.kv.store(self.index, k, v, inputs)
        attn = attend(q, self.index, inputs).reshape(num_tokens, self.q_size)
        x = x + self.o_proj(attn)
        return x + self.ffn(self.post_attn_norm(x))

    def rope(self, qkv: Tensor, cos: Tensor, sin: Tensor, norm_heads: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """The QKV projection's output split into heads, RoPE on queries and keys; each head
        RMS-normalised first where the model does (`norm_heads=False` leaves that out: the profiler
        times RoPE and the head norms apart)."""
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and norm_heads:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        return q, k, v.view(num_tokens, self.num_kv_heads, self.head_dim)

    def ffn(self, h: Tensor) -> Tensor:
        return self.down_proj(self.activation(self.gate_up_proj(h)))

    def activation(self, gate_up: Tensor) -> Tensor:
        """SwiGLU's element-wise part: silu(gate) * up."""
        gate, up = gate_up.split(self.ffn_size, dim=-1)
        return F.silu(gate) * up


class MoEDecoderLayer(DecoderLayer):
    """A decoder layer whose FFN is a mixture of experts (profiler.moe)."""

    def _build_ffn(self, spec: ModelSpec, kw: dict) -> None:
        self.moe = MoEFFN(spec, dtype=kw["dtype"], device=kw["device"])

    def ffn(self, h: Tensor) -> Tensor:
        return self.moe(h)


def layer_class(spec: ModelSpec, index: int) -> type[DecoderLayer]:
    """Layers after the first num_dense_layers of a mixture-of-experts model route to experts."""
    return MoEDecoderLayer if spec.is_moe and index >= spec.num_dense_layers else DecoderLayer


class LlamaModel(nn.Module):
    """A Llama-style decoder for any GQA ModelSpec, dense or mixture-of-experts, with random
    weights drawn from `seed`."""

    def __init__(self, spec: ModelSpec, *, dtype: torch.dtype | str = torch.float32,
                 device: torch.device | str = "cpu", seed: int = 0, rope_theta: float = 10000.0) -> None:
        super().__init__()
        if spec.is_mla:
            raise InputError(f"the torch model implements GQA attention only; {spec.name} uses MLA")
        dtype = torch_dtype(dtype) if isinstance(dtype, str) else dtype
        device = torch.device(device)
        self.spec, self.dtype, self.device = spec, dtype, device
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(layer_class(spec, i)(spec, i, dtype=dtype, device=device)
                                    for i in range(spec.num_layers))
        self.final_norm = RMSNorm(spec.hidden_size, dtype=dtype, device=device)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, dtype=dtype, device=device)
        self.rotary = Rotary(spec.head_dim, rope_theta, device)
        self._init_weights(seed)
        self.requires_grad_(False)

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        # Fan-in scaled normals keep activations O(1) through any depth; drawn on the target
        # device so an 8B model initialises in seconds.
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, 1.0 / math.sqrt(module.in_features), generator=gen)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 1.0, generator=gen)
            elif isinstance(module, RoutedExperts):
                module.init_weights(gen)

    def new_cache(self, capacity: int = 0) -> KVCache:
        return KVCache(self.spec.num_layers, self.spec.num_kv_heads, self.spec.head_dim,
                       dtype=self.dtype, device=self.device, capacity=capacity)

    def prepare_step(self, token_ids: list[Tensor], caches: list[KVCache], emit: list[bool]) -> StepInputs:
        """Host-side input building: concatenated ids, positions, masks, emit rows; caches grown."""
        return prepare_step(token_ids, caches, emit, self.device)

    @torch.no_grad()
    def run_step(self, inputs: StepInputs) -> Tensor:
        """The device work of one step; advances every cache by its q_len. -> [num_emit, vocab]."""
        x, cos, sin = self.embed_tokens(inputs)
        for layer in self.layers:
            x = layer(x, cos, sin, inputs)
        inputs.kv.advance(inputs)
        return self.lm_head(self.final_norm(x[inputs.emit_rows]))

    def embed_tokens(self, inputs: StepInputs) -> tuple[Tensor, Tensor, Tensor]:
        """A step's once-per-step element-wise work: the embedding lookup and the RoPE tables'
        rows of its positions."""
        num_positions = max(s + q for s, q in zip(inputs.kv_lens, inputs.q_lens))
        cos, sin = self.rotary.tables(inputs.positions, num_positions, self.dtype)
        return self.embed(inputs.token_ids), cos, sin

    def forward_step(self, token_ids: list[Tensor], caches: list[KVCache], emit: list[bool]) -> Tensor:
        """One engine iteration: new tokens of each sequence over its cache -> logits of emitting rows."""
        return self.run_step(self.prepare_step(token_ids, caches, emit))

    def forward(self, token_ids: list[Tensor], caches: list[KVCache], emit: list[bool]) -> Tensor:
        return self.forward_step(token_ids, caches, emit)


def build_model(spec: ModelSpec, device: str = "cpu", dtype: str | None = None, seed: int = 0) -> LlamaModel:
    """The model for `spec` on `device`, in `dtype` (default: float32 on CPU, bfloat16 on CUDA)."""
    return LlamaModel(spec, dtype=torch_dtype(dtype or default_dtype(device)), device=device, seed=seed)


@torch.no_grad()
def greedy_generate(model: LlamaModel, prompt: Tensor, num_new_tokens: int, *,
                    chunk_size: int | None = None, cache: KVCache | None = None) -> list[int]:
    """Greedy decoding of one sequence (the prompt in chunks of chunk_size): a reference for tests."""
    cache = cache or model.new_cache()
    chunk_size = chunk_size or len(prompt)
    logits = None
    for start in range(0, len(prompt), chunk_size):
        chunk = prompt[start:start + chunk_size]
        last = start + len(chunk) >= len(prompt)
        out = model.forward_step([chunk], [cache], [last])
        logits = out if last else logits
    tokens = []
    for _ in range(num_new_tokens):
        token = int(logits[-1].argmax())
        tokens.append(token)
        logits = model.forward_step([torch.tensor([token])], [cache], [True])
    return tokens
