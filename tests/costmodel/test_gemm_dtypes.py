"""GEMMs priced per dtype: a model with quantised weights runs its router and LM head in the compute
dtype (vLLM leaves them unquantised), and composition prices each from that dtype's rows."""
import json

import numpy as np
import pandas as pd
import pytest

from stepcal.core.model_spec import PRESETS, Parallelism
from stepcal.costmodel.build import build_tables
from stepcal.costmodel.compose import Axes, op_grids
from stepcal.costmodel.features import assign_targets
from stepcal.costmodel.fitting import FitConfig, dtypes_for, fit_all, select_records
from stepcal.costmodel.importers.aiconfigurator import import_table

DSV3, LLAMA = PRESETS["deepseek-v3"], PRESETS["llama-3-8b"]
TP8 = Parallelism(tp=8)
AXES = Axes(num_tokens=np.array([1.0, 64.0, 1024.0]), num_seqs=np.array([1.0, 64.0]),
            kv_mean=np.array([1.0, 4096.0]), prefill_tokens=np.array([1.0, 2048.0]),
            prefill_ctx=np.array([1.0, 4096.0]))
# Per-dtype (launch floor in ms, tensor-core rate in FLOP/ms) of the fixture's made-up kernels:
# block-scaled fp8 has a higher floor, as AIConfigurator's H100 rows do.
KERNELS = {"bfloat16": (0.006, 4e11), "fp8_block": (0.035, 8e11)}


def gemm_table(scale: dict | None = None) -> pd.DataFrame:
    """An AIConfigurator-like gemm_perf table with both dtypes over DeepSeek-V3 TP8's GEMM shapes
    (`scale`: a factor on one dtype's latencies)."""
    scale = scale or {}
    shapes = sorted(set(DSV3.gemm_shapes(TP8).values()))
    rows = []
    for dtype, (floor_ms, rate) in KERNELS.items():
        for m in 2 ** np.arange(0, 11):
            for n, k in shapes:
                latency = (floor_ms + 2 * m * n * k / rate) * scale.get(dtype, 1.0)
                rows.append(dict(framework="VLLM", version="0.14.0", device="NVIDIA H100 80GB HBM3",
                                 op_name="gemm", kernel_source="test", gemm_dtype=dtype, m=m, n=n, k=k,
                                 latency=latency))
    return pd.DataFrame(rows)


def deepseek_ops(scale: dict | None = None, tmp_path=None):
    records = select_records(import_table(gemm_table(scale), "gemm_perf.parquet"), dtype=dtypes_for(DSV3))
    result = fit_all(records, FitConfig(regressor="rf"))
    ops = op_grids(result, DSV3, TP8, AXES)
    if tmp_path is not None:
        build_tables(result, tmp_path, spec=DSV3, parallelism=TP8, axes=AXES)
    return result, ops


def times(ops: pd.DataFrame, op: str) -> np.ndarray:
    return ops.loc[ops["op"] == op, "time_ms"].to_numpy()


def test_vllm_runs_router_and_lm_head_in_the_compute_dtype():
    dtypes = DSV3.gemm_dtypes()
    assert dtypes["router"] == dtypes["lm_head"] == "bfloat16"
    assert {d for name, d in dtypes.items() if name not in ("router", "lm_head")} == {"fp8_block"}
    assert set(LLAMA.gemm_dtypes().values()) == {LLAMA.dtype}        # unquantised: one dtype
    assert dtypes_for(DSV3)["gemm"] == ("bfloat16", "fp8_block") and dtypes_for(LLAMA)["gemm"] == "bfloat16"


def test_each_gemm_dtype_is_its_own_target_only_where_a_fit_holds_several():
    both = import_table(gemm_table(), "gemm_perf.parquet")
    assert set(assign_targets(both)) == {"gemm:bfloat16", "gemm:fp8_block"}
    one = both[both["dtype"] == "bfloat16"]
    assert set(assign_targets(one)) == {"gemm"}
    # Rows predicted with a per-dtype fit's regressors go to their own dtype's target.
    assert set(assign_targets(one, fitted=["gemm:bfloat16", "gemm:fp8_block"])) == {"gemm:bfloat16"}


@pytest.fixture(scope="module")
def base():
    return deepseek_ops()


def test_router_is_priced_from_the_bf16_rows(base):
    _, ops = base
    _, bf16_doubled = deepseek_ops({"bfloat16": 2.0})
    _, fp8_doubled = deepseek_ops({"fp8_block": 2.0})
    router = times(ops, "router")
    np.testing.assert_allclose(times(bf16_doubled, "router"), 2 * router, rtol=1e-3)
    np.testing.assert_allclose(times(fp8_doubled, "router"), router, rtol=1e-12)
    # ... and the weights' GEMMs from the fp8_block rows.
    np.testing.assert_allclose(times(fp8_doubled, "q_a_proj"), 2 * times(ops, "q_a_proj"), rtol=1e-3)
    np.testing.assert_allclose(times(bf16_doubled, "q_a_proj"), times(ops, "q_a_proj"), rtol=1e-12)


def test_meta_says_which_dtype_priced_each_gemm(tmp_path):
    deepseek_ops(tmp_path=tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    priced = meta["term_sources"]["linear"]["gemm_dtypes"]
    assert priced["router"] == "bfloat16" and priced["q_a_proj"] == priced["o_proj"] == "fp8_block"
    assert meta["term_sources"]["lm_head"]["dtype"] == "bfloat16"
    assert {"gemm:bfloat16", "gemm:fp8_block"} <= set(meta["targets"])


def test_without_rows_of_its_dtype_a_gemm_is_priced_at_the_weights_and_a_note_says_so(tmp_path):
    fp8_only = gemm_table()
    fp8_only = fp8_only[fp8_only["gemm_dtype"] == "fp8_block"]
    records = select_records(import_table(fp8_only, "gemm_perf.parquet"), dtype=dtypes_for(DSV3))
    build_tables(fit_all(records, FitConfig(regressor="rf")), tmp_path, spec=DSV3, parallelism=TP8, axes=AXES)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["term_sources"]["linear"]["gemm_dtypes"]["router"] == "fp8_block"
    assert any(n.startswith("router GEMM runs in bfloat16") and "fp8_block" in n for n in meta["notes"])


def test_predict_sends_each_gemm_row_to_its_dtypes_regressor(tmp_path):
    from stepcal.costmodel.predict import predict_records
    deepseek_ops(tmp_path=tmp_path)
    rows = import_table(gemm_table(), "gemm_perf.parquet")
    for dtype in KERNELS:
        one = rows[rows["dtype"] == dtype].reset_index(drop=True)
        predicted = predict_records(tmp_path, one)
        assert predicted["predicted_ms"].notna().all()
        assert predicted["ape_percent"].median() < 10       # its own kernel's times, not the other's
