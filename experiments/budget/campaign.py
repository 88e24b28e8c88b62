"""`stepcal profile --budget-s S`: a budgeted adaptive campaign over a grid's points, written as an
ordinary, resumable profile directory.

The grid's points are the candidates; experiments.budget.adaptive picks the batches, weighting
each candidate by where a target trace's steps land when one is given (experiments.budget.trace_weights;
meta.json's budget record names the weighting). Seconds spent
are those of the timed calls of the rows in the directory (their samples times calls per sample,
plus the warm-up calls), so a resumed campaign counts what the earlier runs spent. Each batch is
written to DIR/budget.json before it is measured: a campaign killed mid-batch first measures what
is left of that batch when run again, then goes on choosing exactly as the uninterrupted campaign
would (the choice depends only on what is measured, and a replayed point's draws only on the seed
and its key), and no point is ever measured twice. The campaign ends when no candidate is left
that the rest of the budget affords.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.io import atomic_write_json
from stepcal.costmodel.importers.native import import_profile
from stepcal.experiments.budget.adaptive import AdaptiveDesign, CostCurve
from stepcal.experiments.budget.trace_weights import TraceWeighting, candidate_weights
from stepcal.profiler.store import ProfileDir
from stepcal.profiler.sweep import SweepConfig, check_profile_meta, shape_columns, utc_now

STATE_FILE = "budget.json"
FLUSH_POINTS = 16


@dataclass(frozen=True)
class BudgetResult:
    out: Path
    budget_s: float
    spent_s: float            # measurement seconds in the directory, every run
    num_points: int           # measured, every run (failed included)
    num_candidates: int
    num_measured: int         # this run
    num_batches: int
    complete: bool            # the budget is spent (nothing affordable is left)
    wall_s: float             # this run (simulated on a replay device)
    weighting: str = "uniform"    # or "for-trace"


def row_measure_s(row: dict, warmup: int) -> float:
    """Device seconds a profile row's point took: its samples' calls plus the warm-up calls."""
    if row.get("status") != "ok" or row.get("samples_ms") is None:
        return 0.0
    samples = np.asarray(list(row["samples_ms"]), dtype=float)
    inner = row.get("inner_repeats")
    inner = 1 if inner is None or pd.isna(inner) else int(inner)
    return float(samples.sum() * inner + warmup * float(row["time_ms"])) / 1e3


def candidate_records(config: SweepConfig) -> pd.DataFrame:
    """The grid's points as a record frame (costmodel.records), in grid order, for the design."""
    rows = [{**shape_columns(p, config.spec), "time_ms": 1.0, "status": "ok", "dtype": config.dtype}
            for p in config.points()]
    return import_profile(pd.DataFrame(rows), "grid")


def run_budget_campaign(config: SweepConfig, out: str | Path, budget_s: float, measurer, *,
                        max_minutes: float | None = None, for_trace: TraceWeighting | None = None) -> BudgetResult:
    """Measure the grid's points the adaptive design picks until `budget_s` is spent (see the
    module's docstring). `measurer.measure(point, rounds)` -> (row, measure_s, wall_s). `for_trace`:
    weight the candidates by where that trace's steps land (experiments.budget.trace_weights)."""
    if not budget_s > 0:
        raise InputError(f"--budget-s: must be positive, got {budget_s:g}")
    points = config.points()
    if any(p.op in ("serve", "step", "host", "overhead") for p in points):
        raise InputError("--budget-s: adaptive sampling covers kernel ops (gemm, attn_prefill, attn_decode, "
                         "elementwise, moe); profile whole steps and host work with a grid")
    pdir = ProfileDir(Path(out))
    check_profile_meta(pdir, config)
    with pdir:
        meta = check_profile_meta(pdir, config)
        pdir.write_meta(meta.started(hardware={"device": config.device}, fingerprint_id="budget", allocator=None,
                                     started_at=utc_now()))
        state = _Campaign(config, pdir, budget_s, measurer, for_trace)
        state.run(max_minutes)
        frame = pdir.compact([p.key for p in config.grid.points])
        meta = meta.finished(complete=state.complete, finished_at=utc_now(), num_points=len(points),
                             num_done=len(frame), num_failed=int((frame["status"] == "failed").sum()))
        weighting = {"kind": "uniform"} if for_trace is None else for_trace.to_dict()
        record = {"budget_s": budget_s, "spent_s": state.spent_s, "num_batches": len(state.batches),
                  "weighting": weighting}
        pdir.write_meta(replace(meta, status="complete" if state.complete else "incomplete",
                                extra={**meta.extra, "budget": record}))
    return BudgetResult(Path(out), budget_s, state.spent_s, len(state.measured), len(points), state.num_measured,
                        len(state.batches), state.complete, state.wall_s, weighting["kind"])


class _Campaign:
    """One run of a budgeted campaign over a profile directory."""

    def __init__(self, config: SweepConfig, pdir: ProfileDir, budget_s: float, measurer,
                 for_trace: TraceWeighting | None = None) -> None:
        self.config, self.pdir, self.budget_s, self.measurer = config, pdir, budget_s, measurer
        self.points = config.points()
        self.index = {p.key: i for i, p in enumerate(self.points)}
        policy = config.policy
        self.warmup = policy.warmup
        candidates = candidate_records(config)
        weights = None if for_trace is None else candidate_weights(candidates, for_trace.steps)
        self.design = AdaptiveDesign(candidates, CostCurve.for_policy(policy.for_round(), policy.rounds),
                                     weights=weights, seed=config.seed)
        frame, _ = pdir.read_rows()
        self.measured: dict[int, float | None] = {}
        self.precision: dict[int, float | None] = {}    # rel_precision of each measured median
        self.spent_s = 0.0
        for row in frame.to_dict("records"):
            if row["point_key"] in self.index:
                self._record(self.index[row["point_key"]], row)
        self.batches = self._read_state()
        self.num_measured, self.wall_s, self.complete, self.pending = 0, 0.0, False, []

    def run(self, max_minutes: float | None) -> None:
        try:
            batch = [i for i in (self.batches[-1] if self.batches else []) if i not in self.measured]
            while True:
                for i in batch:
                    if max_minutes is not None and self.wall_s >= max_minutes * 60.0:
                        return
                    if self.spent_s >= self.budget_s:     # the first batch, too, stops at the budget
                        break
                    self._measure(i)
                if self.spent_s >= self.budget_s:
                    break
                batch = [i for i in self.design.next_batch(self.measured, self.spent_s, self.budget_s,
                                                           self.precision) if i not in self.measured]
                if not batch:
                    break
                self.batches.append(batch)
                self._write_state()
            self.complete = True
        finally:
            self.pdir.append(self.pending)

    def _measure(self, i: int) -> None:
        point = self.points[i]
        row, _, wall_s = self.measurer.measure(point, self.config.grid.rounds_of(point, self.config.policy.rounds))
        self._record(i, row)
        self.wall_s += wall_s
        self.num_measured += 1
        self.pending.append(row)
        if len(self.pending) >= FLUSH_POINTS:
            self.pdir.append(self.pending)
            self.pending = []

    def _record(self, i: int, row: dict) -> None:
        ok = row["status"] == "ok"
        self.measured[i] = float(row["time_ms"]) if ok else None
        precision = row.get("rel_precision")
        self.precision[i] = float(precision) if ok and precision is not None and not pd.isna(precision) else None
        self.spent_s += row_measure_s(row, self.warmup)

    def _read_state(self) -> list[list[int]]:
        path = self.pdir.path / STATE_FILE
        if not path.exists():
            return []
        try:
            batches = json.loads(path.read_text())["batches"]
            return [[self.index[k] for k in batch if k in self.index] for batch in batches]
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{path}: not a budget campaign's state ({exc}); use another --out") from None

    def _write_state(self) -> None:
        # rows measured so far go first: the state never names a batch whose earlier rows are lost
        self.pdir.append(self.pending)
        self.pending = []
        atomic_write_json(self.pdir.path / STATE_FILE,
                          {"batches": [[self.points[i].key for i in b] for b in self.batches]})


def describe_budget(result: BudgetResult) -> str:
    """The line `stepcal profile --budget-s` prints when it stops."""
    state = "budget spent" if result.complete else "incomplete (run again to resume)"
    return (f"{result.out}/profile.parquet: {result.num_points} of {result.num_candidates} candidate points "
            f"measured ({result.num_measured} now) in {result.num_batches} batches; {result.spent_s:.2f} s of "
            f"the {result.budget_s:g} s budget spent ({result.weighting} weighting); {state}; "
            f"{result.wall_s:.1f} s wall")

