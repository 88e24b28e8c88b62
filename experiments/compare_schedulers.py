"""Reproduce the seeds' headline scheduler comparisons, measured on the engine and simulated.

    .venv/bin/python experiments/compare_schedulers.py --tables runs/quickstart/tables [--out FILE.md]

One workload (Poisson, log-normal lengths, long prompts so that prefill interferes with decodes)
is served for real by the torch engine under static, continuous, sarathi and slo, and simulated
with the same settings and the given step model. Prints a markdown table of throughput, mean and
P99 latency, P99 TTFT and TPOT, and the three comparisons the literature reports:
static vs continuous batching (2-3x throughput), chunked prefill vs none (P99 TPOT/TTFT down
30-50%), and the SLO-aware policy vs plain chunked prefill.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SCHEDULERS = ("static", "continuous", "sarathi", "slo")
ROWS = (("throughput_rps", None, "throughput req/s"), ("e2e_ms", "mean", "E2E mean ms"),
        ("e2e_ms", "p99", "E2E P99 ms"), ("ttft_ms", "p99", "TTFT P99 ms"), ("tpot_ms", "p99", "TPOT P99 ms"))


def stepcal(*args) -> None:
    subprocess.run([sys.executable, "-m", "experiments.cli", *map(str, args)], check=True)


def value(summary: dict, metric: str, stat: str | None) -> float:
    return summary[metric] if stat is None else summary[metric][stat]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", required=True, help="step model for the simulated side (e.g. quickstart tables)")
    parser.add_argument("--trace", default="poisson:rate=6,n=150,prompt=lognormal:512:0.6,output=lognormal:64:0.8,seed=1")
    parser.add_argument("--chunk-size", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--out", help="also write the markdown here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for s in SCHEDULERS:
            flags = ["--scheduler", s, "--chunk-size", args.chunk_size, "--max-num-seqs", args.max_num_seqs]
            measured, simulated = Path(tmp) / f"m_{s}", Path(tmp) / f"s_{s}"
            stepcal("measure", "--trace", args.trace, *flags, "--quiet", "--out", measured)
            stepcal("simulate", "--trace", args.trace, *flags, "--step-model", args.tables, "--quiet", "--out", simulated)
            results[s] = {"measured": json.loads((measured / "summary.json").read_text()),
                          "simulated": json.loads((simulated / "summary.json").read_text())}
    lines = [f"workload `{args.trace}`, chunk {args.chunk_size}, max {args.max_num_seqs} seqs; "
             f"measured = torch engine (tiny, CPU), simulated = `{args.tables}`", "",
             "| metric | " + " | ".join(f"{s} measured | {s} simulated" for s in SCHEDULERS) + " |",
             "|---|" + "---|" * (2 * len(SCHEDULERS))]
    for metric, stat, label in ROWS:
        cells = [f"{value(results[s][k], metric, stat):.3g}" for s in SCHEDULERS for k in ("measured", "simulated")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| comparison | measured | simulated | literature |", "|---|---|---|---|"]
    comparisons = (
        ("continuous / static throughput", "continuous", "static", "throughput_rps", None, "2-3x"),
        ("sarathi / continuous P99 TPOT", "sarathi", "continuous", "tpot_ms", "p99", "0.5-0.7x"),
        ("sarathi / continuous P99 TTFT", "sarathi", "continuous", "ttft_ms", "p99", "0.5-0.7x (Sarathi-Serve)"),
        ("slo / sarathi P99 TTFT", "slo", "sarathi", "ttft_ms", "p99", "< 1x"),
        ("slo / sarathi P99 TPOT", "slo", "sarathi", "tpot_ms", "p99", "about 1x"),
    )
    for label, a, b, metric, stat, lit in comparisons:
        ratio = {k: value(results[a][k], metric, stat) / value(results[b][k], metric, stat)
                 for k in ("measured", "simulated")}
        lines.append(f"| {label} | {ratio['measured']:.2f}x | {ratio['simulated']:.2f}x | {lit} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
