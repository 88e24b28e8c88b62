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
timed again at the end of the sweep, once, after waiting up to `wait_max_s` for the machine to
recover; each keeps the faster of its two rounds. A point timed in a later round since is left as
it is: its rounds pooled outvote the slowed one (and timing it again would drop them). The settings
are a NoisePolicy's (profiler.noise_policy: `for_policy`), which says whether a sweep runs a guard.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from stepcal.profiler.noise_policy import NoisePolicy

GUARDED_OPS = frozenset({"step", "host"})   # one row per point; a `serve` point's served-step rows are not guarded
_DEFAULT = NoisePolicy()
GUARD_STEPS = _DEFAULT.guard_probe_steps      # the policy's defaults, by their old names
SLOW_FACTOR = _DEFAULT.guard_slow_factor
MIN_EVERY_S = _DEFAULT.guard_min_every_s
WAIT_STEP_S, WAIT_MAX_S = _DEFAULT.guard_wait_step_s, _DEFAULT.guard_wait_max_s


@dataclass
class SpeedGuard:
    probe_ms: Callable[[], float]       # the fixed decode step's time now
    clock: Callable[[], float]
    start_ms: float                     # the sweep's start probe
    every_s: float = MIN_EVERY_S        # seconds between probes, at least (for_policy sets it)
    slow_factor: float = SLOW_FACTOR
    wait_step_s: float = WAIT_STEP_S    # before timing the slowed points again: probe this often,
    wait_max_s: float = WAIT_MAX_S      # for this long at most
    probes_ms: list[float] = field(default_factory=list)
    _normal_ms: list[float] = field(init=False)     # the probes not in a slow stretch, the start's first
    _since: list = field(default_factory=list, init=False)   # (point, its rows) since the last probe
    _last_s: float = field(init=False)
    _was_slow: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._normal_ms = [self.start_ms]
        self._last_s = self.clock()   # made just after the sweep's start probe

    @classmethod
    def for_policy(cls, policy: NoisePolicy, probe_ms: Callable[[], float], clock: Callable[[], float],
                   start_ms: float) -> SpeedGuard:
        """A guard with `policy`'s settings (its spacing from the start probe); `probe_ms` times
        policy.guard_probe_steps steps."""
        return cls(probe_ms, clock, start_ms, every_s=policy.guard_every_s(start_ms), slow_factor=policy.guard_slow_factor,
                   wait_step_s=policy.guard_wait_step_s, wait_max_s=policy.guard_wait_max_s)

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

    def wait_recovered(self, sleep: Callable[[float], None] = time.sleep, max_s: float = float("inf")) -> bool:
        """Probe every wait_step_s until the machine is out of its slow stretch, for wait_max_s at
        most, or max_s (what the sweep's budget has left) where less; whether it is out."""
        deadline = self.clock() + min(max_s, self.wait_max_s)
        while self.slow():
            if self.clock() >= deadline:
                return False
            sleep(self.wait_step_s)
        return True

    def finish(self) -> list:
        """At the sweep's end: the points since the last probe, if the machine is slow now."""
        return self.check() if self._since else []

    def record(self, measured_again: list[str]) -> dict:
        """What meta.json keeps of the guard."""
        return {"probes_ms": self.probes_ms, "reference_ms": self.reference_ms, "slow_factor": self.slow_factor,
                "measured_again": measured_again}
