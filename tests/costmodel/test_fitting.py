import numpy as np
import pytest

from stepcal.core.errors import InputError
from stepcal.costmodel.evaluation import error_stats, extrapolation_split, group_ids, random_split
from stepcal.costmodel.fitting import FitConfig, fit_all, select_records
from stepcal.costmodel.importers import load_profiles
from tests.costmodel.conftest import PROFILES, make_step_log, require_shared


def test_error_stats_and_splits():
    stats = error_stats([1.0, 2.0, 4.0, 10.0], [1.1, 2.0, 3.0, 10.0])
    assert stats["mape"] == pytest.approx((10 + 0 + 25 + 0) / 4)
    assert stats["max_ape"] == pytest.approx(25.0) and stats["n"] == 4
    groups = np.repeat(np.arange(100), 3)
    test = random_split(groups, 0.2, seed=0)
    # all records of one source row fall on the same side
    assert (test.reshape(100, 3).all(axis=1) == test.reshape(100, 3).any(axis=1)).all()
    assert 0.1 < test.mean() < 0.3
    size = np.array([1, 2, 3, 4, 5, 6.0])
    np.testing.assert_array_equal(extrapolation_split(size), size > 3.5)
    assert extrapolation_split(np.ones(5)) is None
    # by value: mostly small rows (decodes) do not pull the cut down to them
    steps = np.array([1, 1, 1, 1, 1, 2, 8, 16.0])
    np.testing.assert_array_equal(extrapolation_split(steps), steps > 1)
    np.testing.assert_array_equal(extrapolation_split(steps, by_value=True), steps > 5)


def test_rf_fit_reports_held_out_errors_per_target_and_overall(profile_file):
    records = load_profiles([profile_file])
    result = fit_all(records, FitConfig(regressor="rf"))
    assert set(result.targets) == {"gemm", "attn_decode", "attn_prefill"}
    assert "overhead" in result.skipped    # seven rows: too few to hold any out
    gemm = result.targets["gemm"]
    assert set(gemm.errors) == {"random", "extrapolation"}
    assert gemm.errors["random"]["mape"] < 10
    rows = records[records["op"] == "gemm"]
    assert gemm.n_rows == len(rows) == 90            # 5 shapes x 18 M, the failed point left out
    # random: the seeded fifth of source rows; extrapolation: M above its median, 112 (9 of 18)
    assert gemm.errors["random"]["n"] == random_split(group_ids(rows), 0.2, seed=0).sum()
    assert gemm.errors["extrapolation"]["n"] == (rows["m"] > 112).sum() == 45
    # a forest cannot follow GEMM time past the profiled M
    assert gemm.errors["extrapolation"]["mape"] > 20
    assert result.errors["random"]["n"] == sum(
        f.errors["random"]["n"] for f in result.targets.values())


def test_tuned_fit_finds_a_model_that_extrapolates(profile_file, tmp_path):
    records = load_profiles([profile_file])
    records = records[records["op"] == "gemm"]
    journal = tmp_path / "optuna.log"
    result = fit_all(records, FitConfig(regressor="tuned", trials=4, storage=str(journal)))
    gemm = result.targets["gemm"]
    assert len(gemm.trials) == 4 and journal.exists()
    assert gemm.choice.family == "physics"
    assert gemm.errors["extrapolation"]["mape"] < 10


def test_whole_step_data_fits_the_additive_table_model(step_log_file, tmp_path):
    holdout = tmp_path / "holdout.parquet"
    make_step_log(80, seed=7).to_parquet(holdout, index=False)
    result = fit_all(load_profiles([step_log_file]), FitConfig(regressor="rf"),
                     holdout=load_profiles([holdout]))
    step = result.targets["step"]
    assert step.choice.family == "additive"
    assert step.errors["random"]["mape"] < 3
    assert step.errors["holdout"]["n"] == 80 and step.errors["holdout"]["mape"] < 3
    # whole steps are held out above the median of their distinct token counts, not of their rows
    tokens = load_profiles([step_log_file])["num_tokens"].to_numpy(dtype=float)
    assert step.errors["extrapolation"]["n"] == (tokens > np.median(np.unique(tokens))).sum()
    # every curve held rising but num_decode's (costmodel.features: a per-prompt cost needs it free)
    flags = dict(zip(step.feature_names, step.estimator.monotone))
    assert not flags.pop("num_decode") and all(flags.values())
    for name, values in zip(step.feature_names, step.estimator.values_):
        assert name == "num_decode" or np.all(np.diff(values) >= -1e-9)


def test_select_records_asks_for_a_device_and_tp():
    path = require_shared(PROFILES / "splitwise/perf_model_llama2-70b.csv")
    records = load_profiles([path])
    with pytest.raises(InputError, match="mixes devices.*--device"):
        select_records(records)
    h100 = select_records(records, device="h100")
    assert set(h100["device"]) == {"h100-80gb"} and set(h100["tp"]) == {2.0}
    with pytest.raises(InputError, match="--tp 3: no whole-step rows"):
        select_records(records, device="h100", tp=3)
    with pytest.raises(InputError, match="--device 'tpu'"):
        select_records(records, device="tpu")
