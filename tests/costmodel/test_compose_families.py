"""Composition of mixture-of-experts and MLA models under tensor and expert parallelism.

Every operator costs 1 ms per call here (a stub regressor), so each term's value counts the calls
composition makes: layers that run an op, collectives per step."""
import json

import numpy as np
import pandas as pd
import pytest

from stepcal.core.batch import StepBatch
from stepcal.core.errors import InputError
from stepcal.core.model_spec import PRESETS, Parallelism
from stepcal.costmodel.build import build_tables
from stepcal.costmodel.compose import Axes, compose_terms, op_grids
from stepcal.costmodel.compose_comm import Composition, all_to_all_bytes
from stepcal.costmodel.fitting import FitConfig, FitResult, TargetFit, dtypes_for, select_records
from stepcal.costmodel.records import make_records
from stepcal.costmodel.tables import load_step_model
from stepcal.costmodel.tuning import default_choice

MIXTRAL, DSV3, LLAMA = PRESETS["mixtral-8x7b"], PRESETS["deepseek-v3"], PRESETS["llama-3-8b"]
AXES = Axes(num_tokens=np.array([1.0, 64.0, 4096.0]), num_seqs=np.array([1.0, 64.0]),
            kv_mean=np.array([1.0, 4096.0]), prefill_tokens=np.array([1.0, 2048.0]),
            prefill_ctx=np.array([1.0, 4096.0]))


class OneMs:
    """Every call of the operator takes 1 ms, whatever its shape."""

    def predict(self, X):
        return np.ones(len(X))


def _records(**by_op) -> pd.DataFrame:
    frames = [make_records({"row": np.arange(len(v["num_tokens"])), "op": op.split(":")[0],
                            "name": op.split(":")[1] if ":" in op else None, "time_ms": 1.0, **v},
                           source="test", file="test") for op, v in by_op.items()]
    return pd.concat(frames, ignore_index=True)


def result_of(targets, records=None) -> FitResult:
    fits = {t: TargetFit(t, t.split(":")[0], (), (), default_choice("gemm"), OneMs(), 10, {}, {})
            for t in targets}
    records = records if records is not None else _records(gemm={"num_tokens": [1.0], "m": [1], "n": [1], "k": [1]})
    return FitResult(fits, {}, "hash", records, FitConfig(regressor="rf"))


MOE_TARGETS = ("gemm", "moe:balanced", "moe:power_law_1.2", "attn_decode", "attn_prefill",
               "mla_decode", "mla_prefill", "all_reduce:vllm_graph")


def terms_at(spec, parallelism, composition=None, targets=MOE_TARGETS) -> dict:
    composition = composition or Composition()
    result = result_of(targets)
    ops = op_grids(result, spec, parallelism, AXES, composition)
    return {t.name: t for t in compose_terms(result, spec, parallelism, AXES, ops, composition)}, ops


def test_mixtral_tp2_counts_layers_experts_and_all_reduces():
    terms, ops = terms_at(MIXTRAL, Parallelism(tp=2))
    assert set(terms) == {"linear", "moe", "lm_head", "decode_attn", "prefill_attn", "all_reduce"}
    layers = ops.groupby("op")["layers"].first().to_dict()
    assert layers == {"qkv_proj": 32, "o_proj": 32, "router": 32, "moe_experts": 32}   # no dense FFN
    assert terms["linear"].time_ms[0] == 3 * 32                 # qkv, o, router in every layer
    assert terms["moe"].time_ms[0] == 32
    assert terms["decode_attn"].time_ms[0, 0] == 32
    assert terms["all_reduce"].time_ms[0] == 64                # after attention and after the split experts


def test_dense_models_compose_as_before():
    terms, ops = terms_at(LLAMA, Parallelism(tp=4), targets=("gemm", "attn_decode", "attn_prefill", "all_reduce:x"))
    assert "moe" not in terms and "all_to_all" not in terms
    assert terms["linear"].time_ms[0] == 4 * 32 and terms["all_reduce"].time_ms[0] == 2 * 32


def test_deepseek_ep8_uses_mla_and_an_all_to_all_from_link_bandwidth():
    composition = Composition(ep_link_gbps=450.0, ep_latency_us=10.0)
    terms, ops = terms_at(DSV3, Parallelism(tp=8, ep=8), composition)
    assert set(terms) == {"linear", "moe", "lm_head", "decode_attn", "prefill_attn", "all_reduce", "all_to_all"}
    assert "MLA" in terms["decode_attn"].description
    layers = ops.groupby("op")["layers"].first().to_dict()
    assert layers["gate_up_proj"] == 3 and layers["shared_gate_up_proj"] == 58 and layers["kv_b_proj"] == 61
    # one GPU per expert: no all-reduce after the experts (combine sums them), one after attention
    assert terms["all_reduce"].time_ms[0] == 61 + 3
    T = AXES.num_tokens
    per_gpu = T / 8 * 8 * 7168 * 2 * 7 / 8          # its 1/8 of the tokens, to 8 experts, 7/8 remote, bf16
    assert all_to_all_bytes(DSV3, Parallelism(tp=8, ep=8), T) == pytest.approx(per_gpu)
    expected_ms = 2 * 58 * (10e-6 + per_gpu / 450e9) * 1e3
    assert terms["all_to_all"].time_ms == pytest.approx(expected_ms)
    # experts split by tensor parallelism instead: all-reduces after the MoE layers too, no all-to-all
    tp_terms, _ = terms_at(DSV3, Parallelism(tp=8))
    assert "all_to_all" not in tp_terms and tp_terms["all_reduce"].time_ms[0] == 61 + 61


def test_the_routing_distribution_is_a_choice_the_data_must_hold():
    with pytest.raises(InputError, match="--moe-distribution power_law_2: no MoE data for it; the profiles "
                                         "have balanced, power_law_1.2"):
        terms_at(MIXTRAL, Parallelism(), Composition(moe_distribution="power_law_2"))


def test_without_balanced_data_the_least_skewed_routing_is_used_and_named():
    terms, _ = terms_at(MIXTRAL, Parallelism(), targets=("gemm", "moe:power_law_1.2", "moe:power_law_1.01"))
    assert "power_law_1.01 routing" in terms["moe"].description


def test_tables_of_a_moe_model_simulate_and_say_what_was_assumed(tmp_path):
    records = _records(**{"moe:balanced": {"num_tokens": [1.0, 16.0], "width": [4096] * 2,
                                           "expert_ffn_size": [14336] * 2, "num_experts": [8] * 2,
                                           "experts_per_token": [2] * 2, "tp": [1] * 2, "ep": [1] * 2}})
    result = result_of(MOE_TARGETS, records)
    meta = build_tables(result, tmp_path, spec=DSV3, parallelism=Parallelism(tp=8, ep=8), axes=AXES)
    assert meta.composition["all_to_all"]["source"].startswith("link bandwidth")
    assert meta.composition["decode_target"] == "mla_decode" and meta.ep == 8
    # No element-wise data and no device named: no roofline either.
    assert meta.missing_terms == ["elementwise", "overhead", "sampling"]
    moe_note = [n for n in meta.notes if n.startswith("MoE experts")]
    assert moe_note and "extrapolated" in moe_note[0] and "num_experts=256 (measured 8..8)" in moe_note[0]
    written = json.loads((tmp_path / "meta.json").read_text())
    assert written["t_step_terms"] == meta.t_step_terms
    model = load_step_model(tmp_path)
    decode = StepBatch.of(list(range(64)), [1] * 64, [4096] * 64)
    parts = model.term_ms(decode.features())
    assert parts["moe"][0] == 58 and parts["decode_attn"][0] == 61
    assert model.step_ms(decode) == pytest.approx(sum(float(v[0]) for v in parts.values()))


def test_each_op_is_fitted_in_the_dtype_the_model_runs_it_in():
    # GEMMs in the weights' dtype, and in bf16 for the router and LM head vLLM leaves unquantised.
    assert dtypes_for(DSV3) == {"gemm": ("bfloat16", "fp8_block"), "moe": "fp8_block", "*": "bfloat16"}
    rows = _records(gemm={"num_tokens": [1.0, 1.0, 1.0], "m": [1, 1, 1], "n": [1, 1, 1], "k": [1, 1, 1]},
                    attn_decode={"num_tokens": [1.0, 1.0]})
    rows["dtype"] = ["fp8_block", "bfloat16", "fp8", "bfloat16", "fp8"]
    kept = select_records(rows, dtype=dtypes_for(DSV3))
    assert kept[["op", "dtype"]].values.tolist() == [["gemm", "fp8_block"], ["gemm", "bfloat16"],
                                                     ["attn_decode", "bfloat16"]]
    with pytest.raises(InputError, match="no rows; dtypes in the input"):
        select_records(rows, dtype=dtypes_for(PRESETS["tiny"]))



def test_tp_without_all_reduce_data_prices_a_ring_over_the_stated_link():
    """No measured all-reduce: --tp-link-gbps prices each as a ring (2 (tp - 1) hops of 1/tp of the
    message, each paying the latency); without it there is no all_reduce term."""
    from stepcal.costmodel.compose_comm import ring_all_reduce_s
    assert ring_all_reduce_s(4e6, 4, 16.0, 20.0) == pytest.approx(6 * 20e-6 + 6 / 4 * 4e6 / 16e9)
    targets = ("gemm", "attn_decode", "attn_prefill")
    linked, _ = terms_at(LLAMA, Parallelism(tp=4), Composition(tp_link_gbps=16.0, tp_latency_us=20.0), targets)
    message = AXES.num_tokens * LLAMA.hidden_size * 2          # bf16 hidden states
    expected_ms = 2 * 32 * ring_all_reduce_s(message, 4, 16.0, 20.0) * 1e3
    assert linked["all_reduce"].time_ms == pytest.approx(expected_ms)
    assert "all_reduce" not in terms_at(LLAMA, Parallelism(tp=4), targets=targets)[0]
    measured, _ = terms_at(LLAMA, Parallelism(tp=4), Composition(tp_link_gbps=16.0), (*targets, "all_reduce:x"))
    assert measured["all_reduce"].time_ms[0] == 2 * 32         # measured data win over the link
