"""Budgeted adaptive sampling: which points of a candidate set to measure next.

The first batch is a space-filling design per fit target (greedy maximin over the log sizes,
starting from the smallest shape; 2d + 4 points for d varying size axes). Every later batch fits
the op's regressor to what is measured (experiments.budget.op_model) and scores each unmeasured
candidate by the expected reduction of the model's error per second of measurement:

    score = weight x max((tree spread / predicted time)^2 - noise^2, 0) / predicted measurement seconds

(a point's variance is what measuring it removes, less what no measurement removes: `noise` is the
relative precision of the target's measured medians, the median of their rel_precision, so that a
noisy op whose trees disagree only by its own scatter stops drawing the budget; `weight` is how
much the point matters, e.g. how often a target trace's steps land near it; at least 1 while its
target has too few measured points to fit, so a weighting never starves a target). The batch is picked
greedily; after each pick the scores of same-target candidates nearby are damped by
1 - exp(-(distance / length)^2), so one batch does not spend itself on one corner. A candidate whose predicted cost exceeds what is left
of the budget is passed over. The choice is a function of what has been measured (and the seed)
only, so a campaign resumed after a kill picks what the uninterrupted one would.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepcal.experiments.budget.op_model import OpModel
from stepcal.experiments.replay.device import DEFAULT_AXES, DEFAULT_REL_SCATTER, SIZE_AXES
from stepcal.profiler.simulated_timing import simulate_rounds
from stepcal.profiler.timing import TimingPolicy

BATCH_FRACTION = 0.1     # a batch: this share of the points measured so far
MIN_BATCH = 4
GEOMETRY = ("num_heads", "num_kv_heads", "head_dim", "width")   # sizes too, where they vary


@dataclass(frozen=True)
class CostCurve:
    """Expected measurement seconds of a point by its kernel time, as profiler.timing.measure
    spends them under a policy (profiler.simulated_timing), tabulated once and interpolated."""
    log_time_ms: np.ndarray
    measure_s: np.ndarray

    @classmethod
    def for_policy(cls, policy: TimingPolicy, rounds: int = 1) -> CostCurve:
        times = np.logspace(-4, 4, 81)
        cost = [simulate_rounds(t, DEFAULT_REL_SCATTER, policy, rounds).measure_s for t in times]
        return cls(np.log(times), np.asarray(cost))

    def __call__(self, time_ms) -> np.ndarray:
        return np.interp(np.log(np.maximum(time_ms, 1e-12)), self.log_time_ms, self.measure_s)


def unit_coords(candidates: pd.DataFrame) -> np.ndarray:
    """Each candidate's size axes (replay.device.SIZE_AXES of its op, and the head and width
    columns where an op's candidates vary them) as log(1 + size) scaled to [0, 1] within its op;
    axes an op does not vary are 0."""
    columns = sorted({c for op in candidates["op"].unique() for c in axes_of(op)})
    coords = np.zeros((len(candidates), len(columns)))
    for op in candidates["op"].unique():
        rows = (candidates["op"] == op).to_numpy()
        for j, col in enumerate(columns):
            if col not in axes_of(op):
                continue
            values = np.log1p(np.nan_to_num(candidates.loc[rows, col].to_numpy(dtype=float)))
            span = values.max() - values.min()
            coords[rows, j] = (values - values.min()) / span if span > 0 else 0.0
    return coords


def axes_of(op: str) -> tuple[str, ...]:
    return (*SIZE_AXES.get(op, DEFAULT_AXES), *GEOMETRY)


def space_filling(coords: np.ndarray, count: int) -> list[int]:
    """`count` rows of `coords` by greedy maximin, from the smallest (lowest coordinate sum)."""
    chosen = [int(np.argmin(coords.sum(axis=1)))]
    distance = np.linalg.norm(coords - coords[chosen[0]], axis=1)
    while len(chosen) < min(count, len(coords)):
        nxt = int(np.argmax(distance))
        if distance[nxt] <= 0:
            break
        chosen.append(nxt)
        distance = np.minimum(distance, np.linalg.norm(coords - coords[nxt], axis=1))
    return chosen


class AdaptiveDesign:
    """Chooses the batches of a budgeted campaign over `candidates` (a record frame); `weights`
    per candidate (None: all 1)."""

    def __init__(self, candidates: pd.DataFrame, cost: CostCurve, *, weights=None, seed: int = 0) -> None:
        self.model = OpModel(candidates, seed)
        self.coords = unit_coords(self.model.candidates)
        self.cost = cost
        self.weights = np.ones(len(self.coords)) if weights is None else np.asarray(weights, dtype=float)
        # damping length per candidate: about one grid step of its target's candidates
        self.length = np.full(len(self.coords), 0.1)
        for index, _, _ in self.model.targets.values():
            varying = max(1, int((np.ptp(self.coords[index], axis=0) > 0).sum()))
            self.length[index] = np.sqrt(varying) * len(index) ** (-1.0 / varying)

    def initial(self) -> list[int]:
        """The space-filling first batch of every target, the targets' picks taken in turn (a
        budget that runs out inside this batch is spent on every target alike)."""
        per_target = []
        for index, _, _ in self.model.targets.values():
            varying = int((np.ptp(self.coords[index], axis=0) > 0).sum())
            per_target.append([int(index[i]) for i in space_filling(self.coords[index], 2 * varying + 4)])
        depth = max((len(t) for t in per_target), default=0)
        return [t[j] for j in range(depth) for t in per_target if j < len(t)]

    def next_batch(self, measured: dict[int, float], spent_s: float, budget_s: float,
                   precision: dict[int, float] | None = None) -> list[int]:
        """The next batch given the times `measured` so far (candidate index -> ms; None for a
        point that failed), their relative precision (index -> rel_precision; None: 0) and the
        seconds spent; [] when nothing affordable is left."""
        if not measured:
            return self.initial()
        ok = {i: t for i, t in measured.items() if t is not None}
        time_ms, spread = self.model.predict(np.array(list(ok), dtype=int), np.array(list(ok.values())))
        spread = np.sqrt(np.maximum(spread**2 - self._noise(ok, precision or {}) ** 2, 0.0))
        fallback = np.nanmedian(time_ms) if np.isfinite(time_ms).any() else 1.0
        cost_s = self.cost(np.where(np.isfinite(time_ms), time_ms, fallback))
        open_ = np.ones(len(self.coords), dtype=bool)
        open_[list(measured)] = False
        open_ &= cost_s <= max(budget_s - spent_s, 0.0)
        # a target too thinly measured to fit weighs at least 1: no weighting starves one the tables need
        weights = np.where(np.isfinite(time_ms), self.weights, np.maximum(self.weights, 1.0))
        score = np.where(open_, weights * spread**2 / np.maximum(cost_s, 1e-9), -np.inf)
        return self._greedy(score, max(MIN_BATCH, int(BATCH_FRACTION * len(measured))))

    def _noise(self, ok: dict[int, float], precision: dict[int, float]) -> np.ndarray:
        """Per candidate: the median relative precision of its target's measured points."""
        noise = np.zeros(len(self.coords))
        for index, _, _ in self.model.targets.values():
            values = [precision[i] for i in index if i in ok and precision.get(i) is not None
                      and np.isfinite(precision[i])]
            noise[index] = float(np.median(values)) if values else 0.0
        return noise

    def _greedy(self, score: np.ndarray, count: int) -> list[int]:
        score = score.copy()
        target_of = np.empty(len(score), dtype=int)
        for t, (index, _, _) in enumerate(self.model.targets.values()):
            target_of[index] = t
        chosen = []
        while len(chosen) < count and np.isfinite(score).any() and score.max() > -np.inf:
            best = int(np.argmax(score))
            chosen.append(best)
            score[best] = -np.inf
            same = target_of == target_of[best]
            distance = np.linalg.norm(self.coords[same] - self.coords[best], axis=1)
            damp = 1.0 - np.exp(-(distance / self.length[best]) ** 2)
            live = np.flatnonzero(same)[np.isfinite(score[same])]
            score[live] *= damp[np.isfinite(score[same])]
        return chosen
