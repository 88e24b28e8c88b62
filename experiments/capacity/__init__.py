"""Capacity planning: the highest request rate a deployment serves within its SLOs (stepcal capacity)."""
from stepcal.experiments.capacity.evaluate import RateEvaluator, aggregated, disaggregated
from stepcal.experiments.capacity.report import capacity_record, format_record, probe_row
from stepcal.experiments.capacity.search import (
    CHECK_ABOVE,
    DEFAULT_TOLERANCE,
    CapacityResult,
    RateProbe,
    check_above,
    search_capacity,
)

__all__ = [
    "CHECK_ABOVE",
    "DEFAULT_TOLERANCE",
    "CapacityResult",
    "RateEvaluator",
    "RateProbe",
    "aggregated",
    "capacity_record",
    "check_above",
    "disaggregated",
    "format_record",
    "probe_row",
    "search_capacity",
]
