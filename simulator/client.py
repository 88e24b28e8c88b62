"""What clients do besides sending requests at their arrival times: closed-loop sessions, where a
session's next turn is sent a think time after the previous answer finished, and timeouts, after
which a client gives up on a request.

The Simulation pushes these as events: `Release` sends a closed-loop turn, `Timeout` aborts a request
that has not finished by its deadline. An abort frees the request's KV blocks at the first step
boundary at or after the deadline (a step in flight is not interrupted, as in a serving engine); a
request whose last token comes after its deadline counts as timed out, not finished. A session
goes on after a timeout: its next turn is sent a think time after the client gave up.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from stepcal.core.trace import Trace, session_pairs
from stepcal.simulator.request import Request, Status


class Serving(Protocol):
    """What a client's events ask of the simulation (simulation.Simulation): route a request, abort
    it on its replica, and end it."""
    replicas: list

    def send(self, request: Request, now_s: float, cut_runs: bool = False) -> None: ...

    def end_requests(self, done: list[Request], now_s: float) -> None: ...


def link_turns(trace: Trace, requests: list[Request]) -> list[Request]:
    """Chain each closed-loop turn (think_time_s given) to the previous turn of its session
    (`previous.next_turn`); return the requests sent at their own arrival_s, in trace order.
    A turn whose previous turn was skipped (too large for the KV cache) is sent at its arrival_s."""
    if trace.session_id is None or trace.think_time_s is None:
        return requests
    by_id = {r.request_id: r for r in requests}
    ids = trace.request_id.tolist()
    followers = set()
    for row, next_row in session_pairs(trace):
        previous, current = by_id.get(ids[row]), by_id.get(ids[next_row])
        if previous is not None and current is not None and current.think_time_s is not None:
            previous.next_turn = current
            followers.add(current.request_id)
    return [r for r in requests if r.request_id not in followers]


@dataclass(slots=True, eq=False)
class Release:
    """A request reaches the router at the end of its path (a closed-loop turn, or any request behind a
    front end whose delay depends on the load); `sim.send` routes it."""
    sim: Serving
    request: Request

    def fire(self, now_s: float) -> None:
        self.sim.send(self.request, now_s, cut_runs=True)


@dataclass(slots=True, eq=False)
class Timeout:
    """The client gives up on `request` unless it finished first."""
    sim: Serving
    request: Request

    def fire(self, now_s: float) -> None:
        request = self.request
        if request.status is not Status.FINISHED and request.status is not Status.ABORTED:
            self.sim.replicas[request.replica].abort(request, now_s)
            self.sim.end_requests([request], now_s)   # the client moves on (to its next turn)


def count_timeouts(requests: list[Request]) -> int:
    return sum(r.timed_out for r in requests)
