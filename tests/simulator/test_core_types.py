import json

import numpy as np
import pytest

from stepcal.core.batch import FEATURE_NAMES, StepBatch, StepFeatures, batch_row
from stepcal.core.errors import InputError
from stepcal.core.model_files import load_model_spec
from stepcal.core.model_spec import PRESETS, Parallelism
from stepcal.simulator.step_model import ConstStepModel, LinearStepModel, parse_builtin_step_model


def test_presets_and_kv_bytes():
    qwen = PRESETS["qwen3-14b"]
    assert (qwen.num_layers, qwen.hidden_size, qwen.num_heads, qwen.num_kv_heads, qwen.head_dim,
            qwen.ffn_size, qwen.vocab_size) == (40, 5120, 40, 8, 128, 17408, 151936)
    # 2 (K and V) · layers · kv_heads · head_dim · 2 bytes
    assert qwen.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2 == 163840
    assert PRESETS["llama-2-7b"].kv_bytes_per_token == 524288          # 0.5 MiB per token
    assert 6.5e9 < PRESETS["llama-2-7b"].num_params < 7.0e9
    assert 7.8e9 < PRESETS["llama-3-8b"].num_params < 8.3e9
    assert 68e9 < PRESETS["llama-2-70b"].num_params < 70e9
    assert PRESETS["tiny"].weight_bytes < 10 * 2**20
    assert PRESETS["llama-3-8b"].gemm_shapes()["qkv_proj"] == (4096 + 2 * 1024, 4096)


def test_model_spec_from_file_and_errors(tmp_path):
    path = tmp_path / "m.json"
    spec = dict(PRESETS["tiny"].to_dict(), name="mine")
    path.write_text(json.dumps(spec))
    assert load_model_spec(str(path)).name == "mine"
    toml = tmp_path / "m.toml"
    toml.write_text("\n".join(f'{k} = {json.dumps(v)}' for k, v in spec.items()))
    assert load_model_spec(str(toml)) == load_model_spec(str(path))
    with pytest.raises(InputError, match="neither a preset"):
        load_model_spec("no-such-model")
    path.write_text(json.dumps({**spec, "num_kv_heads": 3}))
    with pytest.raises(InputError, match="multiple of num_kv_heads"):
        load_model_spec(str(path))
    path.write_text(json.dumps({**spec, "extra": 1}))
    with pytest.raises(InputError, match="unknown keys"):
        load_model_spec(str(path))


def test_batch_features_by_hand():
    # two decodes over 10 and 30 cached tokens, one prefill chunk of 4 over 6, one fresh prompt of 3
    batch = StepBatch.of([1, 2, 3, 4], q_lens=[1, 1, 4, 3], kv_lens=[10, 30, 6, 0])
    row = batch_row(batch.q_lens, batch.kv_lens)
    assert row == {"num_seqs": 4, "num_tokens": 9, "num_decode": 2, "decode_kv_sum": 40, "decode_kv_max": 30,
                   "prefill_tokens": 7, "prefill_attn_work": 4 * 6 + 4 * 5 / 2 + 3 * 4 / 2, "kv_sum": 46}
    assert not batch.is_pure_decode
    assert StepBatch.of([1], [1], [0]).is_decode.tolist() == [False]   # a 1-token prompt is a prefill


def test_decode_run_features_equal_step_by_step():
    kv = np.array([5, 17, 300])
    run = StepFeatures.decode_run(kv, 7)
    one_by_one = StepFeatures.from_batches([StepBatch.of([0, 1, 2], [1, 1, 1], kv + j) for j in range(7)])
    for name in FEATURE_NAMES:
        assert np.array_equal(getattr(run, name), getattr(one_by_one, name)), name


def test_step_models_parse_and_agree_bitwise():
    assert parse_builtin_step_model("const:12.5") == ConstStepModel(12.5)
    linear = parse_builtin_step_model("linear:3,0.02,0.001")
    assert linear == LinearStepModel(3, 0.02, 0.001)
    batch = StepBatch.of([0, 1], [1, 128], [99, 0])
    assert linear.step_ms(batch) == pytest.approx(3 + 0.02 * 129 + 0.001 * (99 + 129))
    kv = np.array([11, 40, 7])
    run = linear.decode_run_ms(kv, 50)
    steps = [linear.step_ms(StepBatch.of([0, 1, 2], [1, 1, 1], kv + j)) for j in range(50)]
    assert run.tolist() == steps            # bit-identical: the fast path relies on it
    for j in (0, 7, 49):
        batch = StepBatch.of([0, 1, 2], [1, 1, 1], kv + j)
        assert linear.features_ms(batch.features())[0] == linear.step_ms(batch)   # float path == numpy path
    assert parse_builtin_step_model("tables/") is None
    for bad in ("const:0", "const:x", "linear:1,2", "linear:-1,0,0"):
        with pytest.raises(InputError, match="--step-model"):
            parse_builtin_step_model(bad)


LLAMA3 = PRESETS["llama-3-8b"]     # 32 heads, 8 KV heads of 128, hidden 4096, FFN 14336


def test_tensor_parallelism_splits_heads_ffn_and_vocabulary():
    assert LLAMA3.gemm_shapes(Parallelism(tp=2)) == {
        "qkv_proj": ((16 + 2 * 4) * 128, 4096), "o_proj": (4096, 16 * 128),
        "gate_up_proj": (2 * 7168, 4096), "down_proj": (4096, 7168), "lm_head": (64128, 4096)}
    # Past eight GPUs the KV heads are replicated: one per GPU, never fewer.
    assert LLAMA3.gemm_shapes(Parallelism(tp=16))["qkv_proj"] == ((2 + 2 * 1) * 128, 4096)
    # Whole numbers where the split is even (the profiler times these shapes), else fractions.
    assert all(type(n) is int for n, _ in LLAMA3.gemm_shapes(Parallelism(tp=8)).values())
    assert LLAMA3.gemm_shapes(Parallelism(tp=3))["down_proj"] == (4096, 14336 / 3)
    assert LLAMA3.gemm_shapes(Parallelism(tp=4)) == LLAMA3.gemm_shapes(Parallelism(tp=4, ep=4))   # dense: no experts


@pytest.mark.parametrize("field", ["tp", "ep"])
@pytest.mark.parametrize("value", [0, -2, 1.5, True, "2", None])
def test_parallelism_takes_positive_integers_only(field, value):
    with pytest.raises(InputError, match=f"parallelism: {field} must be a positive integer, got {value!r}"):
        Parallelism(**{field: value})
