"""Profiling a mixture-of-experts model: routing distributions, the moe op, GEMM shapes, import."""
import json

import numpy as np
import pandas as pd
import pytest

from stepcal.core.errors import InputError
from stepcal.core.model_spec import PRESETS
from stepcal.costmodel.importers import load_profiles
from stepcal.experiments.cli import main
from stepcal.profiler.grid import expand_grid, load_grid, ops_for
from stepcal.profiler.op_context import OpContext
from stepcal.profiler.ops import build_kernel, estimate_bytes
from stepcal.profiler.routing import expert_loads, power_law_alpha, routed_expert_ids
from stepcal.profiler.sweep import SweepConfig, run_sweep

SPEC = PRESETS["tiny-moe"]
FAST = {"max_point_s": 0.02, "min_repeats": 3, "warmup": 1}
SMALL = {"timing": FAST, "gemm": {"m": [1, 16]},
         "moe": {"num_tokens": [1, 16, 64], "distributions": ["balanced", "power_law_1.01"]}}
MOE_RECORD = {"width": 256, "expert_ffn_size": 128, "num_experts": 8, "experts_per_token": 2, "tp": 1, "ep": 1}


@pytest.mark.parametrize("distribution", ["balanced", "power_law_1.01", "power_law_1.2", "power_law_1"])
@pytest.mark.parametrize("num_tokens, num_experts, top_k", [(1, 8, 2), (3, 8, 2), (100, 8, 2), (4096, 128, 8)])
def test_every_token_gets_top_k_distinct_experts(distribution, num_tokens, num_experts, top_k):
    loads = expert_loads(distribution, num_tokens, num_experts, top_k)
    assert loads.sum() == num_tokens * top_k and loads.max() <= num_tokens and loads.min() >= 0
    ids = routed_expert_ids(distribution, num_tokens, num_experts, top_k)
    assert ids.shape == (num_tokens, top_k)
    assert all(len(set(row)) == top_k for row in ids.tolist())
    np.testing.assert_array_equal(np.bincount(ids.ravel(), minlength=num_experts), loads)
    np.testing.assert_array_equal(ids, routed_expert_ids(distribution, num_tokens, num_experts, top_k))


def test_balanced_loads_are_equal_and_power_law_loads_skewed():
    assert expert_loads("balanced", 5, 8, 2).tolist() == [2, 2, 1, 1, 1, 1, 1, 1]
    assert set(expert_loads("balanced", 4096, 128, 8)) == {256}
    skewed = expert_loads("power_law_1.01", 4096, 128, 8)
    assert skewed.max() > 4 * 256 and np.median(skewed) < 256
    assert not np.array_equal(skewed, expert_loads("power_law_1.2", 4096, 128, 8))


@pytest.mark.parametrize("name", ["uniform", "power_law_", "power_law_x", "power_law_0", "power_law_-1", 3])
def test_unknown_distributions_are_input_errors(name):
    with pytest.raises(InputError, match="unknown distribution"):
        power_law_alpha(name)
    with pytest.raises(InputError, match=r"\[moe\]: unknown distribution"):
        expand_grid("g", {"moe": {"num_tokens": [1], "distributions": [name]}}, SPEC)


def test_quick_grid_of_a_moe_spec_has_moe_points_and_router_and_shared_gemms():
    grid = load_grid("quick", SPEC)
    moe = [p for p in grid.points if p.op == "moe"]
    assert {p.name for p in moe} == {"balanced", "power_law_1.01"} and len(moe) == 26
    assert moe[0].key.startswith("moe/balanced/m1/") and moe[0].num_tokens == 1 and moe[0].kv_tokens == 0
    gemms = {(p.name, p.n, p.k) for p in grid.points if p.op == "gemm" and p.m == 1}
    assert gemms == {(name, n, k) for name, (n, k) in SPEC.gemm_shapes().items()}
    assert {("router", 8, 256), ("shared_gate_up_proj", 256, 256), ("shared_down_proj", 256, 128)} <= gemms


def test_a_dense_spec_has_no_moe_op():
    tiny = PRESETS["tiny"]
    assert not [p for p in load_grid("quick", tiny).points if p.op == "moe"]
    with pytest.raises(InputError) as err:
        load_grid("quick", tiny).for_ops(("gemm", "moe"))
    assert str(err.value).startswith("--ops moe: model spec 'tiny' has no experts") and "\n" not in str(err.value)
    assert ops_for(tiny) == ("gemm", "attn_prefill", "attn_decode", "step", "overhead", "host", "elementwise", "serve")
    assert "moe" in ops_for(SPEC)


def test_moe_kernel_runs_and_its_memory_estimate_counts_every_expert():
    context = OpContext(SPEC, "cpu", "float32", seed=3)
    point = next(p for p in load_grid("quick", SPEC).points if p.op == "moe" and p.m == 64)
    kernel = build_kernel(point, context)
    kernel.run(0)
    kernel.run(1)
    assert not kernel.graph_safe                      # the host reads each expert's token count
    experts_bytes = 3 * 8 * 256 * 128 * 4
    assert estimate_bytes(point, context) >= experts_bytes + 64 * 2 * (256 + 3 * 128) * 4
    step = next(p for p in load_grid("quick", SPEC).points if p.op == "step")
    assert estimate_bytes(step, context) >= SPEC.num_params * 4       # every expert's weights


def sweep(out, source=SMALL, ops=("moe", "gemm")):
    grid = expand_grid("small", source, SPEC).for_ops(ops)
    return run_sweep(SweepConfig(spec=SPEC, device="cpu", dtype="float32", ops=ops, grid=grid), out,
                     progress=False)


def test_sweep_writes_both_distributions_resumes_and_imports_with_the_expert_shape(tmp_path):
    first = sweep(tmp_path)
    assert first.complete and first.num_failed == 0 and first.num_measured == 6 + 16
    frame = pd.read_parquet(tmp_path / "profile.parquet")
    moe = frame[frame["op"] == "moe"]
    assert sorted(moe["name"].unique()) == ["balanced", "power_law_1.01"]
    assert moe["num_tokens"].tolist() == [1, 16, 64, 1, 16, 64] and (moe["time_ms"] > 0).all()
    again = sweep(tmp_path)
    assert again.num_measured == 0 and again.num_done_before == 22
    records = load_profiles([tmp_path])
    imported = records[records["op"] == "moe"]
    assert len(imported) == 6 and set(imported["name"]) == {"balanced", "power_law_1.01"}
    for column, value in MOE_RECORD.items():
        assert (imported[column] == value).all(), column
    assert imported["num_tokens"].tolist() == [1, 16, 64, 1, 16, 64]
    assert {"router", "shared_gate_up_proj", "shared_down_proj"} <= set(records.loc[records["op"] == "gemm", "name"])
    assert records.loc[records["op"] == "gemm", "num_experts"].isna().all()


def test_moe_rows_carry_their_shape_and_rows_without_it_are_an_input_error(tmp_path):
    sweep(tmp_path / "p", source={"timing": FAST, "moe": {"num_tokens": [2]}}, ops=("moe",))
    alone = tmp_path / "copied.parquet"
    pd.read_parquet(tmp_path / "p" / "profile.parquet").to_parquet(alone)
    assert (load_profiles([alone])["num_experts"] == 8).all()      # the table carries the expert shape
    pd.read_parquet(alone).drop(columns=["width", "num_experts"]).to_parquet(alone)
    with pytest.raises(InputError, match="moe rows lack column\\(s\\) width, num_experts"):
        load_profiles([alone])


def test_cli_profile_moe_and_gemm_then_resume(tmp_path, capsys):
    grid = tmp_path / "g.json"
    grid.write_text(json.dumps(SMALL))
    args = ["profile", "--model-spec", "tiny-moe", "--ops", "moe,gemm", "--grid", str(grid), "--no-progress",
            "--out", str(tmp_path / "p")]
    assert main(args) == 0
    assert main(args) == 0
    assert "0 measured now (22 points done before)" in capsys.readouterr().err
    assert main(["profile", "--model-spec", "tiny", "--ops", "moe", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepcal: ") and "has no experts" in err and err.count("\n") == 1
