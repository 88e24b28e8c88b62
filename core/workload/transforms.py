"""Reshape a trace in time: change its mean rate, or keep a prefix of it."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from stepcal.core.errors import InputError
from stepcal.core.trace import Trace


def mean_rate_rps(trace: Trace) -> float | None:
    """Requests per second between the first and the last arrival: 1 / mean inter-arrival time.

    None when it is undefined (one request, or all arrive at the same instant).
    """
    span_s = float(trace.arrival_s[-1] - trace.arrival_s[0])
    return (len(trace) - 1) / span_s if len(trace) > 1 and span_s > 0 else None


def rescale_rate(trace: Trace, rate_rps: float) -> Trace:
    """Scale every inter-arrival time by one factor so that the mean rate becomes `rate_rps`.

    Order, relative gaps (so burstiness) and the first arrival time are kept.
    """
    if not rate_rps > 0 or not np.isfinite(rate_rps):
        raise InputError(f"--rate must be a positive number of requests per second, got {rate_rps!r}")
    current = mean_rate_rps(trace)
    if current is None:
        raise InputError(f"{trace.source}: cannot rescale the rate of a trace whose requests all "
                         f"arrive at one instant")
    first_s = trace.arrival_s[0]
    arrival = first_s + (trace.arrival_s - first_s) * (current / rate_rps)
    return replace(trace, arrival_s=arrival, warnings=list(trace.warnings))


def cut(trace: Trace, num_requests: int | None = None, duration_s: float | None = None) -> Trace:
    """The first `num_requests` requests, and/or those arriving within `duration_s` of the first."""
    keep = np.ones(len(trace), dtype=bool)
    if num_requests is not None:
        if not isinstance(num_requests, (int, np.integer)) or num_requests < 1:
            raise InputError(f"--num-requests must be a positive integer, got {num_requests!r}")
        keep[num_requests:] = False
    if duration_s is not None:
        if not duration_s > 0:
            raise InputError(f"--duration must be a positive number of seconds, got {duration_s!r}")
        keep &= trace.arrival_s < trace.arrival_s[0] + duration_s
    return trace if keep.all() else trace.take(keep)
