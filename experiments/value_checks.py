"""Checks of single values that a flag and a config key share: each is `check(value, what)`, returning
the value as the library takes it or raising InputError with `what` (the flag, or the file and the key)
as its subject. commands/argtypes.py wraps them as argparse types; experiments.sweep.config runs them
on a sweep config's keys, so that a key and its flag cannot drift apart.

Imports only core.bounds (math and core.errors): `stepcal --help` loads this module and stays instant.
"""
from __future__ import annotations

from collections.abc import Callable

from stepcal.core import bounds
from stepcal.core.errors import InputError

# The keys of simulator.router.ROUTERS, listed here so `--help` imports no numpy (a test checks they agree).
ROUTER_NAMES = ("round-robin", "least-tokens")


def positive(value, what: str = "the value") -> float:
    """A finite number > 0."""
    return bounds.number(value, what)


def non_negative(value, what: str = "the value") -> float:
    """A finite number >= 0."""
    return bounds.number(value, what, strict=False)


def time_ms(value, what: str = "the value") -> float:
    """A duration in ms: finite, > 0, at most an hour (more is a unit mistake)."""
    return bounds.number(value, what, maximum=bounds.MAX_TIME_MS)


def time_ms_or_zero(value, what: str = "the value") -> float:
    """A duration in ms that may be zero (an overhead, a latency): finite, at most an hour."""
    return bounds.number(value, what, strict=False, maximum=bounds.MAX_TIME_MS)


def fraction(value, what: str = "the value") -> float:
    """A share in (0, 1]."""
    return bounds.number(value, what, maximum=1.0)


def scatter_cv(value, what: str = "the value") -> float:
    """A coefficient of variation of step time: finite, >= 0, at most 1."""
    return bounds.number(value, what, strict=False, maximum=1.0)


def correlation(value, what: str = "the value") -> float:
    """A lag-one autocorrelation in (-1, 1)."""
    x = bounds.number(value, what, minimum=-1.0, maximum=1.0)
    if x >= 1.0:
        raise InputError(f"{what} must be below 1, got {value}")
    return x


def seed(value, what: str = "the seed") -> int:
    return bounds.count(value, what, minimum=0, maximum=bounds.MAX_SEED)


def seconds(value, what: str = "the value") -> float:
    """A trace duration in s: finite, > 0, at most a year."""
    return bounds.number(value, what, maximum=bounds.MAX_ARRIVAL_S)


def rate(value, what: str = "the rate") -> float:
    """A request rate in requests per second: finite, > 0."""
    return bounds.number(value, what, maximum=bounds.MAX_RATE_RPS)


def count(minimum: int = 1, maximum: int = bounds.MAX_REQUESTS) -> Callable:
    """The check of a whole number in [minimum, maximum]."""
    def whole(value, what: str = "the value") -> int:
        return bounds.count(value, what, minimum=minimum, maximum=maximum)
    return whole


# Counts that a flag and a config key share: one object, one range.
num_requests = count()
replicas = count(1, bounds.MAX_REPLICAS)
scheduler_size = count(1, bounds.MAX_TOKENS_PER_REQUEST)   # --max-num-seqs, --max-batched-tokens, --chunk-size
block_size = count(1, 65_536)                               # tokens per KV block
kv_blocks = count(1, 2**40)
num_replications = count(0, 10_000)                         # --ranges
