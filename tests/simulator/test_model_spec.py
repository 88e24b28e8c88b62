"""ModelSpec of every model family: sizes against published figures, parallel splits, validation."""
import json

import pytest

from stepcal.core.errors import InputError
from stepcal.core.model_files import load_model_spec
from stepcal.core.model_spec import PRESETS, ModelSpec, Parallelism
from stepcal.simulator.kv_cache import kv_blocks_from_memory

MIXTRAL, QWEN_MOE, DSV3 = PRESETS["mixtral-8x7b"], PRESETS["qwen3-30b-a3b"], PRESETS["deepseek-v3"]


@pytest.mark.parametrize("name, published_params", [
    ("mixtral-8x7b", 46.7e9),       # Mistral AI's announcement: 46.7B total parameters
    ("qwen3-30b-a3b", 30.5e9),      # Qwen3 model card: 30.5B total
    ("deepseek-v3", 671e9),         # DeepSeek-V3 report: 671B total (the MTP module's 14B aside)
    ("llama-3-8b", 8.03e9),
])
def test_parameter_counts_match_published_totals(name, published_params):
    assert PRESETS[name].num_params == pytest.approx(published_params, rel=0.005)


def test_kv_bytes_follow_the_attention_kind():
    # GQA: K and V of every KV head; MLA: one 512 latent + 64 rope key per token and layer
    assert MIXTRAL.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2
    assert DSV3.kv_bytes_per_token == 61 * (512 + 64) * 2      # 70,272 B: DeepSeek-V2 paper's ~70 KB
    # per GPU: GQA's KV heads split (at least one each), MLA's latent replicated
    assert MIXTRAL.kv_bytes_per_token_per_gpu(Parallelism(tp=2)) == MIXTRAL.kv_bytes_per_token / 2
    assert MIXTRAL.kv_bytes_per_token_per_gpu(Parallelism(tp=16)) == MIXTRAL.kv_bytes_per_token / 8
    assert DSV3.kv_bytes_per_token_per_gpu(Parallelism(tp=8)) == DSV3.kv_bytes_per_token


def test_weights_per_gpu_shard_by_tp_and_ep():
    one = MIXTRAL.weight_bytes_per_gpu()
    assert one == MIXTRAL.weight_bytes
    two = MIXTRAL.weight_bytes_per_gpu(Parallelism(tp=2))
    assert one / 2 < two < one / 2 * 1.001          # norms and router replicated, the rest halved
    # EP or TP over the experts: the same bytes per GPU (all experts split eight ways either way)
    assert DSV3.weight_bytes_per_gpu(Parallelism(tp=8, ep=8)) == pytest.approx(
        DSV3.weight_bytes_per_gpu(Parallelism(tp=8)))


def test_moe_gemms_and_layer_counts():
    counts = DSV3.gemm_layer_counts()
    assert counts["gate_up_proj"] == 3 and counts["router"] == 58 and counts["kv_b_proj"] == 61
    assert "qkv_proj" not in counts and "gate_up_proj" not in MIXTRAL.gemm_layer_counts()
    shapes = DSV3.gemm_shapes(Parallelism(tp=8))
    assert shapes["q_b_proj"] == (16 * (128 + 64), 1536)
    assert shapes["kv_a_proj"] == (512 + 64, 7168)
    assert shapes["router"] == (256, 7168)                   # replicated, not split
    assert shapes["shared_gate_up_proj"] == (2 * 2048 // 8, 7168)


def test_kv_blocks_on_a_gpu_grow_with_tp_and_mla_is_compact():
    blocks = {tp: kv_blocks_from_memory(MIXTRAL, 16, 80, parallelism=Parallelism(tp=tp)) for tp in (2, 4)}
    assert blocks[4] > 2 * blocks[2]         # half the KV per GPU and half the weights
    with pytest.raises(InputError, match=r"mixtral-8x7b .*87.0 GiB per GPU\) leave no room"):
        kv_blocks_from_memory(MIXTRAL, 16, 80)
    on_h200 = kv_blocks_from_memory(DSV3, 16, 141, parallelism=Parallelism(tp=8, ep=8))
    budget = 141 * 2**30 * 0.9 - DSV3.weight_bytes_per_gpu(Parallelism(tp=8, ep=8))
    assert on_h200 == int(budget // (70272 * 16))


@pytest.mark.parametrize("change, message", [
    ({"num_layers": True}, "num_layers must be a positive integer, got True"),
    ({"num_experts": 8, "experts_per_token": 9, "expert_ffn_size": 64}, "experts_per_token must be 1..num_experts"),
    ({"num_experts": 8, "experts_per_token": 2}, "expert_ffn_size must be positive"),
    ({"experts_per_token": 2}, "experts_per_token is set but num_experts is 0"),
    ({"num_experts": 4, "experts_per_token": 1, "expert_ffn_size": 8, "num_dense_layers": 2},
     "num_dense_layers \\(2\\) must be below num_layers"),
    ({"attention": "mla"}, "MLA attention needs a positive kv_latent_dim"),
    ({"kv_latent_dim": 64}, "belong to attention \"mla\""),
    ({"attention": "mha"}, "attention must be one of gqa, mla"),
    ({"kv_dtype": "int3"}, "unknown kv_dtype 'int3'"),
    ({"num_shared_experts": -1}, "num_shared_experts must be a non-negative integer"),
    ({"qk_norm": "yes"}, "qk_norm must be true or false, got 'yes'"),
    ({"qk_norm": True, "attention": "mla", "num_heads": 2, "kv_latent_dim": 32, "rope_head_dim": 8},
     "qk_norm normalises GQA query and key heads"),
])
def test_bad_specs_are_one_clear_line(change, message):
    fields = dict(name="m", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  ffn_size=128, vocab_size=100)
    with pytest.raises(InputError, match=message):
        ModelSpec(**{**fields, **change})


@pytest.mark.parametrize("tp, ep", [(2, 4), (6, 4)])
def test_ep_must_divide_tp(tp, ep):
    with pytest.raises(InputError, match=f"--ep \\({ep}\\) must divide --tp \\({tp}\\)"):
        Parallelism(tp=tp, ep=ep)


def test_spec_json_round_trips_every_family(tmp_path):
    for spec in (MIXTRAL, DSV3, PRESETS["tiny-moe"], PRESETS["qwen3-14b"]):
        path = tmp_path / f"{spec.name}.json"
        path.write_text(json.dumps(spec.to_dict()))
        assert load_model_spec(str(path)) == spec


@pytest.mark.parametrize("content, message", [
    ('"tiny"', "is a JSON object of ModelSpec fields or a Hugging Face config.json, got a str"),
    ("[1, 2]", "got a list"),
    ('{"num_layers": 2}', "missing keys"),
])
def test_malformed_spec_files(tmp_path, content, message):
    path = tmp_path / "spec.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        load_model_spec(str(path))


def test_qk_norm_is_written_only_where_the_model_has_it():
    """A spec without per-head norms writes the dict it wrote before the field existed: profiles resume
    and tables compare on it."""
    assert PRESETS["qwen3-14b"].qk_norm and PRESETS["qwen3-14b"].to_dict()["qk_norm"] is True
    assert "qk_norm" not in PRESETS["llama-3-8b"].to_dict()
    assert ModelSpec(**PRESETS["llama-3-8b"].to_dict()) == PRESETS["llama-3-8b"]
