"""Summary figures of a trace: size, rate, burstiness, length percentiles and prefix reuse."""
from __future__ import annotations

import numpy as np

from stepcal.core.trace import Trace
from stepcal.core.workload.prefix_stats import lru_prefix_hits, unbounded_prefix_hits
from stepcal.core.workload.transforms import mean_rate_rps

LENGTH_STATS = ("mean", "p50", "p90", "p99", "max")


def trace_stats(trace: Trace, cache_tokens: int | None = None) -> dict:
    """A flat dict of plain Python numbers (JSON-ready); None where a figure is undefined.

    burstiness_cv is the coefficient of variation of inter-arrival times (1 for Poisson).
    prefix_hit_share is the share of prompt tokens an unbounded prefix cache would hit and
    prefix_hit_requests the number of requests with any hit (unbounded_prefix_hits); both None
    when the trace carries no prefix hash ids. With cache_tokens, prefix_hit_share_lru is the share
    an LRU cache of that many tokens would hit (lru_prefix_hits).
    """
    gaps_s = np.diff(trace.arrival_s)
    mean_gap_s = float(gaps_s.mean()) if len(gaps_s) else 0.0
    stats = {
        "source": trace.source,
        "num_requests": len(trace),
        "duration_s": float(trace.arrival_s[-1] - trace.arrival_s[0]),
        "rate_rps": mean_rate_rps(trace),
        "burstiness_cv": float(gaps_s.std() / mean_gap_s) if mean_gap_s > 0 else None,
    }
    for name, column in (("num_prompt_tokens", trace.num_prompt_tokens),
                         ("num_output_tokens", trace.num_output_tokens)):
        stats.update({f"{name}_{stat}": value for stat, value in zip(LENGTH_STATS, _summary(column))})
    hits = unbounded_prefix_hits(trace)
    stats["prefix_block_tokens"] = trace.prefix_block_tokens
    stats["prefix_hit_share"] = None if hits is None else float(hits.sum() / trace.num_prompt_tokens.sum())
    stats["prefix_hit_requests"] = None if hits is None else int((hits > 0).sum())
    if cache_tokens is not None:
        lru = lru_prefix_hits(trace, cache_tokens)
        stats["cache_tokens"] = cache_tokens
        stats["prefix_hit_share_lru"] = None if lru is None else float(lru.sum() / trace.num_prompt_tokens.sum())
    return stats


def _summary(values: np.ndarray) -> list[float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return [float(values.mean()), float(p50), float(p90), float(p99), float(values.max())]
