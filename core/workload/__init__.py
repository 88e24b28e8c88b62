"""Workloads: read trace files, generate synthetic ones, reshape them, and summarise them.

`load_workload` is the entry point for commands; the rest is for tools and tests.
"""
from stepcal.core.workload.generators import (
    Empirical,
    Fixed,
    Gamma,
    LogNormal,
    OnOff,
    Poisson,
    Uniform,
    WorkloadSpec,
    arrivals_s,
    generate,
)
from stepcal.core.workload.load import load_workload
from stepcal.core.workload.prefix_stats import lru_prefix_hits, unbounded_prefix_hits
from stepcal.core.workload.readers import TRACE_FORMATS, read_trace
from stepcal.core.workload.spec import parse_spec
from stepcal.core.workload.stats import trace_stats
from stepcal.core.workload.transforms import cut, mean_rate_rps, rescale_rate
from stepcal.core.workload.writer import write_trace

__all__ = [
    "TRACE_FORMATS",
    "Empirical",
    "Fixed",
    "Gamma",
    "LogNormal",
    "OnOff",
    "Poisson",
    "Uniform",
    "WorkloadSpec",
    "arrivals_s",
    "cut",
    "generate",
    "load_workload",
    "lru_prefix_hits",
    "mean_rate_rps",
    "parse_spec",
    "read_trace",
    "rescale_rate",
    "trace_stats",
    "unbounded_prefix_hits",
    "write_trace",
]
