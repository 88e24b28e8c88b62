"""ModelSpec: the shape of a Llama-style decoder, and the sizes that follow from it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from numbers import Integral
from pathlib import Path

from simulator.errors import InputError
from simulator.io import read_config_file

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "fp8": 1, "float8": 1, "int8": 1}


@dataclass(frozen=True)
class Parallelism:
    """How one model instance is split over GPUs: `tp`-way tensor parallelism (query heads, FFN
    and vocabulary split; KV heads split down to one per GPU, then replicated) and `ep`-way
    expert parallelism (mixture-of-experts layers only: dense models ignore it)."""
    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, Integral) or isinstance(value, bool) or value <= 0:
                raise InputError(f"parallelism: {name} must be a positive integer, got {value!r}")
            object.__setattr__(self, name, int(value))   # numpy integers too, stored as int

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


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-style decoder: RMSNorm, RoPE, GQA attention, SwiGLU MLP."""
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(value, int) or value <= 0):
                raise InputError(f"model spec {self.name!r}: {f.name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"model spec {self.name!r}: num_heads ({self.num_heads}) must be a multiple "
                             f"of num_kv_heads ({self.num_kv_heads})")
        if self.dtype not in DTYPE_BYTES:
            raise InputError(f"model spec {self.name!r}: unknown dtype {self.dtype!r}; "
                             f"known: {', '.join(sorted(DTYPE_BYTES))}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 · layers · kv_heads · head_dim · bytes."""
        return 2 * self.num_layers * self.kv_size * self.dtype_bytes

    @property
    def params_per_layer(self) -> int:
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        mlp = 3 * self.hidden_size * self.ffn_size
        return attn + mlp + 2 * self.hidden_size

    @property
    def num_params(self) -> int:
        embed_and_head = 2 * self.vocab_size * self.hidden_size
        return self.num_layers * self.params_per_layer + embed_and_head + self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def gemm_shapes(self, parallelism: Parallelism = Parallelism()) -> dict[str, tuple]:
        """(n, k) of each projection of one layer and of the LM head on one GPU; M is the number
        of tokens. Whole numbers where the split is even (always on one GPU)."""
        p = parallelism
        return gemm_shapes_of(self.hidden_size, p.split(self.num_heads), p.kv_heads(self.num_kv_heads),
                              self.head_dim, p.split(self.ffn_size), p.split(self.vocab_size))

    def with_dtype(self, dtype: str) -> ModelSpec:
        return ModelSpec(**{**asdict(self), "dtype": dtype})

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelSpec] = {
    # A few MB of weights in fp32: fast enough for CPU tests and the quickstart.
    "tiny": ModelSpec("tiny", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2,
                      head_dim=64, ffn_size=688, vocab_size=2048, dtype="float32"),
    "llama-2-7b": ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000),
    "llama-3-8b": ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    "llama-2-70b": ModelSpec("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000),
    "qwen3-14b": ModelSpec("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936),
}


def load_model_spec(name_or_path: str) -> ModelSpec:
    """A preset name, or a JSON / TOML file with the ModelSpec fields."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if not path.exists():
        raise InputError(f"--model-spec: {name_or_path!r} is neither a preset "
                         f"({', '.join(PRESETS)}) nor an existing file")
    data = read_config_file(path, "model spec")
    known = {f.name for f in fields(ModelSpec)}
    unknown = set(data) - known
    missing = known - set(data) - {"dtype", "name"}
    if unknown or missing:
        raise InputError(f"{path}: model spec has unknown keys {sorted(unknown)} / "
                         f"missing keys {sorted(missing)}")
    data.setdefault("name", path.stem)
    return ModelSpec(**data)
