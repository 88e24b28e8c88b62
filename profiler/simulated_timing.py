"""Timing without a device: a timer that draws a kernel's samples from its known time and scatter,
charging what the kernel would have taken to a simulated clock.

`profiler.timing.measure` drives it exactly as it drives a real timer (warm-up, calls per sample,
batches until the median is precise enough or the point's time cap is hit), so a replayed
measurement spends what the real one would, and a plan (the expected time of a campaign) counts
the same calls. Samples are log-normal around the time: a kernel's repeats scatter by a ratio.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepcal.profiler.timing import Measurement, TimingPolicy, measure, summarize

# Wall time of one point beyond its timed calls: building the kernel's inputs, allocating, one
# synchronisation. An assumption for plans and replays, not a measurement (a pilot replaces it).
POINT_SETUP_S = 0.02


@dataclass
class SimClock:
    """Seconds of device time spent so far; advanced by the timers that charge it."""
    now_s: float = 0.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


class DrawnTimer:
    """Samples of `time_ms` per call scattered log-normally by `rel_scatter` (sigma of log time);
    each sample of `inner` calls charges `clock` the calls' drawn time."""

    def __init__(self, time_ms: float, rel_scatter: float, rng: np.random.Generator | None, clock: SimClock) -> None:
        self.time_ms, self.rel_scatter, self.rng, self.clock = time_ms, rel_scatter, rng, clock

    def samples(self, run, num_samples: int, inner: int, first_call: int) -> list[float]:
        if self.rng is None or self.rel_scatter <= 0:     # the expected run: every sample the median
            draws = np.full(num_samples, self.time_ms)
        else:
            draws = self.time_ms * np.exp(self.rng.normal(0.0, self.rel_scatter, num_samples))
        self.clock.advance(float(draws.sum()) * inner / 1e3)
        return [float(d) for d in draws]


@dataclass(frozen=True)
class SimulatedPoint:
    measurement: Measurement
    measure_s: float      # device time of the point's calls (warm-up included)
    wall_s: float         # measure_s plus the point's setup


def simulate_point(time_ms: float, rel_scatter: float, policy: TimingPolicy,
                   rng: np.random.Generator | None = None, setup_s: float = POINT_SETUP_S) -> SimulatedPoint:
    """One point measured as profiler.timing.measure would, on a kernel of `time_ms` per call.
    rng None: the expected run (no scatter drawn; the repeats the precision test needs at this
    scatter are still taken, at least policy.min_repeats)."""
    clock = SimClock()
    timer = DrawnTimer(time_ms, rel_scatter, rng, clock)
    if rng is None and rel_scatter > 0:
        measurement = _expected(timer, rel_scatter, policy, clock)
    else:
        measurement = measure(_no_call, timer, policy, clock=clock)
    return SimulatedPoint(measurement, clock.now_s, clock.now_s + setup_s)


def _expected(timer: DrawnTimer, rel_scatter: float, policy: TimingPolicy, clock: SimClock) -> Measurement:
    """The expected run at a scatter: as many repeats as the precision test asks for on average
    (1.2533 sigma / sqrt(n) <= target), within the policy's caps."""
    needed = int(np.ceil((1.2533 * rel_scatter / max(policy.target_rel_precision, 1e-9)) ** 2))
    wanted = min(policy.max_repeats, max(policy.min_repeats, needed))
    return measure(_no_call, timer, policy.updated(min_repeats=wanted, target_rel_precision=1.0), clock=clock)


def _no_call(_call: int) -> None:
    """The kernel a drawn timer stands for: nothing runs."""


def simulate_rounds(time_ms: float, rel_scatter: float, policy: TimingPolicy, rounds: int,
                    rng: np.random.Generator | None = None, setup_s: float = POINT_SETUP_S) -> SimulatedPoint:
    """A point measured in `rounds` passes of the sweep, each with its share of the policy
    (TimingPolicy.for_round), the passes' samples pooled as the sweep pools them."""
    passes = [simulate_point(time_ms, rel_scatter, policy.for_round(), rng, setup_s) for _ in range(max(rounds, 1))]
    if len(passes) == 1:
        return passes[0]
    samples = [s for p in passes for s in p.measurement.samples_ms]
    first = passes[0].measurement
    pooled = summarize(samples, first.inner_repeats, first.stopped_by)
    return SimulatedPoint(pooled, sum(p.measure_s for p in passes), sum(p.wall_s for p in passes))
