"""--model-spec takes the Hugging Face config.json users already have (real files in tests/data/hf_configs)."""
import json
from pathlib import Path

import pytest

from stepcal.core.errors import InputError
from stepcal.core.model_files import load_model_spec
from stepcal.core.model_spec import PRESETS
from stepcal.experiments.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"


def _config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize("name, preset", [
    ("llama-3.1-8b-instruct", "llama-3-8b"),   # Llama 3.1 8B has Llama 3 8B's shape
    ("mixtral-8x7b", "mixtral-8x7b"), ("qwen3-30b-a3b", "qwen3-30b-a3b"),
    ("deepseek-r1-0528", "deepseek-v3"),       # R1 is a DeepSeek-V3 checkpoint: fp8 blocks, MLA, 256 experts
])
def test_real_configs_give_the_presets(name, preset):
    spec = load_model_spec(str(CONFIGS / f"{name}.json"))
    expected = PRESETS[preset]
    assert spec.to_dict() == {**expected.to_dict(), "name": name}


@pytest.mark.parametrize("name, layers, experts, kind, dtype, billions", [
    ("qwen2.5-7b-instruct", 28, 0, "gqa", "bfloat16", 7.6),     # Qwen2.5 card: 7.61B
    ("qwen3-8b", 36, 0, "gqa", "bfloat16", 8.2),                # Qwen3 card: 8.2B
    ("kimi-k2-instruct", 61, 384, "mla", "fp8_block", 1040),    # Moonshot: 1T total (1.04T)
    ("devstral-small-2-24b", 40, 0, "gqa", "fp8", 23.6),        # text_config of a Mistral3 VLM: 24B with vision
])
def test_other_architectures_and_text_config(name, layers, experts, kind, dtype, billions):
    spec = load_model_spec(str(CONFIGS / f"{name}.json"))
    assert (spec.num_layers, spec.num_experts, spec.attention, spec.dtype) == (layers, experts, kind, dtype)
    assert spec.num_params / 1e9 == pytest.approx(billions, rel=0.02)


@pytest.mark.parametrize("name, qk_norm", [("qwen3-8b", True), ("qwen3-30b-a3b", True), ("qwen2.5-7b-instruct", False),
                                           ("llama-3.1-8b-instruct", False), ("mixtral-8x7b", False)])
def test_qwen3_layers_normalise_query_and_key_heads(name, qk_norm):
    assert load_model_spec(str(CONFIGS / f"{name}.json")).qk_norm is qk_norm


def test_a_sparse_text_config_names_the_missing_key():
    # llava's text_config leaves most sizes to LlamaConfig's defaults, which we do not guess
    with pytest.raises(InputError, match=r"llava-1.5-7b.json: text_config.hidden_size: missing"):
        load_model_spec(str(CONFIGS / "llava-1.5-7b.json"))


def test_a_model_directory_is_named_after_itself(tmp_path):
    model = tmp_path / "Mixtral-8x7B-v0.1"
    model.mkdir()
    (model / "config.json").write_text((CONFIGS / "mixtral-8x7b.json").read_text())
    spec = load_model_spec(str(model))
    assert spec.name == "Mixtral-8x7B-v0.1" and spec.num_experts == 8


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(architectures=["GPT2LMHeadModel"]),
     "architectures: GPT2LMHeadModel is not supported; supported: LlamaForCausalLM"),
    (lambda c: c.pop("num_local_experts"), "num_local_experts: missing"),
    (lambda c: c.update(num_hidden_layers="32"), "num_hidden_layers: must be an integer >= 1, got '32'"),
    (lambda c: c.update(num_experts_per_tok=9), "experts_per_token must be 1..num_experts"),
    (lambda c: c.update(torch_dtype="float64"), "torch_dtype: unknown dtype 'float64'"),
    (lambda c: c.update(quantization_config={"quant_method": "awq"}),
     "quantization_config.quant_method: 'awq' is not supported"),
])
def test_bad_configs_name_the_file_and_the_key(tmp_path, edit, message):
    config = _config("mixtral-8x7b")
    edit(config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(InputError) as info:
        load_model_spec(str(path))
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_irregular_moe_layouts_are_refused(tmp_path):
    qwen = _config("qwen3-30b-a3b")
    qwen["mlp_only_layers"] = [5]
    path = tmp_path / "qwen.json"
    path.write_text(json.dumps(qwen))
    with pytest.raises(InputError, match="mlp_only_layers: dense layers \\[5\\] are not the first layers"):
        load_model_spec(str(path))
    dsv3 = _config("deepseek-r1-0528")
    dsv3["v_head_dim"] = 64
    path.write_text(json.dumps(dsv3))
    with pytest.raises(InputError, match="v_head_dim: 64 differs from qk_nope_head_dim 128"):
        load_model_spec(str(path))


def test_text_config_of_a_multimodal_model(tmp_path):
    config = {"architectures": ["SomeVisionForConditionalGeneration"], "vision_config": {"hidden_size": 1024},
              "text_config": {k: v for k, v in _config("llama-3.1-8b-instruct").items() if k != "architectures"}}
    config["text_config"]["model_type"] = "llama"
    path = tmp_path / "vlm.json"
    path.write_text(json.dumps(config))
    assert load_model_spec(str(path)).to_dict() == {**PRESETS["llama-3-8b"].to_dict(), "name": "vlm"}
    del config["text_config"]["num_attention_heads"]
    path.write_text(json.dumps(config))
    with pytest.raises(InputError, match="text_config.num_attention_heads: missing"):
        load_model_spec(str(path))


def test_simulate_sizes_the_kv_cache_from_a_hf_config(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", "--trace", "poisson:rate=5,n=20,prompt=fixed:64,output=fixed:4", "--step-model",
                 "const:10", "--model-spec", str(CONFIGS / "mixtral-8x7b.json"), "--device-memory-gb", "80",
                 "--tp", "2", "--out", str(out)]) == 0
    assert main(["simulate", "--trace", "poisson:rate=5,n=20,prompt=fixed:64,output=fixed:4", "--step-model",
                 "const:10", "--model-spec", str(CONFIGS / "mixtral-8x7b.json"), "--device-memory-gb", "80",
                 "--out", str(tmp_path / "sim1")]) == 2
    err = capsys.readouterr().err
    assert "leave no room for a KV cache" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sim1").exists()
