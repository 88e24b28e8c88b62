"""Measure again the engine points a slow stretch of the machine took.

The quickstart's profile times every point in three rounds per half and pools them, so a stretch of
a minute in which the machine runs slower moves one round of the points inside it. A sweep of one
round (the budgeted pass of gpu/gpu_campaign.py) has nothing to outvote it: on an H200 the
profile's engine points timed from 14:34:53 to 14:35:55 ran 2.5x slower than the same batches served
a minute later, while the probes at the sweep's two ends were normal, and the tables fitted on them
priced the measured runs 300-550% slow.

Between engine points the guard times a short fixed decode step (the runs' speed probe, fewer
steps) at most every `every_s` (so that probing costs about 3% of the sweep). Where a probe finds
the machine more than `slow_factor` slower than its normal speed (the median of the sweep's other
probes), the engine points timed since the previous probe, and those timed until the next, are
timed again at the end of the sweep, once, after waiting up to WAIT_MAX_S for the machine to
recover; each keeps the faster of its two rounds. A point timed in a later round since is left as
it is: its rounds pooled outvote the slowed one (and timing it again would drop them).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

GUARDED_OPS = frozenset({"step", "host"})   # one row per point; a `serve` point's served-step rows are not guarded
GUARD_STEPS = 20        # decode steps of a guard probe (the runs' probe times 200)
SLOW_FACTOR = 1.5       # a probe this much slower than the machine's normal speed is a slow stretch
PROBE_SHARE = 0.03      # of the sweep's time spent probing, at most: the probes' spacing
MIN_EVERY_S = 5.0       # and at least this far apart
WAIT_STEP_S, WAIT_MAX_S = 3.0, 30.0   # before timing the slowed points again: probe every 3 s, for 30 s at most


def every_s(start_probe_ms: float) -> float:
    """Seconds between probes for a machine whose start probe took `start_probe_ms` a step: 5 s for
    the tiny model on a CPU (a probe there takes about 0.1 s), about 20 s on an H200 (0.6 s)."""
    probe_s = GUARD_STEPS * 1.2 * start_probe_ms / 1000.0   # the untimed warm-up fifth included
    return max(MIN_EVERY_S, probe_s / PROBE_SHARE)


@dataclass
class SpeedGuard:
    probe_ms: Callable[[], float]       # the fixed decode step's time now
    clock: Callable[[], float]
    start_ms: float                     # the sweep's start probe
    every_s: float = MIN_EVERY_S        # seconds between probes, at least (every_s() sets it)
    slow_factor: float = SLOW_FACTOR
    probes_ms: list[float] = field(default_factory=list)
    _normal_ms: list[float] = field(init=False)     # the probes not in a slow stretch, the start's first
    _since: list = field(default_factory=list, init=False)   # (point, its rows) since the last probe
    _last_s: float = field(init=False)
    _was_slow: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._normal_ms = [self.start_ms]
        self._last_s = self.clock()   # made just after the sweep's start probe

    @property
    def reference_ms(self) -> float:
        """The machine's normal speed: the median of the probes outside slow stretches (a median, not
        the fastest: a probe of 20 steps scatters by a third on a shared 2-core VM)."""
        return float(np.median(self._normal_ms))

    def after(self, point, rows) -> list:
        """Note an engine point just timed (`rows`: the sweep's record of it, kept as given);
        returns the points to time again, with their rows: those timed since the previous probe
        where this one or that one found the machine slow, else none."""
        if point.op not in GUARDED_OPS:
            return []
        self._since.append((point, rows))
        return self.check() if self.clock() - self._last_s >= self.every_s else []

    def check(self) -> list:
        """Probe now: the points since the previous probe if this probe or that one found the machine
        slow (a stretch that ended between two probes began before the later one), else []."""
        slow = self.slow()
        self._last_s = self.clock()
        since, self._since = self._since, []
        suspect, self._was_slow = slow or self._was_slow, slow
        if not slow:
            self._normal_ms.append(self.probes_ms[-1])
        return since if suspect else []

    def slow(self) -> bool:
        """Probe now: is the machine in a slow stretch?"""
        probe = float(self.probe_ms())
        self.probes_ms.append(probe)
        return probe > self.slow_factor * self.reference_ms

    def wait_recovered(self, sleep: Callable[[float], None] = time.sleep, max_s: float = WAIT_MAX_S) -> bool:
        """Probe every WAIT_STEP_S until the machine is out of its slow stretch, for max_s at most
        (WAIT_MAX_S, or what the sweep's budget has left); whether it is out."""
        deadline = self.clock() + min(max_s, WAIT_MAX_S)
        while self.slow():
            if self.clock() >= deadline:
                return False
            sleep(WAIT_STEP_S)
        return True

    def finish(self) -> list:
        """At the sweep's end: the points since the last probe, if the machine is slow now."""
        return self.check() if self._since else []

    def record(self, measured_again: list[str]) -> dict:
        """What meta.json keeps of the guard."""
        return {"probes_ms": self.probes_ms, "reference_ms": self.reference_ms, "slow_factor": self.slow_factor,
                "measured_again": measured_again}
