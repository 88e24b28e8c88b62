"""Limits on sizes and counts, checked before anything is allocated or simulated.

A request, trace or flag beyond these is a mistake (a 10^18-token prompt, a trace spanning
centuries), not a workload: numpy would ask for exabytes or the simulator would never finish.
Each limit is far past anything served today; the message names it so a user can see why.
"""
from __future__ import annotations

import math

from stepcal.core.errors import InputError, shown

MAX_TOKENS_PER_REQUEST = 10_000_000        # 10M tokens: ten times the longest context windows
MAX_REQUESTS = 50_000_000                  # one trace; Azure's week-long traces hold ~30M
MAX_ARRIVAL_S = 366 * 24 * 3600.0          # one year of trace time
MAX_REPLICAS = 10_000
MAX_SEED = 2**63 - 1
MAX_RATE_RPS = 1_000_000.0                 # requests per second into one deployment
MAX_TIME_MS = 3_600_000.0                  # an hour for one step or one SLO: larger is a unit mistake


def number(value, what: str, *, minimum: float = 0.0, strict: bool = True,
           maximum: float = math.inf) -> float:
    """A finite float with minimum < value (<= where not strict) <= maximum; `what` names it."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a number, got {shown(value)}") from None
    low_ok = x > minimum if strict else x >= minimum
    if not math.isfinite(x) or not low_ok or x > maximum:
        bound = ">" if strict else ">="
        top = f" and <= {maximum:g}" if math.isfinite(maximum) else ""
        raise InputError(f"{what} must be a finite number {bound} {minimum:g}{top}, got {shown(value)}")
    return x


def count(value, what: str, *, minimum: int = 1, maximum: int) -> int:
    """A whole number in [minimum, maximum]; `what` names it."""
    try:
        x = float(value)
        whole = math.isfinite(x) and x == int(x)
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or not minimum <= int(x) <= maximum:
        raise InputError(f"{what} must be a whole number from {minimum} to {maximum:,}, got {shown(value)}")
    return int(x)


def choices(text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated list of names from `allowed` (schedulers, ops), duplicates dropped, as a tuple."""
    items = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [x for x in items if x not in allowed]
    if unknown or not items:
        raise InputError(f"unknown {', '.join(unknown) or repr(text)}; choose from {', '.join(allowed)}")
    return items
