"""How often the machine slows a measured repeat, and how far clean repeats stay from the threshold.

    .venv/bin/python studies/slowed_repeats.py DIR [DIR ...]

DIR: a quickstart's output (every run under DIR/measured) or a measured run. Prints, per run and
repeat, its slowest window (profiler.engine.slowdown): the median of 32 consecutive steps over their
shapes' usual time, the other repeats' slowest window near the same stretch, their ratio (the excess
held to SLOWED_RATIO) and where; then how many repeats were slowed and the largest excess of the rest,
the margin SLOWED_RATIO keeps from a clean repeat.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def measured_runs(root: Path) -> list[Path]:
    if (root / "repeat_0").is_dir():
        return [root]
    return sorted(p.parent for p in (root / "measured").glob("*/*/repeat_0"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    from stepcal.experiments.validation.measured import load_measured_run
    from stepcal.profiler.engine.slowdown import SLOWED_RATIO, slowest_windows
    slowed, clean = [], []
    for root in args.dirs:
        for path in measured_runs(root):
            run = load_measured_run(path)
            logs = [steps for _, steps in run.steps.groupby("repeat", sort=True)]
            for k, w in enumerate(slowest_windows(logs)):
                if w is None:
                    continue
                others = "-" if w.others is None else f"{w.others:.2f}"
                print(f"{path}  repeat {k}: window {w.ratio:.2f}, others {others}, excess {w.excess:.2f} "
                      f"at {w.start_s:.2f}-{w.end_s:.2f} s{'  SLOWED' if w.slowed else ''}")
                (slowed if w.slowed else clean).append(w.excess)
    print(f"\n{len(slowed)} of {len(slowed) + len(clean)} repeats slowed (excess {sorted(round(x, 2) for x in slowed)}); "
          f"the others' largest excess {max(clean, default=float('nan')):.2f} (threshold {SLOWED_RATIO})")


if __name__ == "__main__":
    main()
