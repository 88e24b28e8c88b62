"""argparse `type=` functions: every numeric flag is checked when the command line is parsed, so a
bad value is one line naming the flag (argparse adds it) before any work starts.

Imports only core.bounds (math and core.errors): `stepcal --help` stays instant.
"""
from __future__ import annotations

import argparse

from stepcal.core import bounds
from stepcal.core.errors import InputError


def _checked(check):
    def convert(text: str):
        try:
            return check(text)
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = check.__name__      # argparse names the type in some messages
    return convert


@_checked
def positive(text: str) -> float:
    """A finite number > 0."""
    return bounds.number(text, "the value")


@_checked
def non_negative(text: str) -> float:
    """A finite number >= 0."""
    return bounds.number(text, "the value", strict=False)


@_checked
def time_ms(text: str) -> float:
    """A duration in ms: finite, > 0, at most an hour (more is a unit mistake)."""
    return bounds.number(text, "the value", maximum=bounds.MAX_TIME_MS)


@_checked
def fraction(text: str) -> float:
    """A share in (0, 1]."""
    return bounds.number(text, "the value", maximum=1.0)


@_checked
def scatter_cv(text: str) -> float:
    """A coefficient of variation of step time: finite, >= 0, at most 1."""
    return bounds.number(text, "the value", strict=False, maximum=1.0)


@_checked
def correlation(text: str) -> float:
    """A lag-one autocorrelation in (-1, 1)."""
    x = bounds.number(text, "the value", minimum=-1.0, maximum=1.0)
    if x >= 1.0:
        raise InputError(f"the value must be below 1, got {text}")
    return x


@_checked
def seed(text: str) -> int:
    return bounds.count(text, "the seed", minimum=0, maximum=bounds.MAX_SEED)


def count(minimum: int = 1, maximum: int = bounds.MAX_REQUESTS):
    """A whole number in [minimum, maximum]."""
    @_checked
    def whole(text: str) -> int:
        return bounds.count(text, "the value", minimum=minimum, maximum=maximum)
    return whole


@_checked
def time_ms_or_zero(text: str) -> float:
    """A duration in ms that may be zero (an overhead, a latency): finite, at most an hour."""
    return bounds.number(text, "the value", strict=False, maximum=bounds.MAX_TIME_MS)


@_checked
def seconds(text: str) -> float:
    """A trace duration in s: finite, > 0, at most a year."""
    return bounds.number(text, "the value", maximum=bounds.MAX_ARRIVAL_S)


@_checked
def rate(text: str) -> float:
    """A request rate in requests per second: finite, > 0."""
    return bounds.number(text, "the rate", maximum=bounds.MAX_RATE_RPS)


@_checked
def device(text: str) -> str:
    """cpu, cuda or cuda:N: the devices the torch model and the profiler run on."""
    name, _, index = text.partition(":")
    if (name == "cpu" and not index) or (name == "cuda" and (not _ or index.isdigit())):
        return text
    raise InputError(f"unknown device {text!r}; use cpu, cuda or cuda:N")


def names(allowed: tuple[str, ...]):
    """A comma-separated list of names from `allowed` (e.g. schedulers), as a tuple."""
    @_checked
    def listed(text: str) -> tuple[str, ...]:
        return bounds.choices(text, allowed)
    return listed
