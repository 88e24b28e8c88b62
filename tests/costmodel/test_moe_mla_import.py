"""AIConfigurator's MoE and MLA tables: import, detection, bad rows, features, a fit, and the
training-data hash of records that do not use the MoE columns."""
import numpy as np
import pandas as pd
import pytest

from stepcal.core.errors import InputError
from stepcal.costmodel.features import assign_targets, design
from stepcal.costmodel.fitting import FitConfig, fit_all
from stepcal.costmodel.importers import aiconfigurator, detect_format, load_profiles
from stepcal.costmodel.records import data_hash, make_records
from tests.costmodel.conftest import PROFILES, require_shared

H100 = PROFILES / "aiconfigurator/h100_sxm"
MOE = "moe/vllm/0.14.0/moe_perf.parquet"
PREFILL = "mla/vllm/0.14.0/context_mla_perf.parquet"
DECODE = "mla/vllm/0.14.0/generation_mla_perf.parquet"
MIXTRAL = dict(hidden_size=4096, inter_size=14336, num_experts=8, topk=2)   # one shape family


def real_slice(table: str, rows: int, **equal) -> pd.DataFrame:
    """The first `rows` rows of a real table whose columns equal the given values."""
    frame = pd.read_parquet(require_shared(H100 / table))
    for column, value in equal.items():
        frame = frame[frame[column] == value]
    return frame.head(rows).reset_index(drop=True)


def write(frame: pd.DataFrame, directory, name: str):
    path = directory / f"{name}.parquet"
    frame.to_parquet(path, index=False)
    return path


@pytest.fixture(scope="module")
def moe_raw() -> pd.DataFrame:
    """Rows of every dtype: bf16, fp8 and fp8_block run vllm_fused_moe, int4_wo vllm_marlin_moe."""
    frame = pd.read_parquet(require_shared(H100 / MOE))
    return pd.concat([frame[frame["moe_dtype"] == d].head(75) for d in
                      ("bfloat16", "fp8", "fp8_block", "int4_wo")], ignore_index=True)


def test_moe_rows_become_moe_records_with_shape_columns(tmp_path, moe_raw):
    path = write(moe_raw, tmp_path, "moe_perf")
    records = load_profiles([path])
    assert len(records) == len(moe_raw) == 300
    assert (records["op"] == "moe").all() and (records["source"] == "aiconfigurator").all()
    assert records["row"].tolist() == list(range(300))
    assert set(records["dtype"]) == {"bfloat16", "fp8", "fp8_block", "int4"}     # int4_wo -> int4
    assert records["name"].tolist() == moe_raw["distribution"].tolist()
    for ours, theirs in [("num_tokens", "num_tokens"), ("width", "hidden_size"),
                         ("expert_ffn_size", "inter_size"), ("num_experts", "num_experts"),
                         ("experts_per_token", "topk"), ("tp", "moe_tp_size"), ("ep", "moe_ep_size"),
                         ("time_ms", "latency")]:
        np.testing.assert_array_equal(records[ours].to_numpy(), moe_raw[theirs].to_numpy(dtype=float))
    assert records["device"].unique().tolist() == ["NVIDIA H100 80GB HBM3"]
    assert set(assign_targets(records)) <= {"moe:balanced", "moe:power_law_1.01", "moe:power_law_1.2"}


def test_a_dtype_timed_by_two_kernels_keeps_the_fused_moe_rows(tmp_path, moe_raw):
    frame = moe_raw[moe_raw["moe_dtype"] == "bfloat16"].head(10).reset_index(drop=True)
    frame.loc[[1, 4], "kernel_source"] = "vllm_marlin_moe"
    records = load_profiles([write(frame, tmp_path, "moe_perf")])
    assert records["row"].tolist() == [0, 2, 3, 5, 6, 7, 8, 9]      # the file's own row numbers


def test_mla_prefill_and_decode_records(tmp_path):
    prefill_raw = real_slice(PREFILL, 200, kv_cache_dtype="bfloat16")
    decode_raw = real_slice(DECODE, 300)
    prefill = load_profiles([write(prefill_raw, tmp_path, "context_mla_perf")])
    decode = load_profiles([write(decode_raw, tmp_path, "generation_mla_perf")])
    assert len(prefill) == 200 and (prefill["op"] == "mla_prefill").all()
    assert len(decode) == 300 and (decode["op"] == "mla_decode").all()
    b, q = prefill_raw["batch_size"].to_numpy(float), prefill_raw["isl"].to_numpy(float)
    np.testing.assert_array_equal(prefill["prefill_tokens"], b * q)
    np.testing.assert_array_equal(prefill["num_tokens"], b * q)
    np.testing.assert_array_equal(prefill["prefill_attn_work"], b * q * (q + 1) / 2)
    assert (prefill[["kv_sum", "num_decode", "decode_kv_sum"]] == 0).all().all()
    b, s = decode_raw["batch_size"].to_numpy(float), decode_raw["step"].to_numpy(float)
    np.testing.assert_array_equal(decode["decode_kv_sum"], b * s)
    np.testing.assert_array_equal(decode["decode_kv_max"], s)
    np.testing.assert_array_equal(decode["num_decode"], b)
    for records, raw in ((prefill, prefill_raw), (decode, decode_raw)):
        np.testing.assert_array_equal(records["num_heads"], raw["num_heads"].to_numpy(float))
        np.testing.assert_array_equal(records["tp"], raw["tp_size"].to_numpy(float))
        assert records["dtype"].tolist() == raw["kv_cache_dtype"].tolist()
        assert records["num_kv_heads"].isna().all()
    assert set(assign_targets(prefill)) == {"mla_prefill"} and set(assign_targets(decode)) == {"mla_decode"}


def test_detection_of_new_and_old_tables(tmp_path, moe_raw):
    for columns in (moe_raw.columns, ["num_experts", "latency"], ["moe_dtype", "latency"],
                    ["mla_dtype", "batch_size", "latency"], ["gemm_dtype", "m", "latency"],
                    ["batch_size", "isl", "num_key_value_heads", "latency"],
                    ["num_gpus", "message_size", "latency"]):
        assert aiconfigurator.is_aiconfigurator_table(set(columns))
        assert detect_format(columns, "x") == "aiconfigurator"
    assert not aiconfigurator.is_aiconfigurator_table({"num_experts", "time_ms"})
    # An MLA table is told by op_name too, without mla_dtype.
    decode = real_slice(DECODE, 20).drop(columns=["mla_dtype"])
    system = tmp_path / "h100_sxm"
    for sub, frame, name in (("moe/v", moe_raw.head(30), "moe_perf"),
                             ("mla/v", decode, "generation_mla_perf"),
                             ("mla/v", real_slice(PREFILL, 20), "context_mla_perf")):
        (system / sub).mkdir(parents=True, exist_ok=True)
        write(frame, system / sub, name)
    assert [p.stem for p in aiconfigurator.table_files(system)] == [
        "context_mla_perf", "generation_mla_perf", "moe_perf"]
    records = load_profiles([system])                          # a system directory reads them all
    assert records.groupby("op").size().to_dict() == {"mla_decode": 20, "mla_prefill": 20, "moe": 30}


@pytest.mark.parametrize("table, column, value, message", [
    (MOE, "latency", np.nan, r"row 5: column 'latency' must be a finite positive time"),
    (MOE, "num_tokens", 0, r"row 5: column 'num_tokens' must be a positive number"),
    (MOE, "moe_ep_size", np.nan, r"row 5: column 'moe_ep_size' must be a positive number"),
    (MOE, "distribution", None, r"row 5: column 'distribution' must be a non-empty label"),
    (DECODE, "latency", np.nan, r"row 5: column 'latency' must be a finite positive time"),
    (DECODE, "step", 0, r"row 5: column 'step' must be a positive number"),
    (PREFILL, "batch_size", 0, r"row 5: column 'batch_size' must be a positive number"),
])
def test_bad_rows_name_file_row_and_column(tmp_path, table, column, value, message):
    frame = real_slice(table, 12)
    frame[column] = frame[column].astype(object)
    frame.loc[5, column] = value
    path = write(frame, tmp_path, table.rsplit("/", 1)[1].removesuffix(".parquet"))
    with pytest.raises(InputError, match=message) as err:
        load_profiles([path])
    assert str(path) in str(err.value)


@pytest.mark.parametrize("table, column", [(MOE, "topk"), (MOE, "distribution"),
                                           (DECODE, "tp_size"), (PREFILL, "kv_cache_dtype")])
def test_missing_column_is_named(tmp_path, table, column):
    path = write(real_slice(table, 12).drop(columns=[column]), tmp_path, "t")
    with pytest.raises(InputError, match=f"{path}: not a AIConfigurator .*missing column.*{column}"):
        load_profiles([path])


def test_physics_features_follow_the_formulas():
    moe = make_records(dict(row=[0, 1], op="moe", name="balanced", num_tokens=[1, 4096],
                            width=4096, expert_ffn_size=14336, num_experts=8, experts_per_token=2,
                            tp=2, ep=[1, 4], dtype=["bfloat16", "int4"], time_ms=[0.3, 5.0]),
                       source="t", file="t")
    d = design("moe:balanced", moe)
    x = dict(zip(d.names, d.X.T))
    np.testing.assert_allclose(x["flops"], 6 * np.array([1, 4096]) * 2 * 4096 * 14336 / np.array([2, 8]))
    # T = 1 touches 8 (1 - (6/8)^1) = 2 experts; T = 4096 all 8, 2 of them on each of 4 GPUs.
    expert_bytes = 3 * 4096 * 14336 / 2
    np.testing.assert_allclose(x["weight_bytes"], [2 * expert_bytes * 2, 2 * expert_bytes * 0.5])
    np.testing.assert_array_equal(d.size, [1, 4096])
    decode = make_records(dict(row=[0], op="mla_decode", num_decode=[4], decode_kv_sum=[4000],
                               decode_kv_max=[1000], num_heads=16, dtype="bfloat16", time_ms=[0.2]),
                          source="t", file="t")
    d = design("mla_decode", decode)
    x = dict(zip(d.names, d.X[0]))
    assert x["flops"] == 2 * 4000 * 16 * (512 + 64 + 512)
    assert x["bytes"] == 4000 * (512 + 64) * 2 and x["blocks"] == 4 * 4
    prefill = make_records(dict(row=[0], op="mla_prefill", num_seqs=[2], prefill_tokens=[512],
                                prefill_attn_work=[2 * 256 * 257 / 2], kv_sum=[0], num_heads=128,
                                dtype="bfloat16", time_ms=[0.5]), source="t", file="t")
    d = design("mla_prefill", prefill)
    x = dict(zip(d.names, d.X[0]))
    assert x["flops"] == 2 * (256 * 257) * 128 * (192 + 128) and d.size[0] == 256
    assert x["tile_work"] == 2 * 128 * 3                         # two 128-query tiles, causal


def test_fit_on_one_moe_shape_family_learns_a_target_per_distribution(tmp_path):
    raw = pd.read_parquet(require_shared(H100 / MOE))
    family = raw[(raw[list(MIXTRAL)] == pd.Series(MIXTRAL)).all(axis=1)
                 & (raw["moe_dtype"] == "bfloat16") & (raw["distribution"] != "power_law_1.2")]
    family = family.sample(400, random_state=0).reset_index(drop=True)
    records = load_profiles([write(family, tmp_path, "moe_perf")])
    result = fit_all(records, FitConfig(regressor="rf", trials=2))
    assert set(result.targets) == {"moe:balanced", "moe:power_law_1.01"}
    fit = result.targets["moe:balanced"]
    assert fit.feature_names[:7] == ("num_tokens", "width", "expert_ffn_size", "num_experts",
                                     "experts_per_token", "tp", "ep")
    tokens = np.array([1.0, 256.0, 4096.0, 16384.0])
    grid = make_records(dict(row=np.arange(4), op="moe", num_tokens=tokens, width=4096.0,
                             expert_ffn_size=14336.0, num_experts=8.0, experts_per_token=2.0,
                             tp=1.0, ep=1.0, dtype="bfloat16"), source="grid", file="grid")
    predicted = fit.estimator.predict(design("moe:balanced", grid).X)
    assert np.all(np.diff(predicted) > 0), predicted


def pinned_frame() -> pd.DataFrame:
    gemm = make_records(dict(row=[0, 1, 2], op="gemm", m=[1, 64, 4096], n=[4096] * 3, k=[4096] * 3,
                             time_ms=[0.01, 0.02, 0.5], dtype="bf16", device="H100"),
                        source="aiconfigurator", file="a.parquet")
    decode = make_records(dict(row=[0, 1], op="attn_decode", num_seqs=[1, 8], num_decode=[1, 8],
                               decode_kv_sum=[1024, 8192], decode_kv_max=[1024, 1024], num_heads=32,
                               num_kv_heads=8, head_dim=128, time_ms=[0.02, 0.05], dtype="bfloat16"),
                          source="profile", file="b.parquet")
    return pd.concat([gemm, decode], ignore_index=True)


def test_data_hash_of_records_without_moe_columns_is_what_it_was():
    # Values from before the MoE columns existed: tables fitted then keep their hash.
    frame = pinned_frame()
    assert data_hash(frame) == "e41c52105d414225"
    assert data_hash(frame.drop(columns=["num_experts", "experts_per_token", "expert_ffn_size",
                                         "ep"])) == "e41c52105d414225"
    assert data_hash(load_profiles([require_shared(H100 / "attention")])) == "258c905a3b0f0177"
    # Where a MoE column is in use, it counts.
    moe = frame.copy()
    moe.loc[0, "num_experts"] = 8.0
    assert data_hash(moe) != data_hash(frame)
