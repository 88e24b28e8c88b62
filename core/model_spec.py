"""ModelSpec: the shape of a Llama-style decoder, and the sizes that follow from it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from numbers import Integral

from stepcal.core.errors import InputError, shown

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "fp8": 1, "float8": 1, "fp8_block": 1, "int8": 1}
# Weight formats a checkpoint is quantised to; activations stay in a 16-bit dtype.
QUANTISED_DTYPES = frozenset({"fp8", "float8", "fp8_block", "int8"})
# GEMMs vLLM runs unquantised whatever the checkpoint's quantisation, in the compute dtype:
# - the MoE router: vLLM's DeepSeek-V2/V3 model builds its gate with quant_config=None
#   (vllm-project/vllm, vllm/model_executor/models/deepseek_v2.py, DeepseekV2MoE.__init__:
#   `self.gate = DeepSeekV2Gate(..., quant_config=None)`, a ReplicatedLinear), as its Mixtral,
#   Qwen MoE and other MoE models do ("Gate always runs at half / full precision");
# - the LM head: a ParallelLMHead (a vocabulary embedding, not a LinearBase), for which
#   Fp8Config.get_quant_method returns no quantised method
#   (vllm/model_executor/layers/quantization/fp8.py), so its weights stay in the compute dtype.
UNQUANTISED_GEMMS = ("router", "lm_head")


@dataclass(frozen=True)
class Parallelism:
    """How one model instance is split over `tp` GPUs: tensor parallelism for attention, dense
    FFNs and the vocabulary (query heads, FFN and vocabulary split; KV heads split down to one
    per GPU, then replicated), and for mixture-of-experts layers `ep`-way expert parallelism
    (each GPU holds num_experts / ep experts) with each expert split over the remaining
    tp / ep GPUs. Dense models ignore `ep`. vLLM's --enable-expert-parallel with TP 8 is
    Parallelism(tp=8, ep=8)."""
    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, Integral) or isinstance(value, bool) or value <= 0:
                raise InputError(f"parallelism: {name} must be a positive integer, got {shown(value)}")
            object.__setattr__(self, name, int(value))   # numpy integers too, stored as int
        if self.tp % self.ep:
            # ep > tp would need data-parallel attention, which is not modelled.
            raise InputError(f"parallelism: --ep ({self.ep}) must divide --tp ({self.tp}): experts "
                             f"are spread over the tensor-parallel GPUs of one instance")

    @property
    def moe_tp(self) -> int:
        """The GPUs each expert's FFN is split over."""
        return self.tp // self.ep

    def split(self, size: int) -> int | float:
        """One GPU's share of `size` under tensor parallelism: an int where tp divides it (the
        shapes a profiler times are whole), else a float."""
        return size // self.tp if size % self.tp == 0 else size / self.tp

    def kv_heads(self, num_kv_heads: int) -> int | float:
        """KV heads one GPU holds: split like the query heads, but never fewer than one."""
        return max(self.split(num_kv_heads), 1)


def gemm_shapes_of(hidden, heads, kv_heads, head_dim, ffn, vocab, gated=True) -> dict:
    """(n, k) of each projection of one layer and of the LM head, M being the number of tokens,
    from the sizes one GPU holds (heads, KV heads, FFN width and vocabulary after any split).

    Plain numbers or numpy arrays alike: the Vidur importer passes one value per profile row.
    `gated` (a bool, or a bool array): the up projection also computes the gate (SwiGLU), so it
    is twice the FFN width."""
    return {
        "qkv_proj": ((heads + 2 * kv_heads) * head_dim, hidden),
        "o_proj": (hidden, heads * head_dim),
        "gate_up_proj": ((1 + gated) * ffn, hidden),
        "down_proj": (hidden, ffn),
        "lm_head": (vocab, hidden),
    }


# The small per-layer operators Vidur's mlp.csv times (embedding: once per step), and the
# per-sequence ones our profiler times besides (`stepcal profile --ops elementwise`).
TOKEN_ELEMENTWISE = ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
SEQ_ELEMENTWISE = ("sample", "kv_store")
# The per-head query and key norms of a ModelSpec.qk_norm model (Qwen3): per token, per layer; not in
# Vidur's mlp.csv (its models have none).
HEAD_NORMS = ("q_norm", "k_norm")


def elementwise_widths_of(hidden, heads, kv_heads, head_dim, ffn, vocab=0) -> dict:
    """Elements per row each element-wise operator touches, from the sizes one GPU holds; a row
    is a token, for sample a sequence (the final norm of its last hidden state and greedy
    sampling's read of its logits). Numbers or numpy arrays alike, as gemm_shapes_of."""
    return {
        "emb": hidden,
        "input_layernorm": hidden,
        "post_attention_layernorm": hidden,
        "attn_rope": (heads + kv_heads) * head_dim,
        "mlp_act": 3 * ffn,          # reads gate and up, writes the product
        "add": 2 * hidden,
        "sample": hidden + vocab,
        "kv_store": 2 * kv_heads * head_dim,   # the new token's K and V, into the cache
        "q_norm": heads * head_dim,            # ModelSpec.qk_norm: each query head normalised
        "k_norm": kv_heads * head_dim,         # and each key head
    }


ATTENTION_KINDS = ("gqa", "mla")
# The largest size a spec may hold: far above any real model's, and small enough that sizes
# multiplied together stay exact and convertible to float.
MAX_SIZE = 2**31 - 1
REQUIRED_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_size",
                   "vocab_size")
# Zero where the model has no such part (a dense model has no experts, GQA no latent).
OPTIONAL_FIELDS = ("num_experts", "experts_per_token", "expert_ffn_size", "num_shared_experts",
                   "num_dense_layers", "kv_latent_dim", "q_latent_dim", "rope_head_dim")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: RMSNorm, RoPE, SwiGLU FFNs.

    Attention is GQA (num_kv_heads K and V heads of head_dim cached per token and layer) or MLA,
    DeepSeek's multi-head latent attention (one kv_latent_dim latent plus a rope_head_dim key
    cached per token and layer, shared by all heads; head_dim is the per-head size of the
    non-rotary query/key part and of the values; q_latent_dim compresses the queries, 0 if not).

    Mixture of experts (num_experts > 0): every layer after the first num_dense_layers routes each
    token to experts_per_token of num_experts SwiGLU experts of width expert_ffn_size, plus
    num_shared_experts experts of that width every token passes through. Dense layers use
    ffn_size. `dtype` is the weights' dtype; `kv_dtype` the KV cache's (None: the same).

    `qk_norm`: every layer RMS-normalises each query and key head (over head_dim) before RoPE, as
    Qwen3 does: two more small kernels per layer, with their own weights."""
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    num_experts: int = 0
    experts_per_token: int = 0
    expert_ffn_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    attention: str = "gqa"
    kv_latent_dim: int = 0
    q_latent_dim: int = 0
    rope_head_dim: int = 0
    kv_dtype: str | None = None
    qk_norm: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InputError(f"model spec: name must be a string, got {short_value(self.name)}")
        for name in REQUIRED_FIELDS + OPTIONAL_FIELDS:
            value, least = getattr(self, name), int(name in REQUIRED_FIELDS)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                what = "a positive" if least else "a non-negative"
                raise InputError(f"model spec {self.name!r}: {name} must be {what} integer, got {short_value(value)}")
            if value > MAX_SIZE:
                raise InputError(f"model spec {self.name!r}: {name} must be at most {MAX_SIZE:,}, got {short_value(value)}")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"model spec {self.name!r}: num_heads ({self.num_heads}) must be a multiple "
                             f"of num_kv_heads ({self.num_kv_heads})")
        for name in ("dtype", "kv_dtype"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or value not in DTYPE_BYTES):
                raise InputError(f"model spec {self.name!r}: unknown {name} {short_value(value)}; "
                                 f"known: {', '.join(sorted(DTYPE_BYTES))}")
        if not isinstance(self.qk_norm, bool):
            raise InputError(f"model spec {self.name!r}: qk_norm must be true or false, got {shown(self.qk_norm)}")
        self._check_experts()
        self._check_attention()

    def _check_experts(self) -> None:
        parts = ("experts_per_token", "expert_ffn_size", "num_shared_experts", "num_dense_layers")
        if not self.num_experts:
            extra = [p for p in parts if getattr(self, p)]
            if extra:
                raise InputError(f"model spec {self.name!r}: {extra[0]} is set but num_experts is 0")
            return
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise InputError(f"model spec {self.name!r}: experts_per_token must be 1..num_experts "
                             f"({self.num_experts}), got {self.experts_per_token}")
        if not self.expert_ffn_size:
            raise InputError(f"model spec {self.name!r}: expert_ffn_size must be positive for a "
                             f"mixture-of-experts model")
        if self.num_dense_layers >= self.num_layers:
            raise InputError(f"model spec {self.name!r}: num_dense_layers ({self.num_dense_layers}) "
                             f"must be below num_layers ({self.num_layers})")

    def _check_attention(self) -> None:
        if not isinstance(self.attention, str) or self.attention not in ATTENTION_KINDS:
            raise InputError(f"model spec {self.name!r}: attention must be one of "
                             f"{', '.join(ATTENTION_KINDS)}, got {short_value(self.attention)}")
        if self.is_mla:
            for name in ("kv_latent_dim", "rope_head_dim"):
                if not getattr(self, name):
                    raise InputError(f"model spec {self.name!r}: MLA attention needs a positive {name}")
            if self.num_kv_heads != self.num_heads:
                raise InputError(f"model spec {self.name!r}: MLA has one key and value per query head: "
                                 f"num_kv_heads must equal num_heads ({self.num_heads})")
            if self.qk_norm:
                raise InputError(f"model spec {self.name!r}: qk_norm normalises GQA query and key heads; "
                                 "MLA normalises its latents instead")
        elif self.kv_latent_dim or self.q_latent_dim or self.rope_head_dim:
            raise InputError(f"model spec {self.name!r}: kv_latent_dim, q_latent_dim and "
                             f"rope_head_dim belong to attention \"mla\"")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.attention == "mla"

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def num_ffn_dense_layers(self) -> int:
        """Layers with a dense FFN of ffn_size: all of a dense model's."""
        return self.num_layers - self.num_moe_layers

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_dtype or self.dtype]

    @property
    def compute_dtype(self) -> str:
        """The activations' dtype: the weights' unless they are quantised, then the KV cache's
        (bfloat16 where that is quantised or not given, vLLM's default for fp8 checkpoints)."""
        if self.dtype not in QUANTISED_DTYPES:
            return self.dtype
        if self.kv_dtype is not None and self.kv_dtype not in QUANTISED_DTYPES:
            return self.kv_dtype
        return "bfloat16"

    def gemm_dtypes(self) -> dict[str, str]:
        """The dtype each GEMM of gemm_shapes() runs in: the weights', except UNQUANTISED_GEMMS,
        which run in the compute dtype."""
        return {name: self.compute_dtype if name in UNQUANTISED_GEMMS else self.dtype
                for name in self.gemm_shapes()}

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def kv_elements_per_token_layer(self) -> int:
        """Cached elements per token and layer: K and V per KV head, or MLA's latent + rope key."""
        if self.is_mla:
            return self.kv_latent_dim + self.rope_head_dim
        return 2 * self.kv_size

    @property
    def kv_bytes_per_token(self) -> int:
        """The whole model's KV cache per token, every layer."""
        return self.num_layers * self.kv_elements_per_token_layer * self.kv_dtype_bytes

    def kv_bytes_per_token_per_gpu(self, parallelism: Parallelism = Parallelism()) -> int | float:
        """One GPU's KV cache per token: GQA's KV heads are split (never below one head per GPU);
        MLA's latent is shared by all heads, so every GPU caches all of it."""
        if self.is_mla:
            return self.kv_bytes_per_token
        return self.num_layers * 2 * parallelism.kv_heads(self.num_kv_heads) * self.head_dim * self.kv_dtype_bytes

    def attention_params(self, parallelism: Parallelism = Parallelism()) -> float:
        """One layer's attention weights on one GPU (norms of the latents included)."""
        shapes = self.gemm_shapes(parallelism)
        names = ("q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "o_proj") if self.is_mla else ("qkv_proj", "o_proj")
        latent_norms = self.q_latent_dim + self.kv_latent_dim
        return sum(n * k for name, (n, k) in shapes.items() if name in names) + latent_norms

    def ffn_params(self, moe: bool, parallelism: Parallelism = Parallelism()) -> float:
        """One layer's FFN weights on one GPU: a dense SwiGLU, or the experts this GPU holds (each
        split over tp / ep GPUs), shared experts (split by tp) and the router (replicated)."""
        if not moe:
            return 3 * self.hidden_size * parallelism.split(self.ffn_size)
        expert = 3 * self.hidden_size * self.expert_ffn_size / parallelism.moe_tp
        shared = 3 * self.hidden_size * self.num_shared_experts * self.expert_ffn_size / parallelism.tp
        return self.num_experts / parallelism.ep * expert + shared + self.hidden_size * self.num_experts

    def weight_params(self, parallelism: Parallelism = Parallelism()) -> float:
        """Weights one GPU holds: every layer, every expert, embeddings and LM head (split by tp)."""
        norms = 2 * self.hidden_size
        layers = (self.num_layers * (self.attention_params(parallelism) + norms)
                  + self.num_ffn_dense_layers * self.ffn_params(False, parallelism)
                  + self.num_moe_layers * self.ffn_params(True, parallelism))
        return layers + 2 * parallelism.split(self.vocab_size) * self.hidden_size + self.hidden_size

    @property
    def num_params(self) -> int:
        return int(self.weight_params())

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def weight_bytes_per_gpu(self, parallelism: Parallelism = Parallelism()) -> float:
        return self.weight_params(parallelism) * self.dtype_bytes

    def gemm_shapes(self, parallelism: Parallelism = Parallelism()) -> dict[str, tuple]:
        """(n, k) of each dense projection of a layer and of the LM head on one GPU; M is the number
        of tokens. Whole numbers where the split is even (always on one GPU). Which layers run
        which GEMM: gemm_layer_counts()."""
        p = parallelism
        if not self.is_mla:
            shapes = gemm_shapes_of(self.hidden_size, p.split(self.num_heads), p.kv_heads(self.num_kv_heads),
                                    self.head_dim, p.split(self.ffn_size), p.split(self.vocab_size))
        else:
            shapes = self._mla_shapes(p)
        if self.is_moe:
            if not self.num_ffn_dense_layers:
                del shapes["gate_up_proj"], shapes["down_proj"]
            # The router runs replicated: every GPU scores every token against every expert.
            shapes["router"] = (self.num_experts, self.hidden_size)
            if self.num_shared_experts:
                shared = p.split(self.num_shared_experts * self.expert_ffn_size)
                shapes["shared_gate_up_proj"] = (2 * shared, self.hidden_size)
                shapes["shared_down_proj"] = (self.hidden_size, shared)
        return shapes

    def elementwise_widths(self, parallelism: Parallelism = Parallelism()) -> dict:
        """elementwise_widths_of() on one GPU's share: query heads, KV heads and FFN split as
        gemm_shapes() splits them; the vocabulary whole (the logits are gathered under TP). Whole
        numbers on one GPU."""
        p = parallelism
        return elementwise_widths_of(self.hidden_size, p.split(self.num_heads), p.kv_heads(self.num_kv_heads),
                                     self.head_dim, p.split(self.ffn_size), self.vocab_size)

    def _mla_shapes(self, p: Parallelism) -> dict[str, tuple]:
        """MLA's projections (vLLM's layout): the query (through its latent when q_latent_dim),
        the KV latent with the rope key (replicated), its expansion to per-head keys and values
        (absorbed into attention for decodes: the same FLOPs per token), the output."""
        heads, hidden = p.split(self.num_heads), self.hidden_size
        qk_head = self.head_dim + self.rope_head_dim
        shapes = {}
        if self.q_latent_dim:
            shapes["q_a_proj"] = (self.q_latent_dim, hidden)
            shapes["q_b_proj"] = (heads * qk_head, self.q_latent_dim)
        else:
            shapes["q_b_proj"] = (heads * qk_head, hidden)
        shapes["kv_a_proj"] = (self.kv_latent_dim + self.rope_head_dim, hidden)
        shapes["kv_b_proj"] = (heads * 2 * self.head_dim, self.kv_latent_dim)
        shapes["o_proj"] = (hidden, heads * self.head_dim)
        shapes["gate_up_proj"] = (2 * p.split(self.ffn_size), hidden)
        shapes["down_proj"] = (hidden, p.split(self.ffn_size))
        shapes["lm_head"] = (p.split(self.vocab_size), hidden)
        return shapes

    def gemm_layer_counts(self) -> dict[str, int]:
        """How many layers run each GEMM of gemm_shapes() per step (lm_head: once)."""
        counts = {}
        for name in self.gemm_shapes():
            if name == "lm_head":
                counts[name] = 1
            elif name in ("gate_up_proj", "down_proj"):
                counts[name] = self.num_ffn_dense_layers
            elif name in ("router", "shared_gate_up_proj", "shared_down_proj"):
                counts[name] = self.num_moe_layers
            else:
                counts[name] = self.num_layers
        return counts

    def with_dtype(self, dtype: str) -> ModelSpec:
        return replace(self, dtype=dtype)

    def to_dict(self) -> dict:
        """The fields, absent ones (kv_dtype None) left out: JSON and TOML alike can hold it. qk_norm is
        left out where false, so the dict of a spec without it is what it was before the field existed
        (profiles resume and tables compare on it)."""
        return {k: v for k, v in asdict(self).items() if v is not None and not (k == "qk_norm" and not v)}


def short_value(value) -> str:
    """A value for a one-line message: a huge one cut down (JSON allows integers of any length)."""
    try:
        text = shown(value)
    except ValueError:                   # an int past Python's digit limit for str()
        return "an integer of thousands of digits"
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


PRESETS: dict[str, ModelSpec] = {
    # A few MB of weights in fp32: fast enough for CPU tests and the quickstart.
    "tiny": ModelSpec("tiny", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2,
                      head_dim=64, ffn_size=688, vocab_size=2048, dtype="float32"),
    # Every mixture-of-experts path on the CPU: a dense first layer, routed and shared experts.
    "tiny-moe": ModelSpec("tiny-moe", num_layers=3, hidden_size=256, num_heads=4, num_kv_heads=2,
                          head_dim=64, ffn_size=688, vocab_size=2048, dtype="float32",
                          num_experts=8, experts_per_token=2, expert_ffn_size=128,
                          num_shared_experts=1, num_dense_layers=1),
    "llama-2-7b": ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000),
    "llama-3-8b": ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    "llama-2-70b": ModelSpec("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000),
    "qwen3-14b": ModelSpec("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936, qk_norm=True),
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000,
                              num_experts=8, experts_per_token=2, expert_ffn_size=14336),
    "qwen3-30b-a3b": ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936,
                               num_experts=128, experts_per_token=8, expert_ffn_size=768, qk_norm=True),
    # Weights in fp8 with 128x128 block scales as published, KV cache in bf16 (vLLM's default).
    "deepseek-v3": ModelSpec("deepseek-v3", 61, 7168, 128, 128, 128, 18432, 129280, dtype="fp8_block",
                             num_experts=256, experts_per_token=8, expert_ffn_size=2048,
                             num_shared_experts=1, num_dense_layers=3, attention="mla",
                             kv_latent_dim=512, q_latent_dim=1536, rope_head_dim=64,
                             kv_dtype="bfloat16"),
}
