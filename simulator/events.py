"""The event core shared by every simulation: a heap of (time_s, priority, seq, event), SimPy's shape.

Each event carries its own handling (`fire(now_s)`); the loop only orders them. At equal times the
priority decides (lower first), then the sequence number, so ties are deterministic. Arrivals from
the trace are not pushed one by one: they come from a sorted list merged with the heap, and come
before any heap event at the same time (so requests arriving together are scheduled together).
"""
from __future__ import annotations

import gc
import heapq
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from tqdm import tqdm

# Priorities at equal times: a request reaching a scheduler (a trace arrival, or a KV cache landing
# at a decode pool), then a step finishing, then an idle replica waking up to schedule.
ARRIVAL, STEP_DONE, WAKE = 0, 1, 2


class Event(Protocol):
    def fire(self, now_s: float) -> None: ...


class EventLoop:
    """Runs the trace's arrivals and the pushed events in time order until both are exhausted."""

    def __init__(self, arrival_s: list[float], on_arrival: Callable[[int, float], None]) -> None:
        self.arrival_s = arrival_s            # sorted; on_arrival(i, now_s) handles the i-th
        self.on_arrival = on_arrival
        self.next_arrival = 0                 # index of the first arrival not yet handled
        self.heap: list[tuple[float, int, int, Event]] = []
        self.seq = 0

    def push(self, time_s: float, priority: int, event: Event) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time_s, priority, self.seq, event))

    def next_arrival_s(self) -> float:
        """When the next trace arrival comes (inf when none is left)."""
        i = self.next_arrival
        return self.arrival_s[i] if i < len(self.arrival_s) else math.inf

    def run(self, progress: bool = False) -> None:
        """Handle every event; `progress` shows a bar over arrivals on stderr (long traces only).
        Callers pause the garbage collector around it (paused_gc)."""
        bar = _progress_bar(len(self.arrival_s)) if progress else None
        arrivals, heap, on_arrival = self.arrival_s, self.heap, self.on_arrival
        n, pop = len(arrivals), heapq.heappop
        while self.next_arrival < n or heap:
            i = self.next_arrival
            if i < n and (not heap or arrivals[i] <= heap[0][0]):
                self.next_arrival = i + 1
                on_arrival(i, arrivals[i])
                if bar is not None and not (i + 1) & 1023:
                    bar.update(1024)
                continue
            now, _, _, event = pop(heap)
            event.fire(now)
        if bar is not None:
            bar.update(n - bar.n)
            bar.close()


@contextmanager
def paused_gc() -> Iterator[None]:
    """The simulations allocate no reference cycles, but the cyclic GC would rescan every live Request
    on each collection, making long traces quadratic: pause it while they run and build their logs."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _progress_bar(total: int):
    return tqdm(total=total, unit="req", desc="simulate", leave=False, mininterval=0.5, file=sys.stderr,
                disable=total < 20000)
