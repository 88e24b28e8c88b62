"""`stepcal profile` and `stepcal profile merge`, including a SIGKILL in the middle of a sweep."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from stepcal.core.model_spec import PRESETS
from stepcal.experiments.cli import main
from stepcal.profiler.grid import load_grid

REPO_ROOT = Path(__file__).resolve().parents[2]
FAST = {"max_point_s": 0.02, "min_repeats": 3, "warmup": 1}


def write_grid(path: Path, source: dict) -> str:
    path.write_text(json.dumps(source))
    return str(path)


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "stepcal.experiments.cli", "profile", *args]


def test_sigkill_mid_sweep_then_rerun_has_every_point_once(tmp_path):
    # Slow points (timed to their cap) so that the kill lands mid-sweep, after a flush.
    grid = write_grid(tmp_path / "grid.json", {
        "timing": {"max_point_s": 0.12, "target_rel_precision": 0.0, "warmup": 1},
        "gemm": {"m": [1, 2, 3, 4, 5, 6, 7, 8], "names": ["o_proj", "down_proj", "qkv_proj"]}})
    out = tmp_path / "prof"
    args = cli("--model-spec", "tiny", "--grid", grid, "--ops", "gemm", "--out", str(out), "--no-progress")
    proc = subprocess.Popen(args, cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((out / "parts").glob("part-*.parquet")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    proc.stderr.close()
    keys = [p.key for p in load_grid(grid, PRESETS["tiny"]).points]
    saved = pd.concat([pd.read_parquet(p) for p in (out / "parts").glob("part-*.parquet")])
    assert 0 < len(saved) < len(keys)
    assert not (out / "profile.parquet").exists()

    rerun = subprocess.run(args, check=False, cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(keys) - len(saved)} measured now ({len(saved)} points done before)" in rerun.stderr
    frame = pd.read_parquet(out / "profile.parquet")
    assert list(frame["point_key"]) == keys                       # each point exactly once, in order
    assert (frame["status"] == "ok").all() and frame["time_ms"].notna().all()
    kept = frame.set_index("point_key").loc[list(saved["point_key"]), "measured_at"]
    assert list(kept) == list(saved["measured_at"])               # not measured again


def test_cli_profile_and_merge(tmp_path, capsys):
    grid = write_grid(tmp_path / "g.json", {"timing": FAST, "gemm": {"m": [1, 2, 4, 8]},
                                            "overhead": {"num_seqs": [1, 2], "s": [4]}})
    base = ["profile", "--model-spec", "tiny", "--grid", grid, "--no-progress"]
    for i in range(2):
        assert main(base + ["--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")]) == 0
    assert main(["profile", "merge", str(tmp_path / "s0"), str(tmp_path / "s1"),
                 "--out", str(tmp_path / "all")]) == 0
    frame = pd.read_parquet(tmp_path / "all" / "profile.parquet")
    assert len(frame) == 22 and frame["point_key"].is_unique
    assert "22 points from 2 directories" in capsys.readouterr().err


def test_cli_max_minutes_exit_status_3_then_resume(tmp_path, capsys):
    grid = write_grid(tmp_path / "g.json", {"timing": FAST, "gemm": {"m": [1, 2]}})
    args = ["profile", "--model-spec", "tiny", "--grid", grid, "--no-progress", "--out", str(tmp_path / "p")]
    assert main(args + ["--max-minutes", "1e-9"]) == 3
    assert "incomplete (run again to resume)" in capsys.readouterr().err
    assert main(args) == 0
    assert len(pd.read_parquet(tmp_path / "p" / "profile.parquet")) == 10


@pytest.mark.parametrize("args, message", [
    (["--grid", "quick", "--out", "x"], "--model-spec is required"),
    (["--model-spec", "tiny", "--grid", "quick"], "--out is required"),
    (["--model-spec", "tiny", "--out", "x", "--ops", "gemm,matmul"], "--ops: unknown"),
    (["--model-spec", "tiny", "--out", "x", "--shard", "2/2"], "--shard"),
    (["--model-spec", "tiny", "--out", "x", "--dtype", "fp8"], "--dtype"),
    (["--model-spec", "tiny", "--out", "x", "--grid", "nope.toml"], "--grid"),
    (["--model-spec", "huge", "--out", "x"], "--model-spec"),
    (["--model-spec", "tiny", "--out", "x", "--device", "tpu"], "--device"),
])
def test_cli_input_errors_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert main(["profile", *args]) == 2
    err = capsys.readouterr().err
    # "stepcal: ..." for input errors; "stepcal profile: argument ..." for flags refused when parsed
    assert err.startswith("stepcal") and err.count("\n") == 1 and message in err and "Traceback" not in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-CUDA message")
def test_cli_cuda_without_a_gpu_is_an_input_error(tmp_path, capsys):
    assert main(["profile", "--model-spec", "tiny", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_cli_bad_timing_in_a_grid_file(tmp_path, capsys):
    grid = write_grid(tmp_path / "g.json", {"timing": {"rounds": 0}, "gemm": {"m": [1]}})
    assert main(["profile", "--model-spec", "tiny", "--grid", grid, "--out", str(tmp_path / "p")]) == 2
    assert "[timing]: rounds must be an integer >= 1" in capsys.readouterr().err


def test_a_resume_mid_pass_counts_the_measurements_it_reused(tmp_path):
    from stepcal.experiments.profiling import describe_sweep
    from stepcal.profiler.sweep import SweepResult
    # 6 rounds over 20 points, stopped in its 5th pass after 96 measurements: no point is whole yet
    mid_pass = SweepResult(tmp_path, 20, 0, 24, 0, True, 1.0, rounds=6, num_reused=96)
    assert "24 measured now (0 points done before, 96 measurements reused)" in describe_sweep(mid_pass)
    whole = SweepResult(tmp_path, 20, 4, 96, 0, True, 1.0, rounds=6, num_reused=24)
    assert "(4 points done before)," in describe_sweep(whole)


def test_a_refused_directory_is_left_as_it_was(tmp_path, capsys):
    out = tmp_path / "prof"
    out.mkdir()
    (out / "meta.json").write_text('{"identity": [1]}')
    assert main(["profile", "--model-spec", "tiny", "--ops", "gemm", "--out", str(out)]) == 2
    assert "identity must be an object" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["meta.json"]        # no .lock, no parts/
