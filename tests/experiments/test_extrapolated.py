"""validate names the measured steps beyond the batches the tables' whole steps were fitted on."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from stepcal.costmodel.table_meta import TableMeta
from stepcal.experiments.cli import main
from stepcal.experiments.validation.extrapolated import beyond_fitted, describe_beyond
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel
from tests.costmodel.test_host_term import _fit, _profile


def test_steps_beyond_the_fitted_batches_are_counted_by_their_time():
    tables = SimpleNamespace(meta=TableMeta(fitted_range={"step": {"num_seqs": [1, 64], "num_tokens": [1, 512]}}))
    steps = pd.DataFrame({"num_seqs": [8, 64, 65, 200, 4], "num_tokens": [8, 64, 65, 200, 600],
                          "duration_ms": [1.0, 4.0, 5.0, 10.0, 20.0]})
    block = beyond_fitted(HostTermsModel(tables, HostTerms(per_step_ms=0.1)), steps)   # calibrated: the tables' range
    assert block["num_steps"] == 3 and block["share_of_steps"] == pytest.approx(0.6)
    assert block["share_of_time"] == pytest.approx(35 / 40)
    line = describe_beyond(block)
    assert "3 measured steps (87.5% of the measured step time)" in line and "64 seqs and 512 tokens" in line
    assert describe_beyond({**block, "num_steps": 0}) is None
    assert beyond_fitted(tables, steps) == block
    assert beyond_fitted(LinearStepModel(1.0, 0.1, 0.01), steps) is None        # no tables
    assert beyond_fitted(SimpleNamespace(meta=TableMeta(mode="step")), steps) is None   # tables fitted before the record


def test_fit_records_the_whole_steps_range_and_validate_names_the_steps_beyond_it(tmp_path, measured, capsys):
    tables, meta = _fit(tmp_path, _profile(tmp_path), ops="step,host")
    rows = pd.read_parquet(_profile(tmp_path))
    step_rows = rows[rows["op"] == "step"]
    assert meta["fitted_range"]["step"] == {"num_seqs": [1.0, float(step_rows["num_seqs"].max())],
                                            "num_tokens": [1.0, float(step_rows["num_tokens"].max())]}
    assert meta["fitted_range"]["host"]["num_seqs"][1] == 128.0
    # the same tables, as if their whole steps had held at most two sequences and 32 tokens: the run's
    # prompts of 33-80 tokens are beyond on any machine (its batches of three sequences come and go
    # with the machine's speed, on the virtual clock)
    narrow = tmp_path / "narrow"
    shutil.copytree(tables, narrow)
    meta["fitted_range"]["step"]["num_seqs"] = [1.0, 2.0]
    meta["fitted_range"]["step"]["num_tokens"] = [1.0, 32.0]
    (narrow / "meta.json").write_text(json.dumps(meta))
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(measured.path), "--step-model", str(narrow), "--quiet",
                 "--out", str(out)]) == 0
    record = json.loads((out / "validation.json").read_text())["beyond_fitted"]
    steps = measured.steps
    beyond = (steps["num_seqs"] > 2) | (steps["num_tokens"] > 32)
    assert record["num_steps"] == int(beyond.sum()) > 0
    assert record["share_of_time"] == pytest.approx(steps["duration_ms"][beyond].sum() / steps["duration_ms"].sum())
    assert f"warning: {int(beyond.sum())} measured steps" in (out / "validation.md").read_text()
    # within the fitted batches: recorded, and no warning
    assert main(["validate", "--measured", str(measured.path), "--step-model", str(tables), "--quiet",
                 "--out", str(tmp_path / "v2")]) == 0
    whole = json.loads((tmp_path / "v2" / "validation.json").read_text())["beyond_fitted"]
    assert whole["num_steps"] == int(((steps["num_seqs"] > 128) | (steps["num_tokens"] > 1024)).sum())
    assert np.isfinite(whole["share_of_time"])
