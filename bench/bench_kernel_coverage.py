"""How much of a measured step the composed kernel tables account for, with and without the
`elementwise` op (issue 16): the profile's whole-step points (`step` op: the engine's device work
of one iteration) against the tables fitted from its per-operator points alone.

Fits two kernel tables from one profile, `gemm,attn_prefill,attn_decode,overhead` and the same
plus `elementwise`, and prints, per whole-step point, composed / measured, with the median and
range over the points: a composition with the right shape has ratios near each other.

Usage: .venv/bin/python bench/bench_kernel_coverage.py [--profile DIR] [--model-spec tiny]
  (without --profile: profiles the quick grid's kernels, element-wise ops and steps first, ~90 s)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
KERNELS = "gemm,attn_prefill,attn_decode,overhead"


def stepcal(*args: str) -> None:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    subprocess.run([sys.executable, "-m", "stepcal.experiments.cli", *args], check=True, cwd=REPO, env=env,
                   stdout=subprocess.DEVNULL)


def ratios(profile: Path, tables: Path) -> tuple[pd.DataFrame, np.ndarray]:
    """The whole-step points and composed / measured for each."""
    from stepcal.core.batch import StepFeatures, batch_row
    from stepcal.experiments.step_models import resolve_step_model
    frame = pd.read_parquet(profile)
    steps = frame[(frame["op"] == "step") & (frame["status"] == "ok")].groupby("point_key").agg(
        time_ms=("time_ms", "median"), q_lens=("q_lens", "first"), kv_lens=("kv_lens", "first"))
    features = StepFeatures.from_columns(pd.DataFrame(
        [batch_row(list(q), list(s)) for q, s in zip(steps["q_lens"], steps["kv_lens"])]))
    composed = resolve_step_model(str(tables)).features_ms(features)
    return steps, composed / steps["time_ms"].to_numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", help="a profile directory with step, kernel and elementwise points")
    parser.add_argument("--model-spec", default="tiny")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(args.profile or Path(tmp) / "profile")
        if not args.profile:
            stepcal("profile", "--model-spec", args.model_spec, "--ops", f"{KERNELS},elementwise,step",
                    "--grid", "quick", "--no-progress", "--out", str(profile))
        results = {}
        for label, ops in (("kernels", KERNELS), ("kernels + elementwise", f"{KERNELS},elementwise")):
            out = Path(tmp) / label.replace(" ", "")
            stepcal("fit", "--profile", str(profile / "profile.parquet"), "--ops", ops, "--model-spec",
                    args.model_spec, "--regressor", "tuned", "--trials", "4", "--no-mlflow", "--out", str(out))
            results[label] = ratios(profile / "profile.parquet", out)
    steps = next(iter(results.values()))[0]
    print(f"{'batch (q_lens)':40s} {'step ms':>8s}  " + "  ".join(f"{k:>22s}" for k in results))
    for i, (q, t) in enumerate(zip(steps["q_lens"], steps["time_ms"])):
        shape = f"{len(q)} seqs, {int(sum(q))} tokens"
        print(f"{shape:40s} {t:8.3f}  " + "  ".join(f"{r[1][i]:22.2f}" for r in results.values()))
    for label, (_, r) in results.items():
        print(f"{label}: composed / measured median {np.median(r):.2f}, range {r.min():.2f}-{r.max():.2f} "
              f"(max/min {r.max() / r.min():.2f}) over {len(r)} whole-step points")


if __name__ == "__main__":
    main()
