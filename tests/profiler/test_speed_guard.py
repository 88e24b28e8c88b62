"""The sweep's guard against slow stretches: engine points timed while the machine ran slow are
timed again at the end of the sweep, their slowed round dropped."""
import json
from types import SimpleNamespace

import pandas as pd

from stepcal.core.model_spec import PRESETS
from stepcal.profiler.grid import expand_grid
from stepcal.profiler.speed_guard import GUARD_STEPS, SpeedGuard
from stepcal.profiler.sweep import SweepConfig, run_sweep


class Clock:
    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def point(name: str, op: str = "step"):
    return SimpleNamespace(op=op, name=name, key=f"{op}/{name}")


def test_the_points_around_a_slow_probe_are_named_with_their_earlier_rows():
    probes = iter([1.1, 2.0, 1.2, 0.9])
    guard = SpeedGuard(lambda: next(probes), Clock(10.0), start_ms=1.0, every_s=15.0)
    got = [guard.after(point(f"p{i}"), {"i": i}) for i in range(8)]
    # probes after p1 (normal), p3 (slow: p2, p3), p5 (normal, but the stretch may have run on past
    # p3: p4, p5), p7 (normal: none)
    assert got == [[], [], [], [(point("p2"), {"i": 2}), (point("p3"), {"i": 3})],
                   [], [(point("p4"), {"i": 4}), (point("p5"), {"i": 5})], [], []]
    assert guard.probes_ms == [1.1, 2.0, 1.2, 0.9] and guard.reference_ms == 1.05   # median of the normal ones
    assert guard.after(point("g", "gemm"), None) == [] and guard.finish() == []   # kernels are not guarded
    assert guard.record(["step/p2"])["measured_again"] == ["step/p2"]


def test_the_end_is_checked_against_the_median_of_the_normal_probes():
    probes = iter([0.5, 1.6])
    guard = SpeedGuard(lambda: next(probes), Clock(20.0), start_ms=1.0)
    assert guard.after(point("a"), None) == [] and guard.reference_ms == 0.75   # probed: normal
    guard.every_s = 1000.0
    assert guard.after(point("b"), None) == [] and guard.after(point("c"), None) == []   # not probed
    assert guard.finish() == [(point("b"), None), (point("c"), None)]       # 1.6 > 1.5 x 0.75 at the end
    assert guard.finish() == []                                             # nothing left since


def guarded_sweep(tmp_path, monkeypatch, rounds: int):
    """A sweep of three whole steps and two GEMMs whose first guard probe finds the machine slow."""
    import stepcal.profiler.engine.measure as measure
    # start probe 1 ms; guard probes: slow after the first engine point, normal after the rest (the
    # second point, timed before the next probe, may have been in the stretch too)
    guard_probes = iter([3.0] + [1.0] * 50)
    monkeypatch.setattr(measure, "speed_probe_ms",
                        lambda model, num_steps=200, **kw: next(guard_probes) if num_steps == GUARD_STEPS else 1.0)
    timing = {"max_point_s": 0.02, "min_repeats": 3, "warmup": 1, "target_rel_precision": 0.05, "rounds": rounds}
    source = {"timing": timing, "gemm": {"m": [1, 16], "names": ["o_proj"]},
              "step": {"batches": [{"num_prefill": 1, "q": 8, "s": 4, "num_decode": d, "decode_s": 16} for d in (1, 2, 3)]}}
    ops = ("gemm", "step")
    grid = expand_grid("guard", source, PRESETS["tiny"]).for_ops(ops)
    config = SweepConfig(spec=PRESETS["tiny"], device="cpu", dtype="float32", ops=ops, grid=grid)
    return config, run_sweep(config, tmp_path, progress=False, clock=Clock(20.0))


def test_a_sweep_times_again_the_engine_points_of_a_slow_stretch(tmp_path, monkeypatch):
    config, result = guarded_sweep(tmp_path, monkeypatch, rounds=1)
    meta = json.loads((tmp_path / "meta.json").read_text())
    steps = [p.key for p in config.points() if p.op == "step"]
    (record,) = meta["speed_guard"]
    assert record["measured_again"] == steps[:2] and record["probes_ms"][0] == 3.0   # the slow probe's both sides
    frame = pd.read_parquet(tmp_path / "profile.parquet")
    assert result.complete and len(frame) == len(config.points())        # measured again, not added
    assert frame.set_index("point_key").loc[steps, "rounds"].tolist() == [1, 1, 1]   # the slowed round dropped


def test_the_guard_waits_for_the_machine_to_recover_for_a_while_at_most():
    probes, slept = iter([3.0, 3.0, 1.0]), []
    guard = SpeedGuard(lambda: next(probes), Clock(1.0), start_ms=1.0)
    assert guard.wait_recovered(slept.append) and slept == [3.0, 3.0]
    stuck = SpeedGuard(lambda: 3.0, Clock(10.0), start_ms=1.0)
    assert not stuck.wait_recovered(slept.append) and len(stuck.probes_ms) == 3   # 30 s at most
    budgeted = SpeedGuard(lambda: 3.0, Clock(10.0), start_ms=1.0)
    assert not budgeted.wait_recovered(slept.append, max_s=5.0) and len(budgeted.probes_ms) == 1   # the budget's 5 s


def test_a_point_measured_again_keeps_its_faster_round():
    from stepcal.profiler.sweep import _faster
    ok = {"status": "ok", "time_ms": 2.0}
    assert _faster(ok, {"status": "ok", "time_ms": 3.0}) and not _faster(ok, {"status": "ok", "time_ms": 1.0})
    assert _faster(ok, {"status": "failed"}) and not _faster({"status": "failed"}, ok)


def test_a_point_timed_in_a_later_round_is_not_timed_again(tmp_path, monkeypatch):
    config, result = guarded_sweep(tmp_path, monkeypatch, rounds=2)
    (record,) = json.loads((tmp_path / "meta.json").read_text())["speed_guard"]
    assert record["probes_ms"][0] == 3.0 and record["measured_again"] == []   # round 2 outvotes round 1
    frame = pd.read_parquet(tmp_path / "profile.parquet")
    assert result.complete and frame["rounds"].tolist() == [2] * len(config.points())   # no round dropped
