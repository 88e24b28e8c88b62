"""Run-to-run noise of the profiler: the quick grid twice, in two processes, then compared.

    .venv/bin/python studies/profile_noise.py --model-spec tiny --out runs/noise
    .venv/bin/python studies/profile_noise.py --compare runs/noise/run1 runs/noise/run2

Prints each run's wall time and, per op, the median |Δ|/median of the two medians, the
run-to-run CV, the median relative p10-p90 spread and the share of points whose median lies
inside the other run's [p10, p90]. Writes OUT/noise.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def run_profile(args, out: Path) -> float:
    cmd = [sys.executable, "-m", "stepcal.experiments.cli", "profile", "--model-spec", args.model_spec,
           "--device", args.device, "--grid", args.grid, "--threads", str(args.threads),
           "--no-progress", "--out", str(out)]
    if args.ops:
        cmd += ["--ops", args.ops]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def compare(dir_a: Path, dir_b: Path):
    import pandas as pd

    from stepcal.profiler.compare import pair_points, summarise
    pairs = pair_points(pd.read_parquet(dir_a / "profile.parquet"), pd.read_parquet(dir_b / "profile.parquet"))
    return pairs, summarise(pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-spec", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--grid", default="quick")
    parser.add_argument("--ops", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/noise"))
    parser.add_argument("--compare", nargs=2, type=Path, metavar="DIR", help="only compare two profiles")
    args = parser.parse_args()

    walls = {}
    if args.compare:
        dir_a, dir_b = args.compare
        out = dir_a.parent
    else:
        out = args.out
        dir_a, dir_b = out / "run1", out / "run2"
        for d in (dir_a, dir_b):
            if (d / "profile.parquet").exists():
                raise SystemExit(f"{d} holds a profile already; use another --out")
            load_before = os.getloadavg()[0]
            walls[d.name] = run_profile(args, d)
            print(f"{d}: wall {walls[d.name]:.1f} s (1-min load average {load_before:.1f} before, "
                  f"{os.getloadavg()[0]:.1f} after)", flush=True)
    pairs, summary = compare(dir_a, dir_b)
    import pandas as pd
    with pd.option_context("display.float_format", "{:.4f}".format, "display.width", 120):
        print(summary.to_string())
    worst = pairs.sort_values("rel_diff", ascending=False).head(5)
    print("largest run-to-run differences:")
    print(worst[["op", "name", "time_ms_a", "time_ms_b", "rel_diff", "spread_rel"]].to_string(index=False))
    out.mkdir(parents=True, exist_ok=True)
    (out / "noise.json").write_text(json.dumps(
        {"wall_s": walls, "summary": json.loads(summary.to_json(orient="index"))}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
