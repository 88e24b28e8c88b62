"""The engine's queue over time (a bench's timeseries.csv) against the replay's, in `stepcal validate`."""
import json

import numpy as np
import pandas as pd
import pytest

from stepcal.core.errors import InputError
from stepcal.experiments.cli import main
from stepcal.experiments.validation.timeseries import compare_timeseries, read_timeseries, simulated_series
from tests.experiments.test_import_llmservingsim import LINEAR, write_run

# Two steps: 0.0-0.5 s with 2 sequences, 1.0-1.2 s with 1; three requests arriving at 0, 0.2 and 0.9 s.
STEPS = pd.DataFrame({"start_s": [0.0, 1.0], "duration_ms": [500.0, 200.0], "num_seqs": [2, 1],
                      "kv_sum": [10, 30], "num_tokens": [22, 1]})
REQUESTS = pd.DataFrame({"arrival_s": [0.0, 0.2, 0.9], "finish_s": [0.4, 1.1, np.nan]})


def test_a_tick_reads_the_step_in_progress_and_the_queue():
    series = simulated_series(np.array([0.1, 0.3, 0.7, 1.05, 2.0]), STEPS, REQUESTS, kv_tokens=64.0)
    assert series["running"].tolist() == [2, 2, 0, 1, 0]          # between steps and after the last: none
    # waiting: received, not finished, not in the step in progress
    assert series["waiting"].tolist() == [0, 0, 1, 1, 1]
    assert series["kv_cache_pct"].tolist() == pytest.approx([100 * 32 / 64, 50.0, 0.0, 100 * 31 / 64, 0.0])
    assert simulated_series(np.array([0.1]), STEPS, REQUESTS, kv_tokens=None)["kv_cache_pct"].isna().all()


def test_series_the_run_did_not_record_are_said_so():
    measured = pd.DataFrame({"t": [1.0, 2.0], "running": [2.0, 4.0], "waiting": [0.0, 0.0], "kv_cache_pct": [5.0, 6.0]})
    simulated = pd.DataFrame({"t": [1.0, 2.0], "running": [3.0, 4.0], "waiting": [1.0, 0.0],
                              "kv_cache_pct": [np.nan, np.nan]})
    block = compare_timeseries(measured, simulated)
    assert block["series"]["running"] == {"measured_mean": 3.0, "simulated_mean": 3.5, "measured_peak": 4.0,
                                          "simulated_peak": 4.0, "mean_abs_diff": 0.5}
    assert block["not_recorded"] == ["waiting"] and block["not_simulated"] == ["kv_cache_pct"]


def test_validate_compares_an_imported_runs_timeseries(tmp_path):
    root = write_run(tmp_path / "run")
    out = tmp_path / "imported"
    assert main(["import", "llmservingsim", str(root), "--kv-blocks", "64", "--quiet", "--out", str(out)]) == 0
    assert main(["validate", "--measured", str(out), "--step-model", LINEAR, "--quiet",
                 "--out", str(tmp_path / "v")]) == 0
    block = json.loads((tmp_path / "v" / "validation.json").read_text())["timeseries"]
    assert block["ticks"] == 1 and set(block["series"]) == {"running", "kv_cache_pct"}
    table = pd.read_parquet(tmp_path / "v" / "timeseries.parquet")
    assert table["measured_running"].tolist() == [2.0] and len(table["simulated_running"]) == 1
    assert "engine queue over 1 ticks" in (tmp_path / "v" / "validation.md").read_text()


def test_a_broken_timeseries_is_one_line(tmp_path):
    path = tmp_path / "timeseries.csv"
    path.write_text("t,running,waiting,kv_cache_pct\n1.0,two,0,0\n")
    with pytest.raises(InputError, match=r"timeseries\.csv: line 2: t, running"):
        read_timeseries(path)
    path.write_text("t,running\n1.0,2\n")
    with pytest.raises(InputError, match="missing column"):
        read_timeseries(path)
