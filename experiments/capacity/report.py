"""capacity.json: the answer of a capacity search, its check 5% above, and every probe."""
from __future__ import annotations

from stepcal.core.measured_run import RunStats
from stepcal.core.metrics import clean_json
from stepcal.experiments.capacity.search import CapacityResult, RateProbe


def probe_row(probe: RateProbe) -> dict:
    """The figures of one probe that the plot and the table need."""
    s, stats = probe.summary, RunStats.from_summary(probe.summary)
    return {"rate_rps": probe.rate_rps, "slo_attainment": probe.slo_attainment, "feasible": probe.feasible,
            "goodput_rps": s.get("goodput_rps"), "throughput_rps": stats.throughput_rps,
            "ttft_p99_ms": stats.stat("ttft_ms", "p99"), "tpot_p99_ms": stats.stat("tpot_ms", "p99")}


def capacity_record(result: CapacityResult, check: RateProbe | None) -> dict:
    """One deployment's answer: max_rate_rps, goodput and metrics there, the check above it, the probes."""
    best = result.best
    record = {
        "max_rate_rps": result.max_rate_rps,
        "goodput_rps": best.summary.get("goodput_rps") if best else None,
        "slo_attainment": best.slo_attainment if best else None,
        "upper_rate_rps": result.upper_rate_rps,
        "target_attainment": result.target_attainment,
        "tolerance": result.tolerance,
        "bracketed": result.bracketed,
        "metrics": best.summary if best else None,
        "check_above": None,
        "probes": [probe_row(p) for p in sorted(result.probes, key=lambda p: p.rate_rps)],
    }
    if check is not None:
        record["check_above"] = {"rate_rps": check.rate_rps, "above_by": check.rate_rps / result.max_rate_rps - 1,
                                 "slo_attainment": check.slo_attainment, "feasible": check.feasible}
    return clean_json(record)


def format_record(label: str, record: dict) -> str:
    """A few lines for the terminal."""
    if record["max_rate_rps"] is None:
        return f"{label}: no rate down to the search floor meets the SLO attainment target"
    check = record["check_above"]
    bound = (f"boundary below {record['upper_rate_rps']:.4g} req/s (tolerance {record['tolerance']:.0%})"
             if record["upper_rate_rps"] is not None else "no failing rate found up to the search cap")
    lines = [f"{label}: max rate {record['max_rate_rps']:.4g} req/s, attainment {record['slo_attainment']:.3f}, "
             f"goodput {record['goodput_rps']:.4g} req/s; {bound}"]
    if check is not None:
        lines.append(f"  check at +{check['above_by']:.0%} ({check['rate_rps']:.4g} req/s): attainment "
                     f"{check['slo_attainment']:.3f} -> {'holds' if check['feasible'] else 'fails'}")
    return "\n".join(lines)
