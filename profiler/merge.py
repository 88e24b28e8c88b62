"""Join profile directories (shards of one sweep, or pieces of one sweep run on several hosts)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.io import atomic_write_parquet
from stepcal.core.model_spec import ModelSpec
from stepcal.core.profile_meta import ProfileMeta
from stepcal.profiler.grid import expand_grid
from stepcal.profiler.serve import SERVED
from stepcal.profiler.store import read_meta, read_rows

# The parts of a sweep's identity that must agree to merge (threads and seed may differ by host).
MUST_MATCH = ("model_spec", "device", "dtype", "ops", "grid_fingerprint")


@dataclass(frozen=True)
class MergeResult:
    num_rows: int
    num_duplicates: int
    num_failed: int
    num_missing: int          # grid points in no input (0 when the grid size is unknown)


def merge_profiles(inputs: list[str | Path], out: str | Path) -> MergeResult:
    """Every point once: an ok row beats a failed one, then the latest measurement wins."""
    out = Path(out)
    metas, frames = [], []
    for path in map(Path, inputs):
        meta = read_meta(path)
        if meta is None:
            raise InputError(f"{path}: not a profile directory (no meta.json)")
        if path.resolve() == out.resolve():
            raise InputError(f"{path}: --out must not be one of the inputs")
        frame, _ = read_rows(path)
        metas.append(meta)
        frames.append(frame)
    _check_compatible(inputs, metas)
    joined = pd.concat(frames, ignore_index=True)
    num_in = len(joined)
    joined = joined.assign(_ok=(joined["status"] == "ok").astype(int)) \
        .sort_values(["_ok", "measured_at"], kind="stable") \
        .drop_duplicates("point_key", keep="last").drop(columns="_ok")
    order = _grid_order(metas[0])
    if order:
        rank = {k: i for i, k in enumerate(order)}
        joined = joined.assign(_r=joined["point_key"].map(lambda k: rank.get(k, len(rank))).astype("int64")) \
            .sort_values("_r", kind="stable").drop(columns="_r")
    joined = joined.reset_index(drop=True)
    grid_points = metas[0].grid_num_points
    points = joined[joined["name"] != SERVED]   # a served workload's steps are rows beyond its point
    missing = max(0, grid_points - len(points)) if isinstance(grid_points, int) else 0
    atomic_write_parquet(joined, out / "profile.parquet")
    # every piece's speed probes (profiler.sweep.engine_speed_probe_ms): the tables fitted on the merged
    # profile keep them, and validate sets runs against them
    speed_probes = [p for m in metas for p in m.speed_probe_ms or ()]
    ProfileMeta(
        identity=metas[0].identity, grid=metas[0].grid, grid_source=metas[0].grid_source, grid_num_points=grid_points,
        merged_from=[{"path": str(p), "shard": m.shard, "status": m.status, "fingerprint_id": m.fingerprint_id,
                      "hardware": m.hardware} for p, m in zip(inputs, metas)],
        num_points=len(points), num_missing=missing, num_failed=int((joined["status"] == "failed").sum()),
        status="complete" if missing == 0 else "incomplete", speed_probe_ms=speed_probes).write(out)
    return MergeResult(len(joined), num_in - len(joined), int((joined["status"] == "failed").sum()), missing)


def _check_compatible(inputs, metas: list[ProfileMeta]) -> None:
    first = metas[0].identity
    for path, meta in zip(inputs[1:], metas[1:]):
        identity = meta.identity
        diff = [k for k in MUST_MATCH if identity.get(k) != first.get(k)]
        if diff:
            raise InputError(f"{path}: cannot merge with {inputs[0]}: different {', '.join(diff)}")


def _grid_order(meta: ProfileMeta) -> list[str]:
    """The grid's point order, rebuilt from the grid source stored in meta.json (best effort)."""
    if not meta.grid_source or meta.model_spec is None:
        return []
    try:
        grid = expand_grid(meta.grid or "grid", meta.grid_source, ModelSpec(**meta.model_spec))
    except (InputError, TypeError, ValueError):
        return []
    ops = set(meta.ops)
    return [p.key for p in grid.points if p.op in ops]
