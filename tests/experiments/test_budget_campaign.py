"""`stepcal profile --budget-s`: a budgeted adaptive campaign on the replay device; resumed after a
stop it measures no point twice and ends where the uninterrupted one does."""
import json
import re

import pandas as pd
import pytest

from stepcal.costmodel.importers import load_profiles
from stepcal.experiments.cli import main
from tests.experiments.replay_profiles import gemm_replay_campaign

M = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]


@pytest.fixture
def campaign(tmp_path):
    return gemm_replay_campaign(tmp_path, M)


def _full_grid_s(tmp_path, campaign) -> float:
    assert campaign("full") == 0
    return json.loads((tmp_path / "full" / "meta.json").read_text())["replay"]["measure_s"]


def _rows(path) -> pd.DataFrame:
    return pd.read_parquet(path / "profile.parquet").set_index("point_key").sort_index()


def test_a_budget_measures_part_of_the_grid_and_fit_reads_it(tmp_path, campaign, capsys):
    budget_s = 0.3 * _full_grid_s(tmp_path, campaign)
    assert campaign("adaptive", "--budget-s", f"{budget_s:.6f}") == 0
    rows = _rows(tmp_path / "adaptive")
    meta = json.loads((tmp_path / "adaptive" / "meta.json").read_text())
    assert 10 <= len(rows) < len(M) * 5
    # it stops once the budget is spent, or what is left of it affords no candidate
    assert 0.8 * budget_s <= meta["budget"]["spent_s"] <= 1.2 * budget_s
    records = load_profiles([tmp_path / "adaptive"])
    assert set(records["op"]) == {"gemm"} and len(records) == (rows["status"] == "ok").sum()
    # the first batch spans the grid: the smallest and largest m of the projections are in it
    first = json.loads((tmp_path / "adaptive" / "budget.json").read_text())["batches"][0]
    assert {int(rows.loc[k, "m"]) for k in first} >= {1, 1024}


def test_a_stopped_campaign_resumes_without_measuring_a_point_twice(tmp_path, campaign, capsys):
    budget_s = f"{0.3 * _full_grid_s(tmp_path, campaign):.6f}"
    assert campaign("whole", "--budget-s", budget_s) == 0
    assert campaign("again", "--budget-s", budget_s) == 0
    # stopped by --max-minutes (simulated time) inside the first batch, then run again
    assert campaign("resumed", "--budget-s", budget_s, "--max-minutes", "1e-6") == 3
    assert campaign("resumed", "--budget-s", budget_s) == 0
    now = [int(n) for n in re.findall(r"\((\d+) now\)", capsys.readouterr().err)]
    whole, again, resumed = (_rows(tmp_path / d) for d in ("whole", "again", "resumed"))
    assert now[-2] >= 1 and now[-2] + now[-1] == len(resumed)       # each point measured once
    pd.testing.assert_series_equal(whole["time_ms"], again["time_ms"])    # deterministic
    pd.testing.assert_series_equal(whole["time_ms"], resumed["time_ms"])  # and the same after a stop


@pytest.mark.parametrize("budget", ["0", "-1", "nan"])
def test_a_budget_that_is_not_positive_is_one_line_and_writes_nothing(tmp_path, campaign, capsys, budget):
    assert campaign("out", "--budget-s", budget) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--budget-s: must be positive" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_budget_on_the_cpu_times_real_kernels_until_it_is_spent(tmp_path, capsys):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"timing": {"max_point_s": 0.02, "min_repeats": 3, "warmup": 1},
                                "gemm": {"m": [1, 4, 16, 64, 256]}}))
    out = tmp_path / "cpu"
    assert main(["profile", "--model-spec", "tiny", "--device", "cpu", "--ops", "gemm", "--grid", str(grid),
                 "--budget-s", "0.05", "--no-progress", "--out", str(out)]) == 0
    rows = _rows(out)
    meta = json.loads((out / "meta.json").read_text())
    assert 1 <= len(rows) < 25 and (rows["device"] == "cpu").all() and rows["samples_ms"].notna().all()
    assert meta["status"] == "complete" and 0 < meta["budget"]["spent_s"]
