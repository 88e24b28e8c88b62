"""`stepcal profile plan`: the expected points and time of a campaign, from a replayed profile or
a datasheet's roofline, and its refusals."""
import json

import pytest

from stepcal.experiments.budget.roofline_time import COMPUTE_EFFICIENCY, LAUNCH_MS, MEMORY_EFFICIENCY, kernel_ms
from stepcal.experiments.cli import main
from tests.experiments.replay_profiles import write_gemm_profile

GRID = {"timing": {"min_repeats": 5, "max_point_s": 0.5, "rounds": 2}, "gemm": {"m": [1, 8, 64, 512, 4096]}}


def _plan_rows(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in text.splitlines()[2:]}


def test_plan_on_replay_predicts_the_replayed_sweep(tmp_path, capsys):
    source = write_gemm_profile(tmp_path / "measured.csv")
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps(GRID))
    common = ["--model-spec", "tiny", "--device", f"replay:{source}", "--ops", "gemm", "--grid", str(grid),
              "--dtype", "float32"]
    assert main(["profile", "plan", *common]) == 0
    gemm = _plan_rows(capsys.readouterr().out)["gemm"]
    points, grid_points, refused, measure_s, wall_s = int(gemm[0]), int(gemm[1]), int(gemm[2]), *map(float, gemm[3:5])
    assert (points, grid_points, refused) == (20, 25, 5)       # m = 4096 lies outside the profile
    assert main(["profile", *common, "--no-progress", "--out", str(tmp_path / "out")]) == 0
    replay = json.loads((tmp_path / "out" / "meta.json").read_text())["replay"]
    assert measure_s == pytest.approx(replay["measure_s"], rel=0.25)
    assert wall_s == pytest.approx(replay["wall_s"], rel=0.25)


def test_a_budget_buys_each_op_its_share_of_the_grid(tmp_path, capsys):
    args = ["profile", "plan", "--model-spec", "tiny", "--device", "h100_sxm", "--ops", "gemm,attn_decode"]
    assert main(args) == 0
    whole = _plan_rows(capsys.readouterr().out)
    budget = float(whole["total"][3]) / 2
    assert main([*args, "--budget-s", str(budget)]) == 0
    half = _plan_rows(capsys.readouterr().out)
    assert float(half["total"][3]) == pytest.approx(budget, rel=0.1)
    for op in ("gemm", "attn_decode"):
        assert int(half[op][0]) == pytest.approx(int(whole[op][0]) / 2, abs=1)


def test_the_roofline_is_the_slower_of_compute_and_memory():
    peak, bandwidth = 1e15, 3e12
    big = {"op": "gemm", "m": 8192, "n": 8192, "k": 8192}
    assert kernel_ms(big, "bfloat16", peak, bandwidth) == pytest.approx(
        LAUNCH_MS + 2 * 8192**3 / (peak * COMPUTE_EFFICIENCY) * 1e3)
    thin = {"op": "gemm", "m": 1, "n": 8192, "k": 8192}
    assert kernel_ms(thin, "bfloat16", peak, bandwidth) == pytest.approx(
        LAUNCH_MS + (8192 + 8192 * 8192 + 8192) * 2 / (bandwidth * MEMORY_EFFICIENCY) * 1e3)


@pytest.mark.parametrize("extra, message", [
    (["--device", "cpu"], "--device cpu: no datasheet entry"),
    (["--device", "h100_sxm", "--budget-s", "0"], "--budget-s: must be positive"),
    (["--device", "h100_sxm", "--budget-s", "-5"], "--budget-s: must be positive"),
])
def test_plans_that_cannot_be_made_are_one_line(extra, message, capsys):
    assert main(["profile", "plan", "--model-spec", "tiny", "--ops", "gemm", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
