"""Parallel, resumable sweeps of simulations (stepcal sweep): one Parquet of summaries, a Pareto plot.

`run_sweep` skips points whose results are stored under OUT/points (an interrupted sweep resumes),
runs the rest on the chosen backend, stores each result as it arrives, and writes
OUT/summaries.parquet (one row per point, in grid order), OUT/pareto.png and OUT/sweep.json.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.io import atomic_write_json, atomic_write_parquet
from stepcal.core.metrics import clean_json
from stepcal.experiments.sweep.backends import BACKENDS, run_points
from stepcal.experiments.sweep.config import Slo, SweepConfig, SweepPoint, load_sweep_config
from stepcal.experiments.sweep.pareto import best_per_slo, plot_pareto
from stepcal.experiments.sweep.runner import WALL_COLUMN, build_context, point_key, run_point
from stepcal.experiments.sweep.store import PointStore


@dataclass
class SweepReport:
    num_points: int
    num_run: int        # simulated in this call
    num_reused: int     # found finished under OUT/points
    best: dict          # SLO name -> the best point's index (None if no point meets it)
    frame: object       # the summaries DataFrame


def run_sweep(config: SweepConfig, out: str | Path, *, backend: str = "local", workers: int = 1,
              ray_address: str | None = None, on_progress: Callable[[int, int], None] | None = None) -> SweepReport:
    import pandas as pd  # lazy: loads pandas


    if backend not in BACKENDS:
        raise InputError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    out = Path(out)
    store = PointStore(out)
    keys = {p.index: point_key(p, config) for p in config.points}
    rows = {p.index: row for p in config.points if (row := store.load(keys[p.index])) is not None}
    pending = [p for p in config.points if p.index not in rows]
    num_reused = len(rows)

    def on_result(point: SweepPoint, row: dict) -> None:
        store.save(keys[point.index], row)
        rows[point.index] = row
        if on_progress is not None:
            on_progress(len(rows), len(config.points))

    if on_progress is not None:
        on_progress(num_reused, len(config.points))
    if pending:
        context = build_context(config)
        run_points(pending, context, on_result, backend=backend, workers=workers, address=ray_address)
    frame = pd.DataFrame([rows[p.index] for p in config.points])
    for column in ("max_num_seqs", "max_batched_tokens", "chunk_size"):   # None: the scheduler's default
        frame[column] = frame[column].astype("Int64")
    best = best_per_slo(frame, config.slos)
    atomic_write_parquet(frame, out / "summaries.parquet")
    plot_pareto(frame, config.latency, config.slos, best, out / "pareto.png")
    atomic_write_json(out / "sweep.json", clean_json({
        "config": str(config.path), "num_points": len(config.points), "num_run": len(pending),
        "num_reused": num_reused, "latency": config.latency, "shared": config.shared(),
        "best": {name: (None if i is None else rows[i]) for name, i in best.items()}}))
    return SweepReport(len(config.points), len(pending), num_reused, best, frame)


__all__ = [
    "BACKENDS",
    "WALL_COLUMN",
    "Slo",
    "SweepConfig",
    "SweepPoint",
    "SweepReport",
    "load_sweep_config",
    "run_point",
    "run_sweep",
]
