"""Servings the machine slowed: a workload served in two profiles, one serving far slower step for
step over a stretch once the profiles' common drift is taken out, has that stretch left out of the fit
(as measured runs serve such a repeat again)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from stepcal.core.batch import batch_row
from stepcal.experiments.cli import main
from stepcal.experiments.fitting import without_slowed_servings
from stepcal.profiler.slowed_servings import (
    MIN_STEPS,
    SLOWED_RATIO,
    WINDOW_STEPS,
    describe,
    find_slowed,
    kept_times,
    served_steps,
)
from tests.costmodel.conftest import _row

WORKLOADS = [f"serve/continuous/c{c}/n{2 * c}/p16-1024/o4-128/m{c}/h{c}" for c in (1, 2, 4, 8, 16)]


def served(slow: dict | None = None, drift: float = 1.0, num_steps: int = 20, seed: int = 0,
           stretch: range | None = None) -> pd.DataFrame:
    """One profile's served rows (a step and a host row per step) of every workload: step i of
    workload c holds c decodes at KV 100 + i; `slow` multiplies a workload's times (only its steps in
    `stretch`, where given), `drift` all."""
    rng = np.random.default_rng(seed)
    rows = []
    for w, key in enumerate(WORKLOADS):
        c = 2 ** w
        for i in range(num_steps):
            q, kv = [1] * c, [100 + i] * c
            f = batch_row(q, kv)
            slowed = stretch is None or i in stretch
            factor = drift * ((slow or {}).get(key, 1.0) if slowed else 1.0) * float(np.exp(rng.normal(0, 0.03)))
            for op, ms in (("step", 1.0 + 0.05 * c + 0.001 * i), ("host", 0.2 + 0.01 * c)):
                row = _row(op, "served", ms * factor, q_lens=q, kv_lens=kv, **f)
                row["point_key"] = f"{key}/{i:05d}/{op}"
                rows.append(row)
    return pd.DataFrame(rows)


def test_a_slowed_serving_is_named_and_the_profiles_drift_is_not():
    """The late profile ran 1.3x slower as a whole (kept: the halves' average is the point) and one
    of its servings 1.5x slower again: that serving alone, with its step and host rows."""
    early, late = served(seed=0), served({WORKLOADS[2]: 1.5}, drift=1.3, seed=1)
    slowed = find_slowed({"early": early, "late": late})
    assert [(s.file, s.workload) for s in slowed] == [("late", WORKLOADS[2])]
    assert slowed[0].ratio == pytest.approx(1.5, rel=0.05)
    rows = late.loc[list(slowed[0].rows)]
    assert set(rows["op"]) == {"step", "host"} and len(rows) == 2 * 20
    assert rows["point_key"].str.startswith(WORKLOADS[2] + "/").all()
    assert "continuous/c4/n8/p16-1024/o4-128 in" in describe(slowed)


def test_the_slower_serving_is_the_one_left_out_whichever_profile_holds_it():
    slowed = find_slowed({"a": served({WORKLOADS[0]: 1.4}), "b": served(seed=1)})
    assert [(s.file, s.workload) for s in slowed] == [("a", WORKLOADS[0])]


def test_servings_within_the_threshold_and_single_profiles_are_kept():
    below = SLOWED_RATIO * 0.9
    assert find_slowed({"a": served(), "b": served({WORKLOADS[1]: below}, seed=1)}) == []
    assert find_slowed({"a": served({WORKLOADS[1]: 2.0})}) == []


def test_only_steps_of_the_same_batch_are_compared():
    """A serving whose batches differ (another seed, another engine) is not compared step for step:
    with fewer than MIN_STEPS steps in common, no decision."""
    early, late = served(), served({WORKLOADS[3]: 2.0}, seed=1)
    moved = late["point_key"].str.startswith(WORKLOADS[3] + "/")
    late.loc[moved, "kv_lens"] = pd.Series([[7] * 8] * int(moved.sum()), index=late.index[moved])
    assert find_slowed({"early": early, "late": late}) == []
    short = {"a": served(num_steps=MIN_STEPS - 1), "b": served({WORKLOADS[3]: 2.0}, num_steps=MIN_STEPS - 1)}
    assert find_slowed(short) == []


def test_a_profile_without_served_rows_has_none():
    frame = pd.DataFrame([_row("gemm", "qkv", 0.1, m=1, n=8, k=8)])
    assert served_steps(frame).empty
    assert find_slowed({"a": frame, "b": frame}) == []


def test_the_threshold_and_stretch_are_the_measured_runs_ones():
    from stepcal.profiler.engine import slowdown
    assert (SLOWED_RATIO, WINDOW_STEPS) == (slowdown.SLOWED_RATIO, slowdown.WINDOW_STEPS)


def test_a_slowed_stretch_of_a_long_serving_is_left_out_and_the_rest_kept():
    """Steps 60-99 of 160 slowed 1.5x: those steps, and at most half a stretch on either side (a
    stretch is slowed by its median), not the serving's other steps."""
    stretch = range(60, 100)
    early, late = served(num_steps=160), served({WORKLOADS[2]: 1.5}, num_steps=160, seed=1, stretch=stretch)
    [slowed] = find_slowed({"early": early, "late": late})
    assert (slowed.file, slowed.workload, slowed.of_steps) == ("late", WORKLOADS[2], 160)
    assert slowed.ratio == pytest.approx(1.5, rel=0.05)
    steps = late.loc[list(slowed.rows), "point_key"].str.split("/").str[-2].astype(int)
    assert set(stretch) <= set(steps) <= set(range(60 - WINDOW_STEPS // 2, 100 + WINDOW_STEPS // 2))
    assert slowed.num_steps == steps.nunique() and len(slowed.rows) == 2 * slowed.num_steps
    assert "(1.5" in describe([slowed]) and f"{slowed.num_steps} of 160 steps" in describe([slowed])


def test_a_slow_spike_shorter_than_half_a_stretch_is_kept():
    """A few slow steps are the step-to-step scatter a stretch's median is there to ignore."""
    spike = range(70, 70 + WINDOW_STEPS // 2 - 4)
    early, late = served(num_steps=160), served({WORKLOADS[3]: 2.0}, num_steps=160, seed=1, stretch=spike)
    assert find_slowed({"early": early, "late": late}) == []


def _write(tmp_path, name, frame):
    (tmp_path / name).mkdir()
    path = tmp_path / name / "profile.parquet"
    frame.to_parquet(path, index=False)
    return path


def test_fit_leaves_the_slowed_serving_out_and_says_so(tmp_path, capsys):
    early = _write(tmp_path, "profile", served())
    late = _write(tmp_path, "profile_late", served({WORKLOADS[4]: 1.6}, drift=0.9, seed=1))
    from stepcal.costmodel.importers import load_profiles
    records = load_profiles([str(early), str(late)])
    kept, slowed = without_slowed_servings(records)
    assert [s.workload for s in slowed] == [WORKLOADS[4]]
    assert len(records) - len(kept) == 2 * 20
    assert without_slowed_servings(load_profiles([str(early)]))[1] == []

    out = tmp_path / "tables"
    assert main(["fit", "--model-spec", "tiny", "--regressor", "rf", "--trials", "1", "--no-mlflow",
                 "--ops", "step,host", "--out", str(out), "--profile", str(early), str(late)]) == 0
    assert "left out 20 served steps the machine slowed, in 1 serving(s)" in capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["slowed_servings"] == [{"file": str(late), "workload": WORKLOADS[4], "round": 0, "num_rounds": 1,
                                        "ratio": pytest.approx(1.6, rel=0.06), "num_rows": 40, "num_steps": 20,
                                        "of_steps": 20}]


def two_passes(slow_second: dict, drift_second: float = 1.0) -> pd.DataFrame:
    """One profile that served every workload twice (a grid's [serve] rounds = 2): each served row
    holds both passes' samples, in order, and their median as time_ms."""
    first, second = served(seed=0), served(slow_second, drift=drift_second, seed=1)
    frame = first.copy()
    frame["samples_ms"] = [[a, b] for a, b in zip(first["time_ms"], second["time_ms"])]
    frame["time_ms"] = [float(np.median(v)) for v in frame["samples_ms"]]
    return frame


def test_a_slowed_pass_of_one_profile_is_named_and_its_rows_keep_the_other_pass():
    frame = two_passes({WORKLOADS[1]: 1.5}, drift_second=1.2)
    slowed = find_slowed({"p": frame})
    assert [(s.file, s.workload, s.round, s.num_rounds) for s in slowed] == [("p", WORKLOADS[1], 1, 2)]
    assert "in p, pass 2 of 2 (1.5" in describe([replace(s, file="/x/p/profile.parquet") for s in slowed])
    times = kept_times({"p": frame}, slowed)["p"]
    rows = frame[frame["point_key"].str.startswith(WORKLOADS[1] + "/")]
    assert sorted(times) == sorted(rows.index)                       # every row of that workload, no other
    assert [times[i] for i in rows.index] == [v[0] for v in rows["samples_ms"]]   # the first pass's time


def test_fit_prices_a_slowed_pass_by_the_other_pass_and_keeps_its_rows(tmp_path):
    from stepcal.costmodel.importers import load_profiles
    frame = two_passes({WORKLOADS[3]: 1.7})
    path = _write(tmp_path, "profile", frame)
    records = load_profiles([str(path)])
    kept, slowed = without_slowed_servings(records)
    assert [(s.workload, s.round) for s in slowed] == [(WORKLOADS[3], 1)]
    assert len(kept) == len(records)
    mine = frame["point_key"].str.startswith(WORKLOADS[3] + "/").to_numpy()
    by_row = kept.set_index("row")["time_ms"]
    np.testing.assert_allclose(by_row[np.flatnonzero(mine)], [v[0] for v in frame.loc[mine, "samples_ms"]])
    np.testing.assert_allclose(by_row[np.flatnonzero(~mine)], frame.loc[~mine, "time_ms"])
