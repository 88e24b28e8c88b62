"""Capacity with a range: the highest rate meeting the SLO target, and its 90% interval.

N replications; replication i draws the step model's error and the step scatter from seed + i at every
rate, so each replication's SLO attainment against rate is one curve (monotone-ish, as the plain run's
is). At a probed rate the N attainments give three curves: their median (the central value) and their
5th and 95th percentiles (the lower and upper bounds of the 90% interval). The plain search
(search.search_capacity: bracket by doubling or halving from the same start, then bisect on a log
scale to the same tolerance, within the same limits) runs on each curve:

  central       where the median attainment crosses the target;
  interval low  where the lower bound crosses it (the 5th percentile falls below the target first);
  interval high where the upper bound crosses it.

A rate is simulated once for all N replications and all three searches (a cache by rate), and the three
searches start from the same rate, so they share the probes of their bracketing. A curve that does not
cross the target within the searched limits is reported as beyond them (above the cap: it still meets
the target there; below the floor: it misses even there), never as a number.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from stepcal.core.measured_run import RunStats
from stepcal.core.metrics import clean_json
from stepcal.experiments.capacity.search import MAX_BRACKET_STEPS, CapacityResult, search_capacity
from stepcal.experiments.replications import scatter_text
from stepcal.simulator.ranges import INTERVAL, ranges_block

CURVES = (("median", 50.0), ("low", INTERVAL[0]), ("high", INTERVAL[1]))   # name, percentile of the replications
PROBE_FIGURES = ("slo_attainment", "goodput_rps", "throughput_rps", "ttft_p99_ms", "tpot_p99_ms")


@dataclass
class ReplicatedRates:
    """`replicated(rate_rps)` → the N replications' summaries at that rate (cached by rate), from
    `run(seeds, rate_rps)`, e.g. experiments.replications.ReplicaPool.map with keep_summary."""
    run: Callable[[Sequence[int], float], list[dict]]
    seeds: tuple[int, ...]
    cache: dict[float, list[dict]] = field(default_factory=dict)

    def __call__(self, rate_rps: float) -> list[dict]:
        if rate_rps not in self.cache:
            self.cache[rate_rps] = self.run(self.seeds, rate_rps)
        return self.cache[rate_rps]

    @property
    def num_simulations(self) -> int:
        return len(self.cache) * len(self.seeds)


@dataclass(frozen=True)
class CurveCapacity:
    """Where one curve (a percentile of the replications' attainments) crosses the target."""
    name: str
    percentile: float
    max_rate_rps: float | None     # highest rate probed that meets the target; None when beyond
    upper_rate_rps: float | None   # lowest rate probed that misses it
    beyond: str | None             # "above": meets the target up to the cap; "below": misses it down to the floor
    limit_rps: float | None        # the cap or the floor, when beyond

    @classmethod
    def of(cls, name: str, percentile: float, result: CapacityResult, min_rps: float, max_rps: float) -> CurveCapacity:
        if result.max_rate_rps is None:
            return cls(name, percentile, None, result.upper_rate_rps, "below", min_rps)
        if result.upper_rate_rps is None:
            return cls(name, percentile, None, None, "above", max_rps)
        return cls(name, percentile, result.max_rate_rps, result.upper_rate_rps, None, None)

    def to_dict(self) -> dict:
        return {"percentile": self.percentile, "max_rate_rps": self.max_rate_rps,
                "upper_rate_rps": self.upper_rate_rps, "beyond": self.beyond, "limit_rps": self.limit_rps}


def search_limits(start_rps: float, min_rps: float | None, max_rps: float | None) -> tuple[float, float]:
    """The floor and cap search_capacity uses (start / 2^20 and start x 2^20 unless given)."""
    return (min_rps if min_rps is not None else start_rps / 2**MAX_BRACKET_STEPS,
            max_rps if max_rps is not None else start_rps * 2**MAX_BRACKET_STEPS)


def attainment_curve(replicated: Callable[[float], list[dict]], percentile: float) -> Callable[[float], dict]:
    """rate → {"slo_attainment": that percentile of the replications' attainments}: what search_capacity reads."""
    def evaluate(rate_rps: float) -> dict:
        attainments = [s.get("slo_attainment") for s in replicated(rate_rps)]
        if any(a is None for a in attainments):
            return {"slo_attainment": None}    # search_capacity says the SLO is missing
        return {"slo_attainment": float(np.percentile(np.asarray(attainments, dtype=np.float64), percentile))}
    return evaluate


def search_capacity_ranges(replicated: ReplicatedRates, *, start_rps: float, target_attainment: float,
                           tolerance: float, min_rps: float | None = None,
                           max_rps: float | None = None) -> dict[str, CurveCapacity]:
    """The crossing of each of CURVES (median, low, high), searched as the plain capacity is."""
    floor, cap = search_limits(start_rps, min_rps, max_rps)
    curves = {}
    for name, percentile in CURVES:
        result = search_capacity(attainment_curve(replicated, percentile), start_rps=start_rps,
                                 target_attainment=target_attainment, tolerance=tolerance, min_rps=floor, max_rps=cap)
        curves[name] = CurveCapacity.of(name, percentile, result, floor, cap)
    return curves


def probe_figures(summary: dict) -> dict:
    stats = RunStats.from_summary(summary)
    return {"slo_attainment": summary.get("slo_attainment"), "goodput_rps": summary.get("goodput_rps"),
            "throughput_rps": stats.throughput_rps, "ttft_p99_ms": stats.stat("ttft_ms", "p99"),
            "tpot_p99_ms": stats.stat("tpot_ms", "p99")}


def ranges_record(curves: dict[str, CurveCapacity], replicated: ReplicatedRates, settings: dict) -> dict:
    """capacity.json's `ranges` block: `settings` (experiments.replications.replication_settings),
    `max_rate_rps` as {median, low, high} (None where a curve is beyond
    the searched range; `curves` says which side), each curve's search, and every rate probed with
    the median and 90% interval of its figures over the replications."""
    probes = [{"rate_rps": rate, **ranges_block([probe_figures(s) for s in summaries])}
              for rate, summaries in sorted(replicated.cache.items())]
    return clean_json({**settings, "num_replications": len(replicated.seeds),
                       "max_rate_rps": {name: c.max_rate_rps for name, c in curves.items()},
                       "curves": {name: c.to_dict() for name, c in curves.items()},
                       "num_simulations": replicated.num_simulations, "probes": probes})


def rate_text(curve: dict, unit: str = "") -> str:
    """A curve's crossing for people: the rate, or which limit of the searched range it lies beyond."""
    if curve["beyond"] is None:
        return f"{curve['max_rate_rps']:.3g}{unit}"
    limit = "cap" if curve["beyond"] == "above" else "floor"
    return f"beyond the search {limit} of {curve['limit_rps']:.3g} req/s"


def format_ranges(block: dict, plain_num_simulations: int, plain_wall_s: float) -> str:
    """'capacity 6.2 req/s (90% interval 5.7-6.6)', then what was drawn and what it cost against the plain search."""
    curves = block["curves"]
    low, high = rate_text(curves["low"]), rate_text(curves["high"])
    joint = "-" if curves["low"]["beyond"] is None and curves["high"]["beyond"] is None else " to "
    drawn = ", ".join(block["drawn_terms"]) or "no term spread"
    ratio = block["wall_s"] / plain_wall_s if plain_wall_s > 0 else math.nan
    return (f"capacity {rate_text(curves['median'], ' req/s')} (90% interval {low}{joint}{high})\n"
            f"  over {block['num_replications']} replications (drawn: {drawn}; {scatter_text(block)}): "
            f"{block['num_simulations']} simulations in {block['wall_s']:.1f} s on "
            f"{block['workers']} worker{'s' if block['workers'] != 1 else ''}; the plain search: "
            f"{plain_num_simulations} in {plain_wall_s:.1f} s ({ratio:.0f}x the wall time)")
