"""Which speed probe tracks the machine: the 4-decode probe or the 32-decode one (speed_probe_big_ms).

    .venv/bin/python studies/probe_shapes.py DIR [DIR ...]

DIR: a quickstart's output whose profile and runs recorded both probes (profiler.engine.measure.
speed_probes_ms). For every run the profiled tables were validated on, each probe's drift (the run's
mean probe over the profile's, less 1; + the machine was slower in the run) is set against the step
model's total error on the run (predicted over measured step time, less 1). A probe that tracks the
machine has r near -1, a slope near -1, and leaves little error once the prediction is scaled by its
drift: the median |error| after that scaling is the figure to compare with the median |error| before.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

PROBES = ("speed_probe_ms", "speed_probe_big_ms")


def profile_probes(root: Path) -> dict[str, float]:
    metas = [json.loads((root / d / "meta.json").read_text()) for d in ("profile", "profile_late")
             if (root / d / "meta.json").exists()]
    return {key: float(np.mean([p for m in metas for p in m.get(key, [])])) for key in PROBES}


def run_rows(root: Path) -> list[dict]:
    reference = profile_probes(root)
    rows = []
    for path in sorted((root / "validation" / "profiled").glob("*/load_*/validation.json")):
        record = json.loads(path.read_text())
        run = root / "measured" / path.parent.parent.name / path.parent.name
        summaries = [json.loads(p.read_text()) for p in sorted(run.glob("repeat_*/summary.json"))]
        row = {"run": f"{root.name} {path.parent.parent.name} {path.parent.name}",
               "total_error": record["step_level"]["total_error"]}
        for key in PROBES:
            probes = [s.get(key) for s in summaries]
            row[key] = (np.mean(probes) / reference[key] - 1) if None not in probes and reference[key] > 0 else None
        rows.append(row)
    return rows


def describe(rows: list[dict], key: str) -> str:
    used = [r for r in rows if r[key] is not None]
    if len(used) < 3:
        return f"{key}: {len(used)} runs, too few"
    drift, error = np.array([r[key] for r in used]), np.array([r["total_error"] for r in used])
    r = float(np.corrcoef(drift, error)[0, 1])
    slope = float(np.polyfit(drift, error, 1)[0])
    scaled = (1 + error) * (1 + drift) - 1        # the prediction scaled by the probe's drift
    return (f"{key}: {len(used)} runs, r = {r:+.2f}, slope {slope:+.2f}; median |step total error| "
            f"{np.median(np.abs(error)):.3f} before, {np.median(np.abs(scaled)):.3f} scaled by the drift")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    rows = [row for root in args.dirs for row in run_rows(root)]
    for row in rows:
        drifts = "  ".join(f"{key} {row[key]:+.3f}" if row[key] is not None else f"{key} -" for key in PROBES)
        print(f"{row['run']:40s} step total {row['total_error']:+.3f}  {drifts}")
    for key in PROBES:
        print(describe(rows, key))


if __name__ == "__main__":
    main()
