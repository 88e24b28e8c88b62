"""argparse `type=` functions: every numeric flag is checked when the command line is parsed, so a
bad value is one line naming the flag (argparse adds it) before any work starts.

The numeric ones wrap experiments.value_checks, whose checks a sweep config's keys run too.
Imports only core.bounds and value_checks (math and core.errors): `stepcal --help` stays instant.
"""
from __future__ import annotations

import argparse

from stepcal.core import bounds
from stepcal.core.errors import InputError
from stepcal.experiments import value_checks


def _checked(check):
    def convert(text: str):
        try:
            return check(text)
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = check.__name__      # argparse names the type in some messages
    return convert


positive = _checked(value_checks.positive)
non_negative = _checked(value_checks.non_negative)
time_ms = _checked(value_checks.time_ms)
time_ms_or_zero = _checked(value_checks.time_ms_or_zero)
fraction = _checked(value_checks.fraction)
scatter_cv = _checked(value_checks.scatter_cv)
correlation = _checked(value_checks.correlation)
seed = _checked(value_checks.seed)
seconds = _checked(value_checks.seconds)
rate = _checked(value_checks.rate)
num_requests = _checked(value_checks.num_requests)
replicas = _checked(value_checks.replicas)
scheduler_size = _checked(value_checks.scheduler_size)
block_size = _checked(value_checks.block_size)
kv_blocks = _checked(value_checks.kv_blocks)
num_replications = _checked(value_checks.num_replications)


def count(minimum: int = 1, maximum: int = bounds.MAX_REQUESTS):
    """A whole number in [minimum, maximum]."""
    return _checked(value_checks.count(minimum, maximum))


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
