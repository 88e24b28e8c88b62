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
MIN_RATE_RPS = 1.0 / MAX_ARRIVAL_S         # one request a year: slower puts the 2nd arrival past a year
MAX_TIME_MS = 3_600_000.0                  # an hour for one step or one SLO: larger is a unit mistake
# Gamma arrivals have shape 1 / cv^2. Below cv 0.01 (shape 10^4) the gaps are already evenly spaced to
# 1%, and cv -> 0 overflows the shape; above cv 10 (shape 0.01) almost every gap rounds to 0 and a few
# hold the whole duration, so a duration= spec would draw chunk after chunk of near-zero gaps.
MIN_GAMMA_CV = 0.01
MAX_GAMMA_CV = 10.0
# A lognormal length of mean M and sigma s has median M * exp(-s^2 / 2): at s = 3 that is M / 90, and
# past it the clamp to [1, MAX] swallows most draws (s = 1000 makes every length 1 token), so the
# lengths no longer have the mean asked for. Measured prompt/output lengths have s of about 0.5-2.
MAX_LOGNORMAL_SIGMA = 3.0
MAX_TURNS_PER_SESSION = 10_000             # a chat far longer than any logged; sessions are Python loops
# Prefix hash ids a generated trace may hold in all (one per 16-token block of every prompt): each is a
# Python int in a per-request list (~36 bytes), so 50M of them is ~2 GB; long sessions with many
# turns grow it quadratically (turn k repeats the ids of turns 0..k-1).
MAX_PREFIX_IDS = 50_000_000


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
