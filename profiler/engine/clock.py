"""Engine clocks: wall (arrivals replayed in real time) and virtual (idle gaps skipped)."""
from __future__ import annotations

import time


class WallClock:
    """Trace time = seconds since start(); waiting for an arrival really sleeps."""
    name = "wall"

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def wait_until(self, time_s: float) -> None:
        delay = time_s - self.now()
        if delay > 0:
            time.sleep(delay)

    def step_end(self, start_s: float, elapsed_s: float) -> float:
        return self.now()


class VirtualClock:
    """Trace time advances by each step's measured duration and jumps over idle gaps, so a
    sparse one-hour trace takes only as long as its steps."""
    name = "virtual"

    def start(self) -> None:
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def wait_until(self, time_s: float) -> None:
        self._now = max(self._now, time_s)

    def step_end(self, start_s: float, elapsed_s: float) -> float:
        self._now = start_s + elapsed_s
        return self._now


CLOCKS = {"wall": WallClock, "virtual": VirtualClock}
