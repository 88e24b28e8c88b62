"""ModelSpec from a Hugging Face `config.json`: the file users already have for the model they serve.

Each supported architecture maps its own key names onto ModelSpec's fields. Multimodal models
keep their language model under `text_config`; that part is read. Anything we cannot map (an
unknown architecture, a missing or malformed field, a layer pattern ModelSpec cannot express) is
one InputError naming the file and the key.
"""
from __future__ import annotations

from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.model_spec import DTYPE_BYTES, MAX_SIZE, ModelSpec, short_value

DENSE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# Architectures whose layers normalise each query and key head before RoPE (ModelSpec.qk_norm).
QK_NORM_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
# model_type of a text_config without its own `architectures`
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "ministral": "MistralForCausalLM",
               "ministral3": "MistralForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
               "deepseek_v3": "DeepseekV3ForCausalLM", "kimi_k2": "DeepseekV3ForCausalLM"}
_MISSING = object()


def is_hf_config(data: dict) -> bool:
    return any(key in data for key in ("architectures", "model_type", "text_config"))


class _Config:
    """A config dict that names its file and key in every complaint."""

    def __init__(self, data: dict, path: Path, prefix: str = "") -> None:
        self.data, self.path, self.prefix = data, path, prefix

    def fail(self, key: str, why: str) -> InputError:
        return InputError(f"{self.path}: {self.prefix}{key}: {why}")

    def int(self, key: str, default=_MISSING, *, least: int = 1) -> int:
        value = self.data.get(key, default)
        if value is _MISSING:
            raise self.fail(key, "missing (a Hugging Face config of this architecture has it)")
        if value is None and default is not _MISSING:
            value = default
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise self.fail(key, f"must be an integer >= {least}, got {short_value(value)}")
        if value > MAX_SIZE:
            raise self.fail(key, f"must be at most {MAX_SIZE:,}, got {short_value(value)}")
        return value


def spec_from_hf_config(data: dict, path: Path) -> ModelSpec:
    cfg, architecture = _language_model(data, Path(path))
    name = path.parent.name if path.name == "config.json" else path.stem
    fields = {"name": name, **_common(cfg), **_dtypes(cfg, data)}
    if architecture == "MixtralForCausalLM":
        fields.update(num_experts=cfg.int("num_local_experts"), experts_per_token=cfg.int("num_experts_per_tok"),
                      expert_ffn_size=fields["ffn_size"])
    elif architecture == "Qwen3MoeForCausalLM":
        fields.update(num_experts=cfg.int("num_experts"), experts_per_token=cfg.int("num_experts_per_tok"),
                      expert_ffn_size=cfg.int("moe_intermediate_size"),
                      num_dense_layers=_qwen_dense_prefix(cfg, fields["num_layers"]))
    elif architecture == "DeepseekV3ForCausalLM":
        fields.update(_deepseek_v3(cfg, fields["num_heads"]))
    if architecture in QK_NORM_ARCHITECTURES:
        fields["qk_norm"] = True
    try:
        return ModelSpec(**fields)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def _language_model(data: dict, path: Path) -> tuple[_Config, str]:
    """The part of the config that describes the decoder, and its architecture."""
    architectures = _names(data, "architectures", path)
    known = DENSE + ("MixtralForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM")
    for arch in architectures:
        if arch in known:
            return _Config(data, path), arch
    text = data.get("text_config")
    if text is not None or "text_config" in data:
        if not isinstance(text, dict):
            raise InputError(f"{path}: text_config: must be an object (the language model's config), got {text!r}")
        inner = [a for a in _names(text, "architectures", path, "text_config.") if a in known]
        arch = inner[0] if inner else MODEL_TYPES.get(_model_type(text, path, "text_config."))
        if arch:
            return _Config(text, path, "text_config."), arch
    model_type = _model_type(data, path)
    if model_type in MODEL_TYPES and not architectures:
        return _Config(data, path), MODEL_TYPES[model_type]
    named = architectures or [(text or {}).get("model_type") or model_type]
    raise InputError(f"{path}: architectures: {', '.join(map(str, named))} is not supported; "
                     f"supported: {', '.join(known)} (or write a ModelSpec JSON)")


def _names(data: dict, key: str, path: Path, prefix: str = "") -> list[str]:
    """A list of names (`architectures`); absent or null: none."""
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise InputError(f"{path}: {prefix}{key}: must be a list of names, got {value!r}")
    return value


def _model_type(data: dict, path: Path, prefix: str = "") -> str | None:
    value = data.get("model_type")
    if value is not None and not isinstance(value, str):
        raise InputError(f"{path}: {prefix}model_type: must be a name, got {value!r}")
    return value


def _common(cfg: _Config) -> dict:
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    head_dim = cfg.data.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise cfg.fail("head_dim", f"missing, and hidden_size {hidden} is not a multiple of "
                                       f"num_attention_heads {heads}")
        head_dim = hidden // heads
    return {"num_layers": cfg.int("num_hidden_layers"), "hidden_size": hidden, "num_heads": heads,
            "num_kv_heads": cfg.int("num_key_value_heads", heads), "head_dim": cfg.int("head_dim", head_dim),
            "ffn_size": cfg.int("intermediate_size"), "vocab_size": cfg.int("vocab_size")}


def _dtypes(cfg: _Config, top: dict) -> dict:
    """Weights in the checkpoint's dtype (fp8 where it is quantised so), the KV cache in the
    model's compute dtype (what vLLM's kv_cache_dtype=auto gives)."""
    key = "torch_dtype" if "torch_dtype" in cfg.data else "dtype"
    compute = cfg.data.get(key) or top.get("torch_dtype") or top.get("dtype") or "bfloat16"
    if not isinstance(compute, str) or compute not in DTYPE_BYTES:
        raise cfg.fail(key, f"unknown dtype {short_value(compute)}; known: {', '.join(sorted(DTYPE_BYTES))}")
    quant = cfg.data.get("quantization_config") or top.get("quantization_config")
    if not quant:
        return {"dtype": compute}
    if not isinstance(quant, dict):
        raise cfg.fail("quantization_config", f"must be an object with a quant_method, got {short_value(quant)}")
    method = quant.get("quant_method")
    if method != "fp8":
        raise InputError(f"{cfg.path}: quantization_config.quant_method: {short_value(method)} is not supported "
                         f"(fp8 is); write a ModelSpec JSON with the weights' dtype")
    # Per-block scales (DeepSeek's 128 x 128) run different kernels from per-tensor fp8.
    blocked = quant.get("weight_block_size")
    return {"dtype": "fp8_block" if blocked else "fp8", "kv_dtype": compute}


def _qwen_dense_prefix(cfg: _Config, num_layers: int) -> int:
    """Qwen3-MoE marks dense layers by `mlp_only_layers` and `decoder_sparse_step`; ModelSpec
    holds dense layers only as a prefix."""
    only = cfg.data.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise cfg.fail("mlp_only_layers", f"must be a list of layer indices, got {short_value(only)}")
    step = cfg.int("decoder_sparse_step", 1)
    dense = [i for i in range(num_layers) if i in only or (i + 1) % step]
    if dense != list(range(len(dense))):
        raise cfg.fail("mlp_only_layers", f"dense layers {dense} are not the first layers; "
                                          f"only a dense prefix can be expressed")
    return len(dense)


def _deepseek_v3(cfg: _Config, num_heads: int) -> dict:
    nope, v = cfg.int("qk_nope_head_dim"), cfg.int("v_head_dim")
    if nope != v:
        raise cfg.fail("v_head_dim", f"{v} differs from qk_nope_head_dim {nope}; ModelSpec holds one head_dim")
    if cfg.int("moe_layer_freq", 1) != 1:
        raise cfg.fail("moe_layer_freq", "only every layer after the dense prefix being MoE (1) is supported")
    return {"num_kv_heads": num_heads, "head_dim": nope, "attention": "mla",
            "kv_latent_dim": cfg.int("kv_lora_rank"), "q_latent_dim": cfg.int("q_lora_rank", 0, least=0),
            "rope_head_dim": cfg.int("qk_rope_head_dim"), "num_experts": cfg.int("n_routed_experts"),
            "experts_per_token": cfg.int("num_experts_per_tok"),
            "expert_ffn_size": cfg.int("moe_intermediate_size"),
            "num_shared_experts": cfg.int("n_shared_experts", 0, least=0),
            "num_dense_layers": cfg.int("first_k_dense_replace", 0, least=0)}

