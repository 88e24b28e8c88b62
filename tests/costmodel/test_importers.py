import numpy as np
import pandas as pd
import pytest

from stepcal.core.errors import InputError
from stepcal.costmodel.importers import detect_format, load_file, load_profiles
from tests.costmodel.conftest import PROFILES, make_profile, make_step_log, require_shared


def test_profile_table_skips_failed_points_and_keeps_row_numbers(profile_file):
    frame = pd.read_parquet(profile_file)
    records = load_profiles([profile_file])
    assert len(records) == len(frame) - 1                      # the failed point is skipped
    assert set(records["op"]) == {"gemm", "attn_decode", "attn_prefill", "overhead"}
    assert records["row"].max() == len(frame) - 2             # numbering of the file's own rows
    assert (records["device"] == "Test CPU").all()            # the chip's name, not "cpu"
    gemm = records[records["op"] == "gemm"].iloc[0]
    assert (gemm["m"], gemm["n"], gemm["k"]) == (1, 512, 256)   # tiny: Q 256 + K, V 128 each


def test_profile_features_are_derived_from_q_and_kv_lens(tmp_path):
    frame = make_profile()
    frame.loc[frame["op"] == "attn_decode", "decode_kv_sum"] = np.nan
    path = tmp_path / "p.parquet"
    frame.to_parquet(path, index=False)
    records = load_profiles([path])
    decode = records[records["op"] == "attn_decode"]
    kv = frame.loc[frame["op"] == "attn_decode", "kv_lens"].map(sum).to_numpy()
    np.testing.assert_array_equal(decode["decode_kv_sum"].to_numpy(), kv)


def test_step_log_becomes_whole_step_records(step_log_file):
    records = load_profiles([step_log_file])
    assert (records["op"] == "step").all()
    log = pd.read_parquet(step_log_file)
    np.testing.assert_allclose(records["time_ms"], log["duration_ms"])
    np.testing.assert_array_equal(records["num_tokens"], log["num_tokens"])


@pytest.mark.parametrize("column, value, message", [
    ("time_ms", np.nan, "row 3: column 'time_ms' must be a finite positive time"),
    ("time_ms", -1.0, "row 3: column 'time_ms' must be a finite positive time"),
    ("m", 0, "row 3: column 'm' must be a positive number"),
    ("status", "maybe", "row 3: column 'status' must be 'ok' or 'failed'"),
])
def test_malformed_profile_names_file_row_and_column(tmp_path, column, value, message):
    frame = make_profile()
    frame[column] = frame[column].astype(object)
    frame.loc[3, column] = value
    path = tmp_path / "bad.parquet"
    frame.to_parquet(path, index=False)
    with pytest.raises(InputError, match=message) as err:
        load_profiles([path])
    assert str(path) in str(err.value)


def test_missing_column_is_named(tmp_path):
    path = tmp_path / "steps.csv"
    make_step_log(20).drop(columns=["q_lens", "kv_lens", "decode_kv_sum"]).to_csv(path, index=False)
    with pytest.raises(InputError, match="missing column.*decode_kv_sum"):
        load_profiles([path])


def test_vidur_mlp_csv_becomes_gemm_and_small_op_records():
    path = require_shared(PROFILES / "vidur/h100/meta-llama/Llama-2-7b-hf/mlp.csv")
    raw = pd.read_csv(path)
    records = load_profiles([path])
    assert len(records) == 10 * len(raw)
    qkv = records[(records["name"] == "qkv_proj") & (records["tp"] == 2)].iloc[0]
    # Llama-2-7B: 32 heads x 128 for Q, K and V each, split over two GPUs.
    assert (qkv["n"], qkv["k"]) == (3 * 4096 / 2, 4096)
    assert set(records.loc[records["op"] == "elementwise", "name"]) == {
        "emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add"}
    first = records[(records["name"] == "down_proj")].iloc[0]
    assert first["time_ms"] == raw.loc[first["row"], "time_stats.mlp_down_proj.median"]


def test_vidur_bad_time_names_row_and_column(tmp_path):
    path = require_shared(PROFILES / "vidur/h100/meta-llama/Llama-2-7b-hf/mlp.csv")
    raw = pd.read_csv(path).head(20)
    raw.loc[7, "time_stats.mlp_act.median"] = 0.0
    bad = tmp_path / "mlp.csv"
    raw.to_csv(bad, index=False)
    with pytest.raises(InputError, match=r"mlp.csv: row 7: column 'time_stats.mlp_act.median'"):
        load_profiles([bad])


def test_aiconfigurator_directory_is_read_whole():
    path = require_shared(PROFILES / "aiconfigurator/h100_sxm")
    records = load_profiles([path])
    counts = records.groupby("op").size()
    assert counts["gemm"] == 26040 and counts["attn_decode"] == 10870
    decode = records[records["op"] == "attn_decode"]
    assert (decode["decode_kv_sum"] == decode["num_decode"] * decode["decode_kv_max"]).all()
    prefill = records[records["op"] == "attn_prefill"].iloc[0]
    q = prefill["prefill_tokens"] / prefill["num_seqs"]
    assert prefill["prefill_attn_work"] == prefill["num_seqs"] * q * (q + 1) / 2
    assert records["device"].unique().tolist() == ["NVIDIA H100 80GB HBM3"]
    reduce = records[records["op"] == "all_reduce"]             # custom_allreduce_perf
    assert len(reduce) == 138 and set(reduce["tp"]) == {2.0, 4.0, 8.0}
    assert set(reduce["name"]) == {"vllm_graph", "vllm_eager"} and (reduce["width"] == 1).all()


def test_aiconfigurator_all_reduce_rows_become_tp_records(tmp_path):
    from stepcal.costmodel.features import assign_targets, design
    frame = pd.DataFrame({"num_gpus": [2, 4, 8], "message_size": [128, 4096, 1 << 20],
                          "latency": [0.004, 0.006, 0.03], "allreduce_dtype": "bfloat16",
                          "backend": "vllm_graph", "device": "H100"})
    path = tmp_path / "custom_allreduce_perf.parquet"
    frame.to_parquet(path)
    records = load_profiles([path])
    assert (records["op"] == "all_reduce").all() and records["tp"].tolist() == [2.0, 4.0, 8.0]
    assert set(assign_targets(records)) == {"all_reduce:vllm_graph"}
    d = design("all_reduce:vllm_graph", records)
    message = d.X[:, d.names.index("message_bytes")]
    ring = d.X[:, d.names.index("ring_bytes")]
    assert message.tolist() == [256.0, 8192.0, 2.0 * (1 << 20)]       # elements x 2 bytes (bf16)
    assert ring.tolist() == pytest.approx([256.0, 1.5 * 8192.0, 1.75 * 2.0 * (1 << 20)])   # 2 (tp-1)/tp
    frame.loc[1, "latency"] = -1.0
    frame.to_parquet(path)
    with pytest.raises(InputError, match="row 1.*latency"):
        load_profiles([path])


def test_splitwise_rows_give_a_prompt_and_a_token_step():
    path = require_shared(PROFILES / "splitwise/perf_model_llama2-70b.csv")
    raw = pd.read_csv(path)
    records = load_file(path)
    assert len(records) == 2 * len(raw)
    prompt = records[records["name"] == "prompt"].iloc[0]
    assert prompt["num_tokens"] == raw["batch_size"][0] * raw["prompt_size"][0]
    assert prompt["time_ms"] == raw["prompt_time"][0]
    token = records[records["name"] == "token"].iloc[0]
    assert token["num_decode"] == raw["batch_size"][0]
    assert token["decode_kv_max"] == raw["prompt_size"][0] + raw["token_size"][0] / 2


def test_format_detection_and_unknown_files(tmp_path):
    assert detect_format(["op", "time_ms", "m"], "x") == "profile"
    assert detect_format(["duration_ms", "num_seqs"], "x") == "steplog"
    assert detect_format(["prompt_time", "token_time"], "x") == "splitwise"
    path = tmp_path / "other.csv"
    pd.DataFrame({"a": [1], "b": [2]}).to_csv(path, index=False)
    with pytest.raises(InputError, match="cannot tell the format"):
        load_profiles([path])
    with pytest.raises(InputError, match="no such file"):
        load_profiles([tmp_path / "absent.csv"])
    with pytest.raises(InputError, match="neither profile.parquet nor AIConfigurator"):
        load_profiles([tmp_path])


def test_vidur_all_reduce_csv_becomes_rank_0_all_reduce_records(tmp_path):
    frame = pd.DataFrame({"time_stats.all_reduce.median": [0.02, 0.021, 0.05, 0.3],
                          "rank": [0, 1, 0, 0], "num_workers": [2, 2, 4, 8],
                          "size": [2048, 2048, 1 << 20, 1 << 26], "collective": "all_reduce"})
    path = tmp_path / "all_reduce.csv"
    frame.to_csv(path)
    assert detect_format(pd.read_csv(path).columns, path) == "vidur"
    records = load_profiles([path])
    assert (records["op"] == "all_reduce").all() and records["row"].tolist() == [0, 2, 3]   # rank 0 only
    assert records["tp"].tolist() == [2.0, 4.0, 8.0]
    assert records["num_tokens"].tolist() == [1024.0, float(1 << 19), float(1 << 25)]        # 2-byte elements
    frame.loc[2, "size"] = 0
    frame.to_csv(path)
    with pytest.raises(InputError, match="row 2.*size"):
        load_profiles([path])
