"""Model config files with fields of the wrong type or size, and tp / ep splits the model cannot
have, table-driven: each is exit 2, one `stepcal: ` line naming the file and the field, no
traceback, nothing written, whichever command reads the spec. A hypothesis test feeds config.json
dicts with values of any JSON type to the loader, which must build a spec or raise InputError."""
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepcal.core.errors import InputError
from stepcal.core.model_files import load_model_spec
from stepcal.core.model_spec import PRESETS, Parallelism
from stepcal.core.parallel_layout import checked_parallelism
from stepcal.experiments.cli import main

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
H100_GEMMS = SHARED_DATA / "profiles/aiconfigurator/h100_sxm/gemm/vllm/0.14.0/gemm_perf.parquet"
BENCH = Path(__file__).resolve().parents[1] / "data" / "vllm_bench_tiny.json"

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
         "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
MIXTRAL = {**LLAMA, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 32000,
           "num_local_experts": 8, "num_experts_per_tok": 2}
QWEN_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
            "num_attention_heads": 32, "num_key_value_heads": 4, "num_hidden_layers": 48, "head_dim": 128,
            "intermediate_size": 6144, "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8,
            "moe_intermediate_size": 768, "decoder_sparse_step": 1, "mlp_only_layers": []}
DSV3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
        "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61,
        "intermediate_size": 18432, "vocab_size": 129280, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "qk_rope_head_dim": 64, "kv_lora_rank": 512, "q_lora_rank": 1536, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3, "torch_dtype": "bfloat16"}
LLAVA = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"}
SPEC = {"num_layers": 2, "hidden_size": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64,
        "ffn_size": 688, "vocab_size": 2048}
GEN = "poisson:rate=5,n=5,prompt=fixed:8,output=fixed:4"
SIM = ["simulate", "--kv-blocks", "64", "--trace", GEN, "--step-model", "const:1"]
CAP = ["capacity", "--kv-blocks", "64", "--trace", GEN, "--step-model", "const:1", "--slo-ttft-ms", "500"]
FIT = ["fit", "--no-mlflow"]          # --profile added by the test
IMPORT = ["import", "vllm-bench", str(BENCH), "--kv-blocks", "64"]


def _raw(config: dict, key: str, literal: str) -> str:
    """The config's JSON with `key`'s value written as `literal` (JSON numbers Python's json cannot emit)."""
    return json.dumps({**config, key: 0}).replace(f'"{key}": 0', f'"{key}": {literal}')


CASES = {
    # the language model's place and name
    "text_config null": ({**LLAVA, "text_config": None}, SIM, "text_config"),
    "text_config string": ({**LLAVA, "text_config": "llama"}, SIM, "text_config"),
    "text_config list": ({**LLAVA, "text_config": [LLAMA]}, SIM, "text_config"),
    "text_config architectures 5": ({**LLAVA, "text_config": {**LLAMA, "architectures": 5}}, SIM,
                                    "text_config.architectures"),
    "text_config model_type list": ({**LLAVA, "text_config": {**LLAMA, "architectures": None, "model_type": ["llama"]}},
                                    SIM, "text_config.model_type"),
    "text_config size string": ({**LLAVA, "text_config": {**LLAMA, "hidden_size": "4096"}}, SIM,
                                "text_config.hidden_size"),
    "architectures 5": ({**LLAMA, "architectures": 5}, SIM, "architectures"),
    "architectures 0": ({**LLAMA, "architectures": 0}, SIM, "architectures"),
    "architectures of numbers": ({**LLAMA, "architectures": [5]}, SIM, "architectures"),
    "architectures a string": ({**LLAMA, "architectures": "LlamaForCausalLM"}, SIM, "architectures"),
    "model_type list": ({**LLAMA, "architectures": None, "model_type": ["llama"]}, SIM, "model_type"),
    "model_type number": ({**LLAMA, "architectures": [], "model_type": 7}, SIM, "model_type"),
    # sizes
    "hidden_size 4096*10^400": (_raw(LLAMA, "hidden_size", "4096" + "0" * 400), SIM, "hidden_size"),
    "vocab_size 10^40": ({**LLAMA, "vocab_size": 10**40}, SIM, "vocab_size"),
    "hidden_size float": ({**LLAMA, "hidden_size": 4096.0}, SIM, "hidden_size"),
    "hidden_size 1e400": (_raw(LLAMA, "hidden_size", "1e400"), SIM, "hidden_size"),
    "hidden_size true": ({**LLAMA, "hidden_size": True}, SIM, "hidden_size"),
    "hidden_size string": ({**LLAMA, "hidden_size": "4096"}, SIM, "hidden_size"),
    "num_attention_heads null": ({**LLAMA, "num_attention_heads": None}, SIM, "num_attention_heads"),
    "num_key_value_heads 2.5": ({**LLAMA, "num_key_value_heads": 2.5}, SIM, "num_key_value_heads"),
    "num_hidden_layers -1": ({**LLAMA, "num_hidden_layers": -1}, SIM, "num_hidden_layers"),
    "intermediate_size list": ({**LLAMA, "intermediate_size": [14336]}, SIM, "intermediate_size"),
    "head_dim string": ({**LLAMA, "head_dim": "128"}, SIM, "head_dim"),
    "head_dim 0": ({**LLAMA, "head_dim": 0}, SIM, "head_dim"),
    # dtypes and quantisation
    "torch_dtype list": ({**LLAMA, "torch_dtype": ["bfloat16"]}, SIM, "torch_dtype"),
    "torch_dtype number": ({**LLAMA, "torch_dtype": 16}, SIM, "torch_dtype"),
    "torch_dtype unknown": ({**LLAMA, "torch_dtype": "float13"}, SIM, "torch_dtype"),
    "quantization_config string": ({**LLAMA, "quantization_config": "fp8"}, SIM, "quantization_config"),
    "quant_method list": ({**LLAMA, "quantization_config": {"quant_method": ["fp8"]}}, SIM,
                          "quantization_config.quant_method"),
    # mixture-of-experts and MLA keys
    "num_local_experts string": ({**MIXTRAL, "num_local_experts": "8"}, SIM, "num_local_experts"),
    "num_experts_per_tok float": ({**MIXTRAL, "num_experts_per_tok": 2.0}, SIM, "num_experts_per_tok"),
    "mlp_only_layers 3": ({**QWEN_MOE, "mlp_only_layers": 3}, SIM, "mlp_only_layers"),
    "mlp_only_layers of strings": ({**QWEN_MOE, "mlp_only_layers": ["0"]}, SIM, "mlp_only_layers"),
    "decoder_sparse_step false": ({**QWEN_MOE, "decoder_sparse_step": False}, SIM, "decoder_sparse_step"),
    "kv_lora_rank 10^30": ({**DSV3, "kv_lora_rank": 10**30}, SIM, "kv_lora_rank"),
    "first_k_dense_replace -1": ({**DSV3, "first_k_dense_replace": -1}, SIM, "first_k_dense_replace"),
    # our own spec JSON
    "spec dtype list": ({**SPEC, "dtype": ["bfloat16"]}, SIM, "dtype"),
    "spec kv_dtype number": ({**SPEC, "kv_dtype": 8}, SIM, "kv_dtype"),
    "spec num_layers 1e400": (_raw(SPEC, "num_layers", "1e400"), SIM, "num_layers"),
    "spec hidden_size 10^30": ({**SPEC, "hidden_size": 10**30}, SIM, "hidden_size"),
    "spec attention list": ({**SPEC, "attention": ["mla"]}, SIM, "attention"),
    "spec name list": ({**SPEC, "name": [1]}, SIM, "name"),
    "spec qk_norm string": ({**SPEC, "qk_norm": "yes"}, SIM, "qk_norm"),
    # a file cut short, with the KV cache's size given
    "truncated config.json": (json.dumps(LLAMA)[:60], SIM, "not valid JSON"),
    # splits vLLM refuses
    "tp 3 of 32 heads": (LLAMA, SIM + ["--tp", "3"], "num_heads"),
    "tp 64 of 32 heads": (LLAMA, SIM + ["--tp", "64"], "num_heads"),
    "tp 12 of 8 KV heads": ({**LLAMA, "hidden_size": 6144, "num_attention_heads": 48}, SIM + ["--tp", "12"],
                            "num_kv_heads"),
    "tp 6 of 4 KV heads": ({**QWEN_MOE, "num_attention_heads": 48}, SIM + ["--tp", "6"], "num_kv_heads"),
    "ep 16 of 8 experts": (MIXTRAL, SIM + ["--tp", "16", "--ep", "16"], "num_experts"),
    "ep 8 of 12 experts": ({**QWEN_MOE, "num_experts": 12}, SIM + ["--tp", "8", "--ep", "8"], "num_experts"),
    "tp 256 of DeepSeek-V3's 128 heads": (DSV3, SIM + ["--tp", "256", "--ep", "256"], "num_heads"),
    # every command that takes --tp / --ep
    "capacity tp 3": (LLAMA, CAP + ["--tp", "3"], "num_heads"),
    "capacity architectures 5": ({**LLAMA, "architectures": 5}, CAP, "architectures"),
    "fit tp 3": (LLAMA, FIT + ["--tp", "3"], "num_heads"),
    "fit ep 16 of 8 experts": (MIXTRAL, FIT + ["--tp", "16", "--ep", "16"], "num_experts"),
    "fit text_config null": ({**LLAVA, "text_config": None}, FIT, "text_config"),
    "import tp 3": (LLAMA, IMPORT + ["--tp", "3"], "num_heads"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_config_is_one_line(name, tmp_path, capsys):
    config, argv, field = CASES[name]
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir()
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    if argv[0] == "fit":
        profile = tmp_path / "p.csv"
        profile.write_text("op,name,time_ms\n")
        argv = [*argv, "--profile", str(profile)]
    before = set(tmp_path.rglob("*"))
    code = main([*argv, "--model-spec", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("stepcal: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(path) in err and field in err, err
    assert "is not supported; supported:" not in err, err   # a malformed field is never an unknown architecture
    assert set(tmp_path.rglob("*")) == before


def test_float16_model_is_told_the_profiles_dtype(tmp_path, capsys):
    """Llama-2's config.json says float16; the shared H100 tables hold bfloat16, which runs at the same rate."""
    if not H100_GEMMS.is_file():
        pytest.skip(f"shared data not found at {H100_GEMMS}")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "num_key_value_heads": 32, "torch_dtype": "float16"}))
    code = main(["fit", "--profile", str(H100_GEMMS), "--model-spec", str(path), "--no-mlflow",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "float16" in err and "--dtype bfloat16" in err and "--dtype fp8" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tp, ep", [(1, 1), (2, 1), (4, 2), (8, 8), (16, 1), (32, 8)])
def test_splits_vllm_runs_are_accepted(tp, ep):
    parallelism = checked_parallelism(PRESETS["mixtral-8x7b"], tp, ep)
    assert (parallelism.tp, parallelism.ep) == (tp, ep)


def test_replicated_kv_heads_count_one_head_per_gpu():
    """8 KV heads over 16 GPUs: each holds one (two GPUs per head), so a GPU caches 1/8 of the KV bytes, not 1/16."""
    spec = PRESETS["llama-3-8b"]
    checked_parallelism(spec, 16)
    per_gpu = spec.kv_bytes_per_token_per_gpu(Parallelism(tp=16))
    assert per_gpu == spec.kv_bytes_per_token / 8
    assert spec.kv_bytes_per_token_per_gpu(Parallelism(tp=4)) == spec.kv_bytes_per_token / 4


def test_dense_model_ignores_ep():
    assert checked_parallelism(PRESETS["llama-3-8b"], 8, 8).ep == 8


ANY_JSON = st.recursive(st.none() | st.booleans() | st.integers(min_value=-10, max_value=10**40)
                        | st.floats(allow_nan=False) | st.text(max_size=6),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                        max_leaves=6)
PLAUSIBLE = {"architectures": st.sampled_from([["LlamaForCausalLM"], ["Qwen3MoeForCausalLM"], [], ["X"]]),
             "model_type": st.sampled_from(list(PRESETS) + ["llama", "qwen3_moe", "deepseek_v3"]),
             "torch_dtype": st.sampled_from(["float16", "bfloat16", "fp8", "int4"]),
             "mlp_only_layers": st.lists(st.integers(-2, 50), max_size=4)}
BASES = (LLAMA, MIXTRAL, QWEN_MOE, DSV3, {**LLAVA, "text_config": LLAMA}, SPEC)


@st.composite
def configs(draw) -> dict:
    """One of the configs above with some of its keys (and a few it may lack) given values of any type."""
    base = dict(draw(st.sampled_from(BASES)))
    keys = sorted(set(base) | set(QWEN_MOE) | set(DSV3) | {"text_config", "quantization_config", "head_dim",
                                                           "dtype", "kv_dtype", "attention", "name"})
    for key in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True)):
        base[key] = draw(PLAUSIBLE.get(key, st.integers(0, 300)) | ANY_JSON)
    return base


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=configs(), tp=st.sampled_from([1, 2, 3, 8, 64]), ep=st.sampled_from([1, 2, 8]))
def test_any_config_loads_or_is_an_input_error(config, tp, ep, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    try:
        spec = load_model_spec(str(path))
        checked_parallelism(spec, tp, ep, str(path))
    except InputError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 1000, message
