"""The replay device: interpolation between measured shapes, refusal outside them, seeded scatter,
and `stepcal profile --device replay:PROFILE` writing an ordinary, resumable profile."""
import json

import numpy as np
import pandas as pd
import pytest

from stepcal.core.model_spec import PRESETS
from stepcal.experiments.cli import main
from stepcal.experiments.replay.device import ReplayDevice
from stepcal.experiments.replay.interpolate import INTERPOLATED, MEASURED, LogInterpolator
from stepcal.profiler.grid import load_grid
from stepcal.profiler.point import Point
from stepcal.profiler.sweep import shape_columns
from tests.experiments.replay_profiles import GEMM_M, gemm_ms, write_gemm_profile

GRID = {"timing": {"min_repeats": 5, "max_point_s": 0.5}, "gemm": {"m": [1, 8, 64, 512, 4096]}}


def test_one_axis_is_log_linear_between_neighbours_and_refused_outside():
    sizes = np.array([[1.0], [7.0], [63.0]])
    times = (1 + sizes[:, 0]) ** 0.5
    interp = LogInterpolator(sizes, times, np.full(3, 0.02))
    inside = interp.estimate([15.0])
    assert inside.kind == INTERPOLATED and inside.time_ms == pytest.approx(16 ** 0.5)
    assert interp.estimate([7.0]).kind == MEASURED
    assert interp.estimate([0.0]) is None and interp.estimate([64.0]) is None


def test_three_axes_follow_the_measured_simplex_and_stop_at_the_hull(tmp_path):
    device = ReplayDevice.load(str(write_gemm_profile(tmp_path / "p.csv")))
    found = device.estimate({"op": "gemm", "m": 100, "n": 512, "k": 400}, "float32")
    assert found.kind == INTERPOLATED
    assert found.time_ms == pytest.approx(gemm_ms(100, 512, 400), rel=1e-6)
    assert found.rel_scatter == pytest.approx(0.01, rel=1e-3)
    assert "outside the measured hull" in device.estimate({"op": "gemm", "m": 4096, "n": 512, "k": 400}, "float32")
    assert "outside the measured hull" in device.estimate({"op": "gemm", "m": 64, "n": 4096, "k": 400}, "float32")


def _profile(tmp_path, out, *extra) -> int:
    source = write_gemm_profile(tmp_path / "measured.csv")
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps(GRID))
    return main(["profile", "--model-spec", "tiny", "--device", f"replay:{source}", "--ops", "gemm",
                 "--grid", str(grid), "--dtype", "float32", "--no-progress", "--out", str(out), *extra])


def test_profile_on_replay_marks_interpolated_rows_and_refuses_the_hull(tmp_path):
    assert _profile(tmp_path, tmp_path / "a") == 0
    rows = pd.read_parquet(tmp_path / "a" / "profile.parquet")
    spec = PRESETS["tiny"]
    assert len(rows) == len(load_grid(str(tmp_path / "grid.json"), spec).for_ops(("gemm",)).points)
    refused = rows[rows["status"] == "failed"]
    assert set(refused["m"]) == {4096} and refused["error"].str.contains("outside the measured hull").all()
    ok = rows[rows["status"] == "ok"]
    measured = ok["m"].isin(GEMM_M) & ok["n"].isin([2048, 256]) & ok["k"].isin([256, 688])
    assert ok.loc[measured, "error"].isna().all()
    assert ok.loc[~measured, "error"].str.contains("interpolated").all()
    expected = [gemm_ms(m, n, k) for m, n, k in zip(ok["m"], ok["n"], ok["k"])]
    # medians of >= 5 log-normal draws at 1% scatter stay within a few percent of the time
    assert np.allclose(ok["time_ms"], expected, rtol=0.05)
    assert (ok["time_ms_p90"] > ok["time_ms_p10"]).all()
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["replay"]["measure_s"] > 0 and meta["status"] == "complete"


def test_replayed_draws_are_seeded_per_point_and_resume_measures_each_point_once(tmp_path, capsys):
    assert _profile(tmp_path, tmp_path / "a") == 0
    # --max-minutes counts the simulated clock: a budget this small stops after the first point
    assert _profile(tmp_path, tmp_path / "b", "--max-minutes", "1e-6") == 3
    assert _profile(tmp_path, tmp_path / "b") == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert "25 points, 1 replayed now" in lines[1] and "incomplete" in lines[1]
    assert "24 replayed now" in lines[2] and "1 done before" in lines[2]
    a = pd.read_parquet(tmp_path / "a" / "profile.parquet").set_index("point_key")
    b = pd.read_parquet(tmp_path / "b" / "profile.parquet").set_index("point_key")
    pd.testing.assert_series_equal(a["time_ms"], b["time_ms"])
    assert _profile(tmp_path, tmp_path / "c", "--seed", "1") == 0
    c = pd.read_parquet(tmp_path / "c" / "profile.parquet").set_index("point_key")
    assert not np.allclose(a["time_ms"].dropna(), c["time_ms"].dropna(), rtol=1e-9)


def test_a_replay_profile_without_the_op_is_one_line_and_writes_nothing(tmp_path, capsys):
    source = write_gemm_profile(tmp_path / "measured.csv")
    out = tmp_path / "out"
    code = main(["profile", "--model-spec", "tiny", "--device", f"replay:{source}", "--ops", "attn_decode",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no 'attn_decode' records" in err[0]
    assert not out.exists()


def test_aiconfigurator_h100_gemm_replays_its_measured_shape(shared_data):
    device = ReplayDevice.load(str(shared_data / "profiles" / "aiconfigurator" / "h100_sxm" / "gemm"))
    records = device.records[(device.records["op"] == "gemm") & (device.records["dtype"] == "bfloat16")]
    row = records.iloc[len(records) // 2]
    spec = PRESETS["llama-3-8b"]
    shape = shape_columns(Point("gemm", "x", int(row["m"]), int(row["n"]), int(row["k"])), spec)
    found = device.estimate(shape, "bfloat16")
    assert found.kind == MEASURED and found.time_ms == pytest.approx(row["time_ms"], rel=1e-9)
