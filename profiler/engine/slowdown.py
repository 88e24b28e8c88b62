"""Repeats the machine slowed: a stretch of steps far slower than the same stretch of the other repeats.

On a shared machine another process can take the cores for a second or two. A quickstart run lasts a
few seconds, so one such stretch moves its TTFT tail by tens of percent (seen: one repeat's steps
1.5x slower for 1.5 of its 3.4 s, TTFT P50 365 ms against 128 ms for the other repeat), and no model
of the engine can predict it. Measured runs flag such repeats; the quickstart serves them again.

The reference is the run itself, no cost model. Each step's time is divided by a robust (least
absolute deviations) line on its sequences, tokens and KV reads fitted over every repeat's steps, and
by the median of that ratio over the steps of its shape (the line misprices some shapes). A window of
WINDOW_STEPS consecutive steps is slowed when its median ratio exceeds SLOWED_RATIO times the other
repeats' median over the same stretch of the run's clock. That comparison matters: the engine itself
has stretches slower than their shapes suggest (decodes right after big prefills took 1.3x their usual
time, at the same moment of both repeats), and the repeats, serving one trace, share them. A run of one
repeat has nothing to compare with: its windows are held to SLOWED_ALONE_RATIO of the usual time.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from stepcal.profiler.noise_policy import SLOWED_ALONE_RATIO, SLOWED_RATIO
from stepcal.profiler.noise_policy import SLOWED_WINDOW_STEPS as WINDOW_STEPS

MIN_SHAPE_STEPS = 8
FEATURES = ("num_seqs", "num_tokens", "kv_sum", "prefill_attn_work")   # the line's, beside a constant
_IRLS_ITERATIONS = 8


@dataclass(frozen=True)
class SlowestWindow:
    """A repeat's slowest stretch of WINDOW_STEPS consecutive steps."""
    ratio: float            # the window's median step time over its shapes' usual time
    start_s: float          # the window's first and last step starts (the run's clock)
    end_s: float
    others: float | None = None   # the other repeats' slowest window near [start_s, end_s]; None: no other

    @property
    def excess(self) -> float:
        return self.ratio / self.others if self.others else self.ratio

    @property
    def slowed(self) -> bool:
        return self.excess > (SLOWED_RATIO if self.others else SLOWED_ALONE_RATIO)

    def overlaps(self, other: SlowestWindow) -> bool:
        """Whether the two windows share some of the run's time."""
        return self.start_s <= other.end_s and other.start_s <= self.end_s

    def to_dict(self) -> dict:
        return {k: None if v is None else round(v, 4) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> SlowestWindow:
        """to_dict's record read back; other keys (a validation record's `repeat`) are left out."""
        return cls(data["ratio"], data["start_s"], data["end_s"], data.get("others"))

    def describe(self) -> str:
        where = f"from {self.start_s:.2f} to {self.end_s:.2f} s"
        if self.others:
            return f"steps {self.excess:.2f}x what the other repeats took {where}"
        return f"steps {self.ratio:.2f}x their usual time {where}"


def slowest_windows(step_logs: list) -> list[SlowestWindow | None]:
    """Per step log (a repeat's DataFrame: start_s, duration_ms, num_seqs, num_tokens; kv_sum and
    prefill_attn_work where present), its most slowed window; None for a log shorter than a window."""
    durations = [log["duration_ms"].to_numpy(float) for log in step_logs]
    features = [_features(log) for log in step_logs]
    if sum(len(d) for d in durations) < 3:
        return [None] * len(step_logs)
    coef = _lad_fit(np.vstack(features), np.concatenate(durations))
    ratios = [d / np.maximum(x @ coef, 1e-9) for d, x in zip(durations, features)]
    ratios = _per_shape(ratios, [_shape_keys(log) for log in step_logs])
    timed = [_by_time(log["start_s"].to_numpy(float), r) for log, r in zip(step_logs, ratios)]
    return [_slowest(*timed[k], [t for j, t in enumerate(timed) if j != k]) for k in range(len(timed))]


def _features(log) -> np.ndarray:
    columns = [log[c].to_numpy(float) for c in FEATURES if c in log]
    return np.column_stack([np.ones(len(log)), *columns])


def _shape_keys(log) -> np.ndarray:
    """Steps of one shape: decodes by their number of sequences, prefill steps also by their tokens
    (half powers of two)."""
    seqs, tokens = log["num_seqs"].to_numpy(float), log["num_tokens"].to_numpy(float)
    bucket = np.where(tokens > seqs, np.round(2 * np.log2(np.maximum(tokens, 1.0))), -1.0)
    return seqs * 1000.0 + bucket


def _per_shape(ratios: list[np.ndarray], keys: list[np.ndarray]) -> list[np.ndarray]:
    """Each ratio over the median ratio of its shape over every repeat, where MIN_SHAPE_STEPS or more
    steps have it: the fit is a line, and a run's steps of one shape (a stretch of one- and two-sequence
    decodes, priced 30% low by a line through bigger batches) must not read as a slowed stretch."""
    import pandas as pd  # lazy: loads pandas
    pooled = pd.DataFrame({"ratio": np.concatenate(ratios), "key": np.concatenate(keys)})
    by_shape = pooled.groupby("key")["ratio"]
    median, count = by_shape.transform("median").to_numpy(), by_shape.transform("size").to_numpy()
    adjusted = np.where(count >= MIN_SHAPE_STEPS, pooled["ratio"].to_numpy() / median, pooled["ratio"].to_numpy())
    return np.split(adjusted, np.cumsum([len(r) for r in ratios])[:-1])


def _lad_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least absolute deviations by reweighted least squares: a slowed stretch pulls it little."""
    weights = np.ones(len(y))
    floor = 1e-3 * max(float(np.median(y)), 1e-9)
    coef = np.zeros(x.shape[1])
    for _ in range(_IRLS_ITERATIONS):
        root = np.sqrt(weights)
        coef = np.linalg.lstsq(x * root[:, None], y * root, rcond=None)[0]
        weights = 1.0 / np.maximum(np.abs(y - x @ coef), floor)
    return coef


def _by_time(start_s: np.ndarray, ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(start_s, kind="stable")
    return start_s[order], ratio[order]


def _window_medians(start_s: np.ndarray, ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every window's first start, last start and median ratio."""
    medians = np.median(np.lib.stride_tricks.sliding_window_view(ratio, WINDOW_STEPS), axis=1)
    return start_s[:len(medians)], start_s[WINDOW_STEPS - 1:], medians


def _slowest(start_s: np.ndarray, ratio: np.ndarray, others: list) -> SlowestWindow | None:
    """The window of most excess over the other repeats near the same stretch (over its usual time alone)."""
    if len(ratio) < WINDOW_STEPS:
        return None
    first, last, medians = _window_medians(start_s, ratio)
    others = [_window_medians(t, r) for t, r in others if len(r) >= WINDOW_STEPS]
    if not others:
        k = int(np.argmax(medians))
        return SlowestWindow(float(medians[k]), float(first[k]), float(last[k]))
    other_first = np.concatenate([o[0] for o in others])
    other_medians = np.concatenate([o[2] for o in others])[np.argsort(other_first, kind="stable")]
    other_first = np.sort(other_first, kind="stable")
    # The others' slowest window starting within one window's span of this one: the repeats do not
    # keep time exactly (a stretch of slow decodes after a big prefill came 0.06 s apart in two).
    span = last - first
    lo = np.searchsorted(other_first, first - span)
    hi = np.searchsorted(other_first, last + span, side="right")
    overall = float(np.median(other_medians))
    reference = np.array([other_medians[a:b].max() if b > a else overall for a, b in zip(lo, hi)])
    k = int(np.argmax(medians / reference))
    return SlowestWindow(float(medians[k]), float(first[k]), float(last[k]), float(reference[k]))


__all__ = ["SLOWED_ALONE_RATIO", "SLOWED_RATIO", "WINDOW_STEPS", "SlowestWindow", "slowest_windows"]
