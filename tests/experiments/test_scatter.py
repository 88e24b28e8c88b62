"""The device's run-to-run spread (run_cv) pooled over every pair of repeats at hand."""
import json

import numpy as np
import pytest

from stepcal.experiments.cli import main
from stepcal.experiments.validation.measured import load_measured_run
from stepcal.experiments.validation.scatter import pooled_run_cv, speed_log_ratios


def test_one_pair_gives_the_single_pair_formula_and_pairs_pool_their_squares():
    r = 0.2
    assert pooled_run_cv([r]) == pytest.approx(np.sqrt(np.expm1(r ** 2 / 2)))
    assert pooled_run_cv([r, -r]) == pooled_run_cv([r])                 # the sign of a pair says nothing
    assert pooled_run_cv([0.3, 0.1]) == pytest.approx(np.sqrt(np.expm1((0.09 + 0.01) / 4)))
    assert pooled_run_cv([0.0, 0.0]) == 0.0
    with pytest.raises(ValueError):
        pooled_run_cv([])


def test_pooling_many_pairs_recovers_the_speed_spread_that_one_pair_misses():
    """Runs whose log speed is normal with sigma 0.1: the log ratio of a pair has sigma 0.1 * sqrt(2).
    Pooled over 4,000 pairs the estimate is within 5%; single pairs scatter over a factor of ten."""
    rng = np.random.default_rng(7)
    sigma_run = 0.1
    ratios = rng.normal(0.0, sigma_run * np.sqrt(2.0), 4000)
    truth = np.sqrt(np.expm1(sigma_run ** 2))
    assert pooled_run_cv(ratios) == pytest.approx(truth, rel=0.05)
    singles = np.array([pooled_run_cv([r]) for r in ratios[:200]])
    assert np.quantile(singles, 0.9) / np.quantile(singles, 0.1) > 10


@pytest.fixture
def runs(paired_runs):
    """Two runs of two repeats, one of a single repeat and one of four (tests/experiments/conftest.py)."""
    return paired_runs


def test_calibrate_pools_run_cv_over_the_scatter_runs(runs, tmp_path):
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(runs["a"]), "--step-model", "const:1", "--max-simulations", "20",
                 "--scatter-runs", str(runs["b"]), "--quiet", "--out", str(out)]) == 0
    scatter = json.loads((out / "meta.json").read_text())["scatter"]
    ratios = [r for k in ("a", "b") for r in speed_log_ratios(load_measured_run(runs[k]))]
    assert scatter["run_cv"] == pytest.approx(pooled_run_cv(ratios))
    assert scatter["run_cv_pairs"] == 2 and scatter["run_cv_runs"] == [str(runs["a"]), str(runs["b"])]
    alone = tmp_path / "alone"
    assert main(["calibrate", "--measured", str(runs["a"]), "--step-model", "const:1", "--max-simulations", "20",
                 "--quiet", "--out", str(alone)]) == 0
    own = json.loads((alone / "meta.json").read_text())["scatter"]
    assert own["run_cv"] == pytest.approx(pooled_run_cv(ratios[:1])) and own["run_cv_pairs"] == 1
    assert (own["cv"], own["rho"]) == (scatter["cv"], scatter["rho"])   # the step scatter: the run's own


def test_calibrate_sizes_its_standard_errors_on_the_run_s_step_scatter(runs, tmp_path, capsys):
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(runs["a"]), "--step-model", "const:1", "--max-simulations", "20",
                 "--out", str(out)]) == 0
    uncertainty = json.loads((out / "meta.json").read_text())["calibration"]["uncertainty"]
    assert uncertainty["noise"] == "scatter" and uncertainty["misfit_ratio"] >= 1.0
    assert "standard errors from the device's step scatter" in capsys.readouterr().out


def test_a_history_runs_pairs_are_loaded_once_until_its_step_logs_change(runs, tmp_path, monkeypatch):
    """A quickstart calibrates four models on the same --scatter-runs: each run is read once."""
    import os
    import shutil

    import stepcal.experiments.validation.measured as measured
    from stepcal.experiments.validation.scatter import run_pairs
    run = tmp_path / "b"
    shutil.copytree(runs["b"], run)
    loads = []
    real = measured.load_measured_run
    monkeypatch.setattr("stepcal.experiments.validation.scatter.load_measured_run", lambda path: loads.append(path) or real(path))
    first = run_pairs(run)
    assert run_pairs(run) is first and len(loads) == 1
    assert first.ratios == tuple(speed_log_ratios(real(run))) and first.meta == real(run).meta and first.meta.fingerprint
    steps = run / "repeat_1" / "steps.parquet"
    stamp = steps.stat().st_mtime_ns
    os.utime(steps, ns=(stamp + 10**9, stamp + 10**9))    # rewritten: read again
    assert run_pairs(run) is not first and len(loads) == 2


@pytest.mark.parametrize("measured, extra, named", [
    ("a", "single", "--scatter-runs {single}: needs a measured run of two or more repeats"),
    ("single", "a", "--scatter-runs needs --measured of two or more repeats ({single} has one)"),
])
def test_scatter_runs_without_a_second_repeat_are_refused_naming_the_run(runs, tmp_path, capsys, measured, extra, named):
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(runs[measured]), "--step-model", "const:1",
                 "--scatter-runs", str(runs[extra]), "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert named.format(single=runs["single"]) in err and "Traceback" not in err
    assert not out.exists()


def test_four_repeats_are_two_pairs_and_each_joins_run_cv(runs, tmp_path):
    """Repeats 0 with 1 and 2 with 3: independent pairs (a third pairing, 1 with 2, would share a
    repeat with both), each the log ratio of the total time of the batches both ran."""
    from stepcal.experiments.validation.steps import matched_steps
    run = load_measured_run(runs["four"])
    ratios = speed_log_ratios(run)
    expected = []
    for first in (0, 2):
        both = matched_steps(run, first, first + 1)
        expected.append(float(np.log(both["ms_1"].sum() / both["ms_0"].sum())))
    assert ratios == pytest.approx(expected) and len(ratios) == 2
    assert speed_log_ratios(load_measured_run(runs["single"])) == []
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(runs["four"]), "--step-model", "const:1", "--max-simulations", "20",
                 "--scatter-runs", str(runs["a"]), "--quiet", "--out", str(out)]) == 0
    scatter = json.loads((out / "meta.json").read_text())["scatter"]
    assert scatter["run_cv_pairs"] == 3
    assert scatter["run_cv_log_ratios"] == pytest.approx([*ratios, *speed_log_ratios(load_measured_run(runs["a"]))])


def write_profile(path, points):
    import pandas as pd
    pd.DataFrame([{"point_key": key, "op": op, "time_ms": ms, "status": status}
                  for key, op, ms, status in points]).to_parquet(path)
    return path


def test_a_profile_in_two_halves_is_one_more_pair_from_its_whole_steps(tmp_path):
    from stepcal.experiments.validation.scatter import profile_log_ratio
    early = write_profile(tmp_path / "early.parquet", [("s1", "step", 2.0, "ok"), ("s2", "step", 4.0, "ok"),
                                                       ("g1", "gemm", 1.0, "ok"), ("x", "step", 1.0, "ok")])
    late = write_profile(tmp_path / "late.parquet", [("s1", "step", 2.2, "ok"), ("s2", "step", 4.4, "ok"),
                                                     ("g1", "gemm", 2.0, "ok"), ("x", "step", 9.0, "failed")])
    assert profile_log_ratio(early, late) == pytest.approx(np.log(1.1))    # the steps both timed; not the GEMM
    kernels = write_profile(tmp_path / "k.parquet", [("g1", "gemm", 1.5, "ok"), ("a1", "attn_decode", 1.0, "ok")])
    kernels_late = write_profile(tmp_path / "kl.parquet", [("g1", "gemm", 3.0, "ok"), ("a1", "attn_decode", 1.0, "ok")])
    assert profile_log_ratio(kernels, kernels_late) == pytest.approx(np.log(2.0) / 2)   # no steps: every point
    from stepcal.core.errors import InputError
    with pytest.raises(InputError, match="no point timed in both"):
        profile_log_ratio(early, write_profile(tmp_path / "other.parquet", [("z", "step", 1.0, "ok")]))


def test_a_profile_directory_stands_for_its_profile_table(tmp_path):
    from stepcal.core.errors import InputError
    from stepcal.experiments.validation.scatter import profile_log_ratio
    for name, ms in (("early", 2.0), ("late", 3.0)):
        (tmp_path / name).mkdir()
        write_profile(tmp_path / name / "profile.parquet", [("s1", "step", ms, "ok")])
    assert profile_log_ratio(tmp_path / "early", tmp_path / "late") == pytest.approx(np.log(1.5))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"empty: is a directory \(expected --scatter-profiles\)"):
        profile_log_ratio(tmp_path / "empty", tmp_path / "late")


def test_calibrate_pools_the_profile_pair_into_run_cv(runs, tmp_path):
    early = write_profile(tmp_path / "early.parquet", [("s1", "step", 2.0, "ok")])
    late = write_profile(tmp_path / "late.parquet", [("s1", "step", 2.5, "ok")])
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(runs["a"]), "--step-model", "const:1", "--max-simulations", "20",
                 "--scatter-profiles", str(early), str(late), "--quiet", "--out", str(out)]) == 0
    scatter = json.loads((out / "meta.json").read_text())["scatter"]
    ratios = [*speed_log_ratios(load_measured_run(runs["a"])), float(np.log(1.25))]
    assert scatter["run_cv_log_ratios"] == pytest.approx(ratios)
    assert scatter["run_cv"] == pytest.approx(pooled_run_cv(ratios)) and scatter["run_cv_pairs"] == 2
    assert "1 pair(s) of profiles (--scatter-profiles)" in scatter["source"]


def copy_run(source, target, **fingerprint):
    """A copy of a measured run whose meta.json fingerprint has `fingerprint`'s fields changed."""
    import shutil
    shutil.copytree(source, target)
    meta = json.loads((target / "meta.json").read_text())
    meta["fingerprint"].update(fingerprint)
    (target / "meta.json").write_text(json.dumps(meta))
    return target


def test_a_directory_of_runs_stands_for_each_of_two_or_more_repeats_once(runs, tmp_path):
    """An earlier campaign's directory: its runs of two repeats join run_cv, its single-repeat runs
    (saturation) and its hidden staging are left out, and the calibrated run's own pair counts once."""
    from stepcal.experiments.validation.scatter import scatter_run_dirs
    campaign = runs["a"].parent     # a, b (two repeats), four (four) and single (one)
    copy_run(runs["b"], campaign / ".staging" / "b")
    assert scatter_run_dirs([campaign]) == [runs["a"], runs["b"], runs["four"]]
    assert scatter_run_dirs([campaign, runs["b"]], own=runs["a"]) == [runs["b"], runs["four"]]
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(runs["a"]), "--step-model", "const:1", "--max-simulations", "20",
                 "--scatter-runs", str(campaign), "--quiet", "--out", str(out)]) == 0
    scatter = json.loads((out / "meta.json").read_text())["scatter"]
    ratios = [r for k in ("a", "b", "four") for r in speed_log_ratios(load_measured_run(runs[k]))]
    assert scatter["run_cv"] == pytest.approx(pooled_run_cv(ratios)) and scatter["run_cv_pairs"] == 4
    assert scatter["run_cv_runs"] == [str(runs["a"]), str(runs["b"]), str(runs["four"])]


def test_a_directory_without_runs_of_two_repeats_is_refused_in_one_line(runs, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    copy_run(runs["single"], tmp_path / "singles" / "s")
    for where in ("empty", "singles"):
        out = tmp_path / f"cal_{where}"
        assert main(["calibrate", "--measured", str(runs["a"]), "--step-model", "const:1",
                     "--scatter-runs", str(tmp_path / where), "--quiet", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--scatter-runs {tmp_path / where}: no measured run of two or more repeats under it" in err
        assert err.count("\n") == 1 and not out.exists()


def test_runs_of_another_device_are_refused_naming_the_field(runs, tmp_path, capsys):
    other = copy_run(runs["b"], tmp_path / "elsewhere", cpu_model="Another CPU")
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(runs["a"]), "--step-model", "const:1",
                 "--scatter-runs", str(other), "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--scatter-runs {other}: measured on another device (cpu_model 'Another CPU'" in err
    assert err.count("\n") == 1 and not out.exists()
    # the same machine under another hostname and torch build is the same device
    renamed = copy_run(runs["b"], tmp_path / "renamed", hostname="other-vm", torch_version="9.9")
    assert main(["calibrate", "--measured", str(runs["a"]), "--step-model", "const:1", "--max-simulations", "20",
                 "--scatter-runs", str(renamed), "--quiet", "--out", str(tmp_path / "ok")]) == 0


@pytest.mark.parametrize("make, message", [
    (lambda runs, tmp: tmp / "nothing_here", "--scatter-runs {path}: no measured run of two or more repeats"),
    (lambda runs, tmp: runs["single"], "--scatter-runs {path}: needs a measured run of two or more repeats"),
    (lambda runs, tmp: copy_run(runs["b"], tmp / "gpu_run", device="cuda:0", gpu_name="NVIDIA H100"),
     "--scatter-runs {path}: measured on another device (device 'cuda:0', not 'cpu')"),
])
def test_quickstart_refuses_bad_scatter_runs_before_any_work(runs, tmp_path, capsys, make, message):
    path = make(runs, tmp_path)
    if path.name == "nothing_here":
        path.mkdir()
    out = tmp_path / "qs"
    assert main(["quickstart", "--scatter-runs", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message.format(path=path) in err and err.count("\n") == 1 and not out.exists()


def fit_args(profile, out, *extra):
    return ["fit", "--profile", *map(str, profile), "--regressor", "rf", "--no-mlflow", *extra, "--out", str(out)]


def test_fit_pools_run_cv_over_its_step_logs_and_the_scatter_runs(runs, tmp_path):
    """The step logs among the inputs give cv and rho; their pairs and those of --scatter-runs give run_cv."""
    logs = [runs["a"] / f"repeat_{k}" / "steps.parquet" for k in (0, 1)]
    assert main(fit_args(logs, tmp_path / "t", "--scatter-runs", str(runs["b"]), str(runs["four"]))) == 0
    scatter = json.loads((tmp_path / "t" / "meta.json").read_text())["scatter"]
    own = json.loads((runs["a"] / "meta.json").read_text())   # the run whose logs were fitted
    ratios = [r for k in ("a", "b", "four") for r in speed_log_ratios(load_measured_run(runs[k]))]
    assert scatter["run_cv"] == pytest.approx(pooled_run_cv(ratios)) and scatter["run_cv_pairs"] == 4
    assert scatter["runs"] == [str(runs["a"])] and own["kind"] == "measured_run"
    assert scatter["run_cv_runs"] == [str(runs["a"]), str(runs["b"]), str(runs["four"])]
    assert main(fit_args(logs, tmp_path / "alone")) == 0
    alone = json.loads((tmp_path / "alone" / "meta.json").read_text())["scatter"]
    assert (alone["cv"], alone["rho"]) == (scatter["cv"], scatter["rho"]) and alone["run_cv_pairs"] == 1


def test_fit_without_paired_logs_takes_the_whole_scatter_from_the_scatter_runs(runs, tmp_path):
    single = [runs["single"] / "repeat_0" / "steps.parquet"]     # one repeat: no pair, no scatter of its own
    assert main(fit_args(single, tmp_path / "none")) == 0
    assert "scatter" not in json.loads((tmp_path / "none" / "meta.json").read_text())
    assert main(fit_args(single, tmp_path / "t", "--scatter-runs", str(runs["a"]), str(runs["b"]))) == 0
    scatter = json.loads((tmp_path / "t" / "meta.json").read_text())["scatter"]
    from stepcal.experiments.validation.scatter import measured_scatter
    each = [measured_scatter(load_measured_run(runs[k])) for k in ("a", "b")]
    assert scatter["cv"] == pytest.approx(np.median([s["cv"] for s in each]))
    assert scatter["run_cv"] == pytest.approx(pooled_run_cv([r for s in each for r in s["run_cv_log_ratios"]]))
    assert "of --scatter-runs" in scatter["source"]


def test_fit_refuses_scatter_runs_of_another_device_or_one_repeat(runs, tmp_path, capsys):
    logs = [runs["a"] / f"repeat_{k}" / "steps.parquet" for k in (0, 1)]
    other = copy_run(runs["b"], tmp_path / "elsewhere", cpu_model="Another CPU")
    for extra, message in ((other, f"--scatter-runs {other}: measured on another device (cpu_model 'Another CPU'"),
                           (runs["single"], f"--scatter-runs {runs['single']}: needs a measured run of two or more")):
        out = tmp_path / "t"
        assert main(fit_args(logs, out, "--scatter-runs", str(extra))) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and not out.exists()
