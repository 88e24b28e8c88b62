"""Routers spread arriving requests over replicas."""
from __future__ import annotations

from stepcal.core.errors import InputError


class RoundRobinRouter:
    name = "round-robin"
    reads_state = False   # picks without looking at the replicas

    def __init__(self) -> None:
        self._next = 0

    def pick(self, schedulers) -> int:
        index = self._next % len(schedulers)
        self._next += 1
        return index


class LeastOutstandingTokensRouter:
    """The replica with the fewest tokens still to compute (prefill and decode); ties go to the lowest index."""
    name = "least-tokens"
    reads_state = True

    def pick(self, schedulers) -> int:
        loads = [s.num_outstanding_tokens for s in schedulers]
        return loads.index(min(loads))


ROUTERS = {"round-robin": RoundRobinRouter, "least-tokens": LeastOutstandingTokensRouter}


def make_router(name: str):
    if name not in ROUTERS:
        raise InputError(f"--router: unknown router {name!r}; choose one of {', '.join(ROUTERS)}")
    return ROUTERS[name]()
