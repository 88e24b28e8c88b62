"""Reproduce the seeds' headline scheduler comparisons, measured on the engine and simulated.

    .venv/bin/python studies/compare_schedulers.py --tables runs/quickstart/tables [--out FILE.md]

One workload (Poisson, log-normal lengths, long prompts so that prefill interferes with decodes)
is served for real by the torch engine under static, continuous, sarathi and slo, and simulated
with the same settings and the given step model; latencies at the trace's rate, throughput from
the same requests all arriving at once (`--saturation-rate`: below saturation every scheduler
serves what arrives, and the throughputs only echo the arrival rate). Prints a markdown table of
throughput, mean and P99 latency, P99 TTFT and TPOT, and the comparisons the literature reports:
static vs continuous batching (2-3x throughput; mean and P99 latency), chunked prefill vs none
(P99 TPOT/TTFT down 30-50%), and the SLO-aware policy vs plain chunked prefill. A share of the
requests (`--latency-sensitive`) carries a tight TTFT SLO, the rest a loose one: the SLO-aware
policy ranks the queue by them (without SLOs it schedules as sarathi does), the others ignore them,
and the SLO attainment row counts the requests that met theirs.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SCHEDULERS = ("static", "continuous", "sarathi", "slo")
ROWS = (("throughput_rps", None, "throughput at saturation req/s"), ("slo_attainment", None, "TTFT SLO attainment"),
        ("e2e_ms", "mean", "E2E mean ms"), ("e2e_ms", "p99", "E2E P99 ms"), ("ttft_ms", "p99", "TTFT P99 ms"), ("tpot_ms", "p99", "TPOT P99 ms"))


def stepcal(*args) -> None:
    subprocess.run([sys.executable, "-m", "stepcal.experiments.cli", *map(str, args)], check=True)


def value(results: dict, kind: str, metric: str, stat: str | None) -> float:
    """A scheduler's figure, measured or simulated: throughput from the saturation run, the rest at the trace's rate."""
    if metric == "throughput_rps":
        return results[f"{kind}_saturation"][metric]
    if stat is None:
        return results[kind][metric]
    return results[kind][metric][stat]


def write_slo_trace(args, path: Path) -> Path:
    """The workload with a TTFT SLO per request: tight for a random share, loose for the rest."""
    import dataclasses

    import numpy as np

    from stepcal.core.workload import load_workload, write_trace
    trace = load_workload(args.trace)
    tight = np.random.default_rng(1).random(len(trace)) < args.latency_sensitive
    slo = np.where(tight, args.ls_ttft_ms, args.tp_ttft_ms).astype(np.float64)
    return write_trace(dataclasses.replace(trace, slo_ttft_ms=slo), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", required=True, help="step model for the simulated side (e.g. quickstart tables)")
    parser.add_argument("--trace", default="poisson:rate=10,n=150,prompt=lognormal:512:0.6,output=lognormal:64:0.8,seed=1")
    parser.add_argument("--chunk-size", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--saturation-rate", type=float, default=1000.0,
                        help="arrival rate (req/s) of the throughput runs: far above capacity (default 1000)")
    parser.add_argument("--out", help="also write the markdown here")
    parser.add_argument("--latency-sensitive", type=float, default=0.3,
                        help="share of requests with a tight TTFT SLO (default 0.3)")
    parser.add_argument("--ls-ttft-ms", type=float, default=250.0, help="their TTFT SLO (default 250 ms)")
    parser.add_argument("--tp-ttft-ms", type=float, default=2500.0, help="the others' TTFT SLO (default 2500 ms)")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_slo_trace(args, Path(tmp) / "trace.parquet")
        for s in SCHEDULERS:
            flags = ["--scheduler", s, "--chunk-size", args.chunk_size, "--max-num-seqs", args.max_num_seqs]
            results[s] = {}
            for suffix, rate in (("", []), ("_saturation", ["--rate", args.saturation_rate])):
                measured, simulated = Path(tmp) / f"m_{s}{suffix}", Path(tmp) / f"s_{s}{suffix}"
                stepcal("measure", "--trace", trace, *rate, *flags, "--quiet", "--out", measured)
                stepcal("simulate", "--trace", trace, *rate, *flags, "--step-model", args.tables, "--quiet",
                        "--out", simulated)
                results[s]["measured" + suffix] = json.loads((measured / "summary.json").read_text())
                results[s]["simulated" + suffix] = json.loads((simulated / "summary.json").read_text())
    lines = [f"workload `{args.trace}`, {args.latency_sensitive:.0%} of requests with a {args.ls_ttft_ms:g} ms TTFT SLO, "
             f"the rest {args.tp_ttft_ms:g} ms (throughput: the same requests at {args.saturation_rate:g} req/s), "
             f"chunk {args.chunk_size}, max {args.max_num_seqs} seqs; "
             f"measured = torch engine (tiny, CPU), simulated = `{args.tables}`", "",
             "| metric | " + " | ".join(f"{s} measured | {s} simulated" for s in SCHEDULERS) + " |",
             "|---|" + "---|" * (2 * len(SCHEDULERS))]
    for metric, stat, label in ROWS:
        cells = [f"{value(results[s], k, metric, stat):.3g}" for s in SCHEDULERS for k in ("measured", "simulated")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| comparison | measured | simulated | literature |", "|---|---|---|---|"]
    comparisons = (
        ("continuous / static throughput", "continuous", "static", "throughput_rps", None, "2-3x"),
        ("continuous / static E2E mean", "continuous", "static", "e2e_ms", "mean", "< 1x"),
        ("continuous / static E2E P99", "continuous", "static", "e2e_ms", "p99", "< 1x"),
        ("sarathi / continuous P99 TPOT", "sarathi", "continuous", "tpot_ms", "p99", "0.5-0.7x"),
        ("sarathi / continuous P99 TTFT", "sarathi", "continuous", "ttft_ms", "p99", "0.5-0.7x (Sarathi-Serve)"),
        ("slo / sarathi TTFT SLO attainment", "slo", "sarathi", "slo_attainment", None, "> 1x"),
        ("slo / sarathi P99 TTFT", "slo", "sarathi", "ttft_ms", "p99", "< 1x"),
        ("slo / sarathi P99 TPOT", "slo", "sarathi", "tpot_ms", "p99", "about 1x"),
    )
    for label, a, b, metric, stat, lit in comparisons:
        ratio = {k: value(results[a], k, metric, stat) / value(results[b], k, metric, stat)
                 for k in ("measured", "simulated")}
        lines.append(f"| {label} | {ratio['measured']:.2f}x | {ratio['simulated']:.2f}x | {lit} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
