"""Run-to-run comparison and the join with a reference GEMM table."""
import pandas as pd
import pytest

from stepcal.profiler.compare import join_gemm_reference, pair_points, summarise


def profile(rows):
    return pd.DataFrame(rows, columns=["point_key", "op", "name", "m", "n", "k", "time_ms",
                                       "time_ms_p10", "time_ms_p90", "status"])


def test_pairs_measure_the_difference_and_the_spread():
    a = profile([("g1", "gemm", "o", 1, 8, 8, 1.0, 0.9, 1.2, "ok"),
                 ("g2", "gemm", "o", 2, 8, 8, 2.0, 1.9, 2.1, "ok"),
                 ("d1", "attn_decode", "uniform", None, None, None, 4.0, 3.0, 5.0, "ok"),
                 ("f1", "gemm", "o", 4, 8, 8, None, None, None, "failed")])
    b = profile([("g1", "gemm", "o", 1, 8, 8, 1.1, 1.0, 1.3, "ok"),
                 ("g2", "gemm", "o", 2, 8, 8, 3.0, 2.9, 3.1, "ok"),
                 ("d1", "attn_decode", "uniform", None, None, None, 4.0, 3.5, 4.5, "ok"),
                 ("f1", "gemm", "o", 4, 8, 8, 1.0, 1.0, 1.0, "ok")])
    pairs = pair_points(a, b).set_index("point_key")
    assert list(pairs.index) == ["g1", "g2", "d1"]                  # failed points left out
    assert pairs.loc["g1", "rel_diff"] == pytest.approx(0.1 / 1.05)
    assert pairs.loc["g2", "cv"] == pytest.approx(1.0 / 2.5 / 2 ** 0.5)
    assert list(pairs["within_spread"]) == [True, False, True]
    assert list(pairs["within_width"]) == [True, False, True]
    summary = summarise(pairs.reset_index())
    assert summary.loc["gemm", "points"] == 2 and summary.loc["gemm", "within_spread"] == 0.5
    assert summary.loc["all", "points"] == 3


def test_join_with_the_aiconfigurator_h100_gemm_table(shared_data):
    table = pd.read_parquet(shared_data / "profiles" / "aiconfigurator" / "h100_sxm" / "gemm"
                            / "vllm" / "0.14.0" / "gemm_perf.parquet")
    ours = profile([("a", "gemm", "qkv_proj", 64, 6144, 4096, 0.02, 0.019, 0.021, "ok"),
                    ("b", "gemm", "o_proj", 4096, 4096, 4096, 0.2, 0.19, 0.21, "ok"),
                    ("c", "gemm", "gate_up_proj", 64, 28672, 4096, 0.1, 0.1, 0.1, "ok")])
    joined = join_gemm_reference(ours, table)
    assert list(joined["name"]) == ["o_proj", "qkv_proj"]            # gate_up's shape is not there
    # the reference is the table's bf16 latency at that (m, n, k), the median of its rows
    bf16 = table[table["gemm_dtype"] == "bfloat16"]
    for _, row in joined.iterrows():
        same = bf16[(bf16["m"] == row["m"]) & (bf16["n"] == row["n"]) & (bf16["k"] == row["k"])]
        assert row["reference_ms"] == same["latency"].median()
    assert joined["ratio"].tolist() == pytest.approx((joined["time_ms"] / joined["reference_ms"]).tolist())
