"""A sweep on the replay device: the grid's points answered from a measured profile into an
ordinary profile directory (profiler.store), resumable like a device sweep.

Each point's draws are seeded by the sweep's seed and the point's key, so a point replays the same
samples whatever order or run measures it. Time is simulated: each point charges the device time
its calls would have taken (profiler.simulated_timing) plus its setup, and --max-minutes counts
that clock. A point outside the profile's measured hull is a failed row that says so; an
interpolated one is an ok row whose `error` column marks it, so nothing made up passes unmarked.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from stepcal.core.schemas import SCHEMA_VERSION, TOOL_VERSION
from stepcal.experiments.replay.device import ReplayDevice, scatter_note
from stepcal.experiments.replay.interpolate import INTERPOLATED
from stepcal.profiler.point import Point, point_rng
from stepcal.profiler.simulated_timing import simulate_rounds
from stepcal.profiler.store import ProfileDir
from stepcal.profiler.sweep import SweepConfig, check_profile_meta, shape_columns, timing_columns, utc_now

FLUSH_POINTS = 64
INTERPOLATED_MARK = "replay: interpolated between measured shapes"


@dataclass(frozen=True)
class ReplayResult:
    out: Path
    num_points: int
    num_done_before: int
    num_measured: int            # this run
    num_interpolated: int        # this run, of num_measured
    num_failed: int              # in the directory (outside the hull, mostly)
    complete: bool
    measure_s: float             # simulated device time of this run's timed calls
    wall_s: float                # and with each point's setup


class ReplayMeasurer:
    """Measures one point on the replay device: its profile row and what it cost."""

    def __init__(self, config: SweepConfig, device: ReplayDevice) -> None:
        self.config, self.device = config, device
        self.policy = config.policy
        self.provenance = {"device": config.device, "device_name": f"{device.device_name} (replay)",
                           "dtype": config.dtype, "model_spec": config.spec.name, "num_threads": 1,
                           "torch_version": None, "tool_version": TOOL_VERSION,
                           "schema_version": SCHEMA_VERSION, "fingerprint_id": "replay"}

    def measure(self, point: Point, rounds: int = 1) -> tuple[dict, float, float]:
        """(row, measure_s, wall_s) of one point, timed in `rounds` passes as the sweep times it."""
        row = {**shape_columns(point, self.config.spec), **self.provenance, "measured_at": utc_now()}
        found = self.device.estimate(row, self.config.dtype)
        if isinstance(found, str):
            return {**row, "status": "failed", "error": found}, 0.0, 0.0
        rng = point_rng("replay", self.config.seed, point.key)
        sim = simulate_rounds(found.time_ms, found.rel_scatter, self.policy, rounds, rng)
        mark = INTERPOLATED_MARK if found.kind == INTERPOLATED else None
        row = {**row, **timing_columns(sim.measurement), "rounds": rounds, "status": "ok", "error": mark}
        return row, sim.measure_s, sim.wall_s


def run_replay_sweep(config: SweepConfig, out: str | Path, device: ReplayDevice, *,
                     max_minutes: float | None = None, retry_failed: bool = False) -> ReplayResult:
    """Replay the grid's missing points into `out` (see the module's docstring)."""
    points = config.points()
    rounds = config.policy.rounds
    pdir = ProfileDir(Path(out))
    check_profile_meta(pdir, config)
    with pdir:
        meta = check_profile_meta(pdir, config)
        frame, _ = pdir.read_rows()
        if retry_failed:
            frame = frame[frame["status"] == "ok"]
        done = set(frame["point_key"])
        meta = meta.started(hardware={"replay": device.source, "device_name": device.device_name},
                            fingerprint_id="replay", allocator=None, started_at=utc_now())
        pdir.write_meta(meta)
        measurer = ReplayMeasurer(config, device)
        tasks = [p for p in points if p.key not in done]
        measured, interpolated, measure_s, wall_s = _replay_all(tasks, measurer, pdir, config, rounds, max_minutes)
        frame = pdir.compact([p.key for p in config.grid.points])
        in_shard = frame[frame["point_key"].isin({p.key for p in points})]
        num_failed = int((in_shard["status"] == "failed").sum())
        complete = len(in_shard) == len(points)
        meta = meta.finished(complete=complete, finished_at=utc_now(), num_points=len(points),
                             num_done=len(in_shard), num_failed=num_failed)
        spent = dict(meta.extra.get("replay") or {})
        replay = {"profile": device.source, "device_name": device.device_name, "scatter": scatter_note(device),
                  "measure_s": float(spent.get("measure_s", 0.0)) + measure_s,
                  "wall_s": float(spent.get("wall_s", 0.0)) + wall_s}
        pdir.write_meta(replace(meta, extra={**meta.extra, "replay": replay}))
    return ReplayResult(Path(out), len(points), len(points) - len(tasks), measured, interpolated, num_failed,
                        complete, measure_s, wall_s)


def _replay_all(tasks, measurer: ReplayMeasurer, pdir: ProfileDir, config: SweepConfig, rounds: int,
                max_minutes: float | None) -> tuple[int, int, float, float]:
    """Measure the tasks in order, flushing rows every FLUSH_POINTS; stop once the simulated wall
    time reaches max_minutes."""
    pending, measured, interpolated, measure_s, wall_s = [], 0, 0, 0.0, 0.0
    try:
        for point in tasks:
            if max_minutes is not None and wall_s >= max_minutes * 60.0:
                break
            row, spent_s, point_wall_s = measurer.measure(point, config.grid.rounds_of(point, rounds))
            pending.append(row)
            measured += 1
            interpolated += row.get("error") == INTERPOLATED_MARK
            measure_s += spent_s
            wall_s += point_wall_s
            if len(pending) >= FLUSH_POINTS:
                pdir.append(pending)
                pending = []
    finally:
        pdir.append(pending)
    return measured, interpolated, measure_s, wall_s


def describe_replay(result: ReplayResult) -> str:
    """The line `stepcal profile --device replay:...` prints when it stops."""
    state = "complete" if result.complete else "incomplete (run again to resume)"
    return (f"{result.out}/profile.parquet: {result.num_points} points, {result.num_measured} replayed now "
            f"({result.num_interpolated} interpolated; {result.num_done_before} done before), "
            f"{result.num_failed} outside the profile (failed); {state}; simulated device time "
            f"{result.measure_s:.1f} s measuring, {result.wall_s:.1f} s wall")

