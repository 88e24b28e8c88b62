"""SLO-constrained capacity search: the highest request rate whose SLO attainment meets a target.

The search brackets, then bisects, on a log scale:

1. probe the start rate; while it is feasible, double it (while infeasible, halve it) until the
   answer is bracketed by a feasible rate `lo` and an infeasible rate `hi`;
2. probe the geometric mean of lo and hi until hi ≤ lo · (1 + tolerance).

The answer is `lo`, the highest feasible rate probed: the true boundary lies in [lo, hi), so it is
at most `tolerance` (relative) above the answer. This assumes attainment does not rise with rate,
which holds for a fixed trace whose arrivals are compressed (queues only grow); the probes are
kept so that a reader can see whether it held. The search is deterministic: every probe of a given
rate simulates the same rescaled trace.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from stepcal.core.errors import InputError

DEFAULT_TOLERANCE = 0.02
CHECK_ABOVE = 0.05       # the answer is checked by simulating this much (relative) above it
MAX_BRACKET_STEPS = 20    # 2^20: from the start rate to a million times more or less


@dataclass(frozen=True)
class RateProbe:
    """One simulation at one rate."""
    rate_rps: float
    slo_attainment: float
    feasible: bool
    summary: dict


@dataclass
class CapacityResult:
    """What the search found; `max_rate_rps` is None when even the lowest rate probed missed the target."""
    max_rate_rps: float | None       # highest feasible rate probed
    upper_rate_rps: float | None     # lowest infeasible rate probed; None if none failed up to the cap
    target_attainment: float
    tolerance: float
    probes: list[RateProbe] = field(default_factory=list)

    @property
    def best(self) -> RateProbe | None:
        return self.probe_at(self.max_rate_rps)

    def probe_at(self, rate_rps: float | None) -> RateProbe | None:
        return next((p for p in self.probes if p.rate_rps == rate_rps), None)

    @property
    def bracketed(self) -> bool:
        return self.max_rate_rps is not None and self.upper_rate_rps is not None


def search_capacity(evaluate: Callable[[float], dict], *, start_rps: float, target_attainment: float,
                    tolerance: float = DEFAULT_TOLERANCE, min_rps: float | None = None,
                    max_rps: float | None = None) -> CapacityResult:
    """Find the highest rate at which `evaluate(rate)["slo_attainment"]` ≥ `target_attainment`.

    `evaluate` maps a rate (requests/s) to a run summary with an `slo_attainment` key. The search
    never probes below `min_rps` or above `max_rps` (default: start / 2^20 and start · 2^20).
    """
    _check_args(start_rps, target_attainment, tolerance, min_rps, max_rps)
    min_rps = min_rps if min_rps is not None else start_rps / 2**MAX_BRACKET_STEPS
    max_rps = max_rps if max_rps is not None else start_rps * 2**MAX_BRACKET_STEPS
    result = CapacityResult(None, None, target_attainment, tolerance)

    def probe(rate: float) -> bool:
        summary = evaluate(rate)
        attainment = summary.get("slo_attainment")
        if attainment is None:
            raise InputError("capacity search needs an SLO: give --slo-ttft-ms and/or --slo-tpot-ms")
        feasible = attainment >= target_attainment
        result.probes.append(RateProbe(rate, float(attainment), feasible, summary))
        return feasible

    lo, hi = _bracket(probe, min(max(start_rps, min_rps), max_rps), min_rps, max_rps)
    while lo is not None and hi is not None and hi > lo * (1 + tolerance):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if probe(mid) else (lo, mid)
    result.max_rate_rps, result.upper_rate_rps = lo, hi
    return result


def _bracket(probe: Callable[[float], bool], rate: float, min_rps: float, max_rps: float):
    """(lo, hi): a feasible and an infeasible rate, either None when the limits were hit first."""
    if probe(rate):
        lo = rate
        while lo < max_rps:
            rate = min(lo * 2, max_rps)
            if not probe(rate):
                return lo, rate
            lo = rate
        return lo, None
    hi = rate
    while hi > min_rps:
        rate = max(hi / 2, min_rps)
        if probe(rate):
            return rate, hi
        hi = rate
    return None, hi


def _check_args(start_rps, target, tolerance, min_rps, max_rps) -> None:
    if not (start_rps > 0 and math.isfinite(start_rps)):
        raise InputError(f"--rate-start must be a positive number of requests per second, got {start_rps!r}")
    if not 0 < target <= 1:
        raise InputError(f"--attainment must be in (0, 1], got {target!r}")
    if not 0 < tolerance < 1:
        raise InputError(f"--tolerance must be in (0, 1) (relative, e.g. 0.02), got {tolerance!r}")
    if min_rps is not None and not min_rps > 0:
        raise InputError(f"--rate-min must be positive, got {min_rps!r}")
    if min_rps is not None and max_rps is not None and max_rps < min_rps:
        raise InputError(f"--rate-max ({max_rps}) must not be below --rate-min ({min_rps})")


def check_above(evaluate: Callable[[float], dict], result: CapacityResult,
                above_by: float = CHECK_ABOVE) -> RateProbe | None:
    """Simulate `above_by` (relative) above the answer: the target should fail there."""
    if result.max_rate_rps is None:
        return None
    rate = result.max_rate_rps * (1 + above_by)
    summary = evaluate(rate)
    attainment = float(summary["slo_attainment"])
    return RateProbe(rate, attainment, attainment >= result.target_attainment, summary)
