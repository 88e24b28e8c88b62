"""What several commands print: a run summary's table."""
from __future__ import annotations


def format_summary(summary: dict) -> str:
    """The table `simulate`, `measure` and `import` print: counts, throughput, each metric's statistics."""
    from stepcal.core.measured_run import METRICS, RunStats  # lazy: loads numpy
    stats = RunStats.from_summary(summary)
    lines = [f"{summary['num_finished']}/{summary['num_requests']} requests finished in "
             f"{summary['duration_s']:.1f} s: {_num(summary['throughput_rps'])} req/s, "
             f"{_num(summary['output_tokens_per_s'])} output tok/s, {summary['num_preemptions']} preemptions",
             f"{'metric':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}"]
    for name in METRICS:
        lines.append(f"{name:<10}" + "".join(f"{_num(stats.stat(name, k)):>10}" for k in ("mean", "p50", "p90", "p99")))
    if summary.get("slo_attainment") is not None:
        lines.append(f"SLO attainment {summary['slo_attainment']:.3f}, goodput {_num(summary['goodput_rps'])} req/s")
    if summary.get("num_timeouts"):
        lines.append(f"{summary['num_timeouts']} requests timed out (not in the latencies)")
    if summary.get("prefix_hit_rate") is not None:
        lines.append(f"prefix cache: {100 * summary['prefix_hit_rate']:.1f}% of prompt tokens reused, "
                     f"{summary.get('num_prefix_evictions', 0)} cached blocks evicted")
    return "\n".join(lines)


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
