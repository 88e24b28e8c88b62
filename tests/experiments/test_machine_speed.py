"""validate compares the machine's speed during a run with its speed while the tables' profiles were taken."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from stepcal.costmodel.table_meta import TableMeta
from stepcal.experiments.campaign.headline import HeadlineRow, speed_line
from stepcal.experiments.cli import main
from stepcal.experiments.validation.machine_speed import describe_speed, profile_probes, speed_vs_profile
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel
from tests.costmodel.test_host_term import _fit, _profile


def test_the_runs_probe_against_the_profiles_says_how_much_slower_the_machine_ran():
    tables = SimpleNamespace(meta=TableMeta(profile_speed_probe_ms=[2.0, 2.2, 1.8, 2.0]))
    calibrated = HostTermsModel(tables, HostTerms(per_step_ms=0.1))
    assert profile_probes(calibrated) == profile_probes(tables) == [2.0, 2.2, 1.8, 2.0]
    assert profile_probes(LinearStepModel(1.0, 0.1, 0.01)) is None
    assert speed_vs_profile([2.1, 2.3], [2.0, 2.2, 1.8, 2.0]) == pytest.approx(0.10)
    assert speed_vs_profile([1.9], [2.0]) == pytest.approx(-0.05)
    assert speed_vs_profile([2.0], None) is None and speed_vs_profile(None, [2.0]) is None
    line = describe_speed([2.1, 2.3], [2.0, 2.2, 1.8, 2.0])
    assert "2.100 / 2.300 ms" in line and "2.000 ms (mean of 4 probes)" in line and "10.0% slower" in line
    assert line.startswith("warning: ") and line.endswith("before reading these errors as the model's")
    assert "10.0% faster" in describe_speed([1.8], [2.0]) and describe_speed([1.8], [2.0]).startswith("warning: ")
    assert not describe_speed([2.05], [2.0]).startswith("warning")   # 2.5%: within the targets' size
    assert "while the tables' profiles" not in describe_speed([1.9], None) and describe_speed(None, [2.0]) is None


def test_the_headline_gives_the_range_of_the_held_out_runs_drift():
    rows = [HeadlineRow("continuous", load, "profiled", True, None, None, None, None, None, None, {},
                        speed_vs_profile=drift) for load, drift in ((0.3, 0.02), (0.6, -0.04), (0.9, 0.08))]
    assert speed_line(rows) == ("machine speed during these runs against the profile (a fixed decode step; + is "
                                "slower): -4.0% to +8.0%, median +2.0%")
    assert speed_line([HeadlineRow("c", 0.3, "const", True, None, None, None, None, None, None, {})]) is None
    # with five runs or more, how closely the step model's total error follows the drift
    paired = [HeadlineRow("continuous", 0.3, "profiled", True, None, None, -drift / 2, None, None, None, {},
                          speed_vs_profile=drift) for drift in (0.02, -0.04, 0.08, 0.0, 0.05)]
    assert speed_line(paired).endswith("correlation with the step model's total error (predicted / measured - 1): "
                                       "r = -1.00 over 5 runs")
    assert "correlation" not in speed_line(paired[:4])
    assert HeadlineRow.from_dict(rows[1].to_dict()).speed_vs_profile == -0.04


def test_validate_writes_the_runs_speed_against_the_tables_profile(tmp_path, measured):
    tables, meta = _fit(tmp_path, _profile(tmp_path), ops="step,host")
    probed = tmp_path / "probed"
    shutil.copytree(tables, probed)
    meta["profile_speed_probe_ms"] = [1.0, 3.0]
    (probed / "meta.json").write_text(json.dumps(meta))
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(measured.path), "--step-model", str(probed), "--quiet",
                 "--out", str(out)]) == 0
    record = json.loads((out / "validation.json").read_text())
    run_probes = record["speed_probe_ms"]
    assert run_probes and record["profile_speed_probe_ms"] == [1.0, 3.0]
    assert record["speed_vs_profile"] == pytest.approx(sum(run_probes) / len(run_probes) / 2.0 - 1.0)
    assert "while the tables' profiles were taken: 2.000 ms (mean of 2 probes)" in (out / "validation.md").read_text()
