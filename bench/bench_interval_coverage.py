"""Do the 90% intervals of `--ranges` hold 80-97% of the measured cells on the CPU, for tables fitted
from a profile alone, on a trace the fit never saw?

    .venv/bin/python bench/bench_interval_coverage.py --out /tmp/coverage [--campaigns 4]
        [--replications 20] [--grid quick] [--requests 80] [--workers 1]

Each campaign profiles the tiny model on the CPU (`stepcal profile --grid GRID`), fits it (`stepcal fit
--regressor rf`, no measured run among the inputs), serves a bursty generated trace twice (`stepcal
measure --repeats 2`, gamma arrivals of CV 3, its own seed: a workload the fit never saw) and
validates it with `--ranges`:

- after:  the tables as fitted, drawing every source the inputs carry (the fit's held-out error per
          term and region, the profile's repeat scatter and speed probes);
- before: the same tables with their held-out errors removed from meta.json and the scatter set to
          zero, which draws what `--ranges` drew before: the tables' spread alone.

It prints, per campaign and pooled, the TTFT / TPOT / E2E mean, P50, P90 and P99 cells inside the
interval (each measured repeat on its own) and their median width relative to the measured value,
then the sources each `after` drew. Stages whose output exists are skipped: run it again to resume.
Not run by CI (minutes of CPU per campaign).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
STATS = ("mean", "p50", "p90", "p99")
TRACE = "gamma:rate={rate},cv=3,n={requests},prompt=lognormal:192:0.8,output=lognormal:48:0.8"


def stepcal(*args: str) -> None:
    """Run one stepcal command from the repository root; stop the bench on failure."""
    code = subprocess.call([sys.executable, "-m", "stepcal", *args], cwd=Path(__file__).resolve().parents[1])
    if code != 0:
        raise SystemExit(f"stepcal {' '.join(args)} failed (exit {code})")


def once(target: Path, *args: str) -> Path:
    """stepcal ARGS --out TARGET unless TARGET exists (a finished earlier run)."""
    if not target.exists():
        stepcal(*args, "--out", str(target))
    return target


def strip_held_out_error(tables: Path, target: Path) -> Path:
    """A copy of `tables` without held_out_errors and model_error: what --ranges drew before them."""
    if not target.exists():
        shutil.copytree(tables, target)
        meta = json.loads((target / "meta.json").read_text())
        meta.pop("model_error", None)
        meta["held_out_errors"] = {}
        (target / "meta.json").write_text(json.dumps(meta, indent=1))
    return target


def cells(validation: Path) -> tuple[int, int, list[float], dict]:
    """(repeat cells inside, repeat cells, relative widths, sources) of one validation.json."""
    ranges = json.loads((validation / "validation.json").read_text())["ranges"]
    inside = total = 0
    widths = []
    for metric in METRICS:
        for stat in STATS:
            cell = ranges["coverage"]["cells"][metric][stat]
            hits = [hit for hit in cell["repeats_inside"] if hit is not None]
            inside, total = inside + sum(hits), total + len(hits)
            widths.append(cell["relative_width"])
    return inside, total, widths, ranges.get("sources") or {}


def campaign(k: int, args, root: Path) -> dict:
    """Profile, fit, measure and validate campaign k; its before and after cells."""
    where = root / f"campaign_{k}"
    where.mkdir(parents=True, exist_ok=True)
    profile = once(where / "profile", "profile", "--model-spec", "tiny", "--device", "cpu", "--grid", args.grid,
                   "--no-progress")
    tables = once(where / "tables", "fit", "--profile", str(profile), "--model-spec", "tiny", "--regressor", "rf",
                  "--no-mlflow")
    trace = TRACE.format(rate=args.rate, requests=args.requests)
    run = once(where / "run", "measure", "--model-spec", "tiny", "--device", "cpu", "--trace", trace,
               "--seed", str(1000 + k), "--scheduler", "sarathi", "--chunk-size", "256", "--repeats", "2", "--quiet")
    ranges = ["--ranges", str(args.replications), "--workers", str(args.workers), "--quiet"]
    after = once(where / "validation_after", "validate", "--measured", str(run), "--step-model", str(tables), *ranges)
    before_tables = strip_held_out_error(tables, where / "tables_before")
    before = once(where / "validation_before", "validate", "--measured", str(run), "--step-model",
                  str(before_tables), *ranges, "--scatter-cv", "0", "--scatter-rho", "0", "--scatter-run-cv", "0")
    return {"before": cells(before), "after": cells(after)}


def line(name: str, result: tuple) -> str:
    inside, total, widths, _ = result
    return f"{inside:3d}/{total:<3d} {inside / total:6.1%} {np.median(widths):9.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the campaigns are kept (resumable)")
    parser.add_argument("--campaigns", type=int, default=4)
    parser.add_argument("--replications", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--grid", default="quick", help="stepcal profile --grid (default quick)")
    parser.add_argument("--requests", type=int, default=80, help="requests of the measured trace (default 80)")
    parser.add_argument("--rate", type=float, default=8.0, help="its mean arrival rate, req/s (default 8)")
    args = parser.parse_args()
    results = [campaign(k, args, args.out) for k in range(args.campaigns)]
    print(f"{'campaign':10} {'before: inside':>16} {'width':>9}   {'after: inside':>16} {'width':>9}")
    for k, result in enumerate(results):
        print(f"{k:<10} {line('before', result['before'])}   {line('after', result['after'])}")
    for when in ("before", "after"):
        pooled = [r[when] for r in results]
        inside, total = sum(p[0] for p in pooled), sum(p[1] for p in pooled)
        widths = [w for p in pooled for w in p[2]]
        print(f"pooled {when:6}: {inside}/{total} = {inside / total:.1%} of cells inside, median width "
              f"{np.median(widths):.1%} of the measured value")
    from stepcal.experiments.validation.error_sources import sources_text
    for k, result in enumerate(results):
        print(f"campaign {k} after: {sources_text(result['after'][3])}")


if __name__ == "__main__":
    main()
