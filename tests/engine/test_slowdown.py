"""Repeats the machine slowed: found against the run's own steps, served again on request."""
import json

import numpy as np
import pandas as pd
import pytest

from stepcal.core.measured_run import SAME_PLACE
from stepcal.experiments.cli import main
from stepcal.profiler.engine import slowdown
from stepcal.profiler.engine.slowdown import SLOWED_ALONE_RATIO, SLOWED_RATIO, WINDOW_STEPS, slowest_windows


def _steps(seed: int, num_steps: int = 400, slow: tuple[int, int, float] | None = None) -> pd.DataFrame:
    """Steps whose time is linear in sequences and tokens with 5% scatter; `slow` = (first, last, factor)
    multiplies a stretch of them, as another process on the cores does."""
    rng = np.random.default_rng(seed)
    num_seqs = rng.integers(1, 16, num_steps)
    num_tokens = num_seqs + np.where(rng.random(num_steps) < 0.2, rng.integers(16, 512, num_steps), 0)
    ms = (1.0 + 0.2 * num_seqs + 0.01 * num_tokens) * rng.lognormal(0.0, 0.05, num_steps)
    if slow is not None:
        ms[slow[0]:slow[1]] *= slow[2]
    return pd.DataFrame({"start_s": np.cumsum(ms) / 1000.0 - ms[0] / 1000.0, "duration_ms": ms,
                         "num_seqs": num_seqs, "num_tokens": num_tokens})


def test_a_slowed_stretch_is_found_and_placed():
    logs = [_steps(0, slow=(150, 300, 1.5)), _steps(1)]
    slowed, clean = slowest_windows(logs)
    assert slowed.slowed and 1.35 < slowed.excess < 1.65 and 0.9 < slowed.others < 1.1
    starts = logs[0]["start_s"].to_numpy()
    assert starts[150] - 1e-9 <= slowed.start_s and slowed.end_s <= starts[299] + 1e-9
    assert not clean.slowed and clean.excess < 1.15
    assert "steps 1." in slowed.describe() and "x what the other repeats took from" in slowed.describe()


def test_a_stretch_slow_in_every_repeat_is_the_engine_not_the_machine():
    # decodes right after big prefills run slower in every repeat of a trace, at about the same moment
    logs = [_steps(0, slow=(150, 200, 1.5)), _steps(0, slow=(150, 200, 1.5))]
    logs[1]["start_s"] += 0.005          # the repeats do not keep time exactly
    assert all(not w.slowed and w.excess < 1.2 for w in slowest_windows(logs))
    logs[1]["duration_ms"] = _steps(0)["duration_ms"]     # the same stretch slow in one repeat only
    assert slowest_windows(logs)[0].slowed


def test_a_single_repeat_is_held_to_its_shapes_usual_time():
    (alone,) = slowest_windows([_steps(0, slow=(150, 300, 1.3))])
    assert alone.others is None and 1.2 < alone.ratio < 1.4 and not alone.slowed   # below SLOWED_ALONE_RATIO
    (alone,) = slowest_windows([_steps(0, slow=(150, 300, 1.6))])
    assert alone.slowed and alone.ratio > SLOWED_ALONE_RATIO
    assert alone.describe().startswith(f"steps {alone.ratio:.2f}x their usual time from")


def test_clean_repeats_and_big_steps_are_not_slowed():
    # a few steps far above the line (big prefills the line misprices) are not a stretch of steps
    logs = [_steps(k) for k in range(3)]
    logs[2].loc[::25, "duration_ms"] *= 3.0
    windows = slowest_windows(logs)
    assert all(not w.slowed and w.excess < SLOWED_RATIO for w in windows)


def test_a_log_shorter_than_a_window_has_none():
    assert slowest_windows([_steps(0, num_steps=WINDOW_STEPS - 1), _steps(1)])[0] is None


def test_the_repeat_most_slowed_beyond_the_others_is_served_again_first(monkeypatch):
    """Ordered by excess, the rule that judges a repeat slowed, not by ratio: repeat 0's stretch was slow
    in the other repeats too (the engine's share), repeat 1's in it alone."""
    from types import SimpleNamespace

    from stepcal.profiler.engine.measure import mark_slowest_windows
    windows = [slowdown.SlowestWindow(1.9, 0.0, 1.0, others=1.45),   # excess 1.31
               slowdown.SlowestWindow(1.6, 2.0, 3.0, others=1.0),    # excess 1.6
               slowdown.SlowestWindow(1.1, 0.0, 1.0, others=1.0)]    # not slowed
    monkeypatch.setattr("stepcal.profiler.engine.measure.slowest_windows", lambda logs: windows)
    results = [SimpleNamespace(steps=None, summary={}) for _ in windows]
    assert mark_slowest_windows(results) == [1, 0]
    assert [r.summary["slowest_window"]["ratio"] for r in results] == [1.9, 1.6, 1.1]


_TRACE = "poisson:rate=50,n=16,prompt=uniform:4:40,output=uniform:8:16"   # 40-odd steps: more than a window


def _slow_first_call(monkeypatch, repeat: int):
    """slowest_windows reports `repeat` slowed on its first call only (the engine's real runs are too short
    and too clean to be slowed on purpose)."""
    calls = []
    real = slowdown.slowest_windows
    # Only the injected window may be slowed: the real repeats' windows (judged against each other,
    # `others` set) are the shared machine's to vary, and a real slowed repeat 0 would be served too.
    monkeypatch.setattr(slowdown, "SLOWED_RATIO", float("inf"))

    def fake(logs):
        windows = real(logs)
        calls.append(len(logs))
        if len(calls) == 1:
            windows[repeat] = slowdown.SlowestWindow(1.6, 0.01, 0.02)
        return windows
    monkeypatch.setattr("stepcal.profiler.engine.measure.slowest_windows", fake)
    return calls


@pytest.mark.parametrize("retry", [0, 1])
def test_measure_serves_a_slowed_repeat_again_or_names_it(tmp_path, capsys, monkeypatch, retry):
    calls = _slow_first_call(monkeypatch, repeat=1)
    out = tmp_path / "m"
    assert main(["measure", "--model-spec", "tiny", "--trace", _TRACE, "--scheduler", "continuous",
                 "--repeats", "2", "--retry-slowed", str(retry), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "repeat 1: the machine slowed it (steps 1.60x their usual time from 0.01 to 0.02 s)" in err
    served = [line for line in err.splitlines() if line.startswith("repeat 1:")]
    if retry:
        assert "serving it again" in err and len(served) == 2 and len(calls) == 2
    else:
        assert "kept (--retry-slowed N" in err and len(served) == 1 and len(calls) == 1
    for k in (0, 1):
        window = json.loads((out / f"repeat_{k}" / "summary.json").read_text())["slowest_window"]
        assert set(window) == {"ratio", "start_s", "end_s", "others"}
    kept = json.loads((out / "repeat_1" / "summary.json").read_text())["slowest_window"]
    assert (kept["ratio"] == 1.6) == (retry == 0)


def test_measure_keeps_a_repeat_slowed_again_in_the_same_place(tmp_path, capsys, monkeypatch):
    """A slow stretch that comes back in the same place when served again is the engine's: served once, kept."""
    calls = []
    real = slowdown.slowest_windows
    monkeypatch.setattr(slowdown, "SLOWED_RATIO", float("inf"))   # the injected window alone: as in _slow_first_call

    def fake(logs):
        windows = real(logs)
        calls.append(len(logs))
        windows[1] = slowdown.SlowestWindow(1.6, 0.01, 0.02)
        return windows
    monkeypatch.setattr("stepcal.profiler.engine.measure.slowest_windows", fake)
    out = tmp_path / "m"
    assert main(["measure", "--model-spec", "tiny", "--trace", _TRACE, "--scheduler", "continuous",
                 "--repeats", "2", "--retry-slowed", "2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("warning: repeat 1:")]
    assert len(calls) == 2 and len(said) == 2   # served again once, then kept (not a second time)
    assert said[0].endswith("the machine slowed it (steps 1.60x their usual time from 0.01 to 0.02 s); serving it again")
    assert said[1] == ("warning: repeat 1: slow again in the same place when served again (steps 1.60x their usual "
                       "time from 0.01 to 0.02 s): kept, as the engine's own")
    flags = [json.loads((out / f"repeat_{k}" / "summary.json").read_text()).get(SAME_PLACE) for k in (0, 1)]
    assert flags == [None, True]


def test_serve_slowed_again_keeps_a_stretch_in_the_same_place_and_moves_on_to_the_next_repeat(monkeypatch):
    """Repeat 0, slow again in the same place, is kept and flagged; repeat 2, slowed less, is served next;
    the retries stop at their number."""
    from types import SimpleNamespace

    from stepcal.profiler.engine.measure import serve_slowed_again
    W = slowdown.SlowestWindow
    clean, early, late = W(1.0, 0.0, 0.1, 1.0), W(1.8, 1.0, 1.5, 1.0), W(1.5, 3.0, 3.5, 1.0)
    answers = [[early, clean, late], [early, clean, late], [early, clean, clean]]
    monkeypatch.setattr("stepcal.profiler.engine.measure.slowest_windows", lambda logs: answers.pop(0))
    results = [SimpleNamespace(steps=None, summary={}) for _ in range(3)]
    served = []
    slowed = serve_slowed_again(lambda: results, lambda k, window: served.append((k, window["start_s"])), retries=5)
    assert served == [(0, 1.0), (2, 3.0)] and answers == [] and slowed == [0]
    assert [r.summary.get(SAME_PLACE) for r in results] == [True, None, None]
    answers[:] = [[early, clean, clean], [late, clean, clean]]      # slowed elsewhere: the machine's, served again
    results = [SimpleNamespace(steps=None, summary={}) for _ in range(3)]
    served.clear()
    assert serve_slowed_again(lambda: results, lambda k, window: served.append(k), retries=1) == [0]
    assert served == [0] and results[0].summary.get(SAME_PLACE) is None
