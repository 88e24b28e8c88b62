"""Compare our GEMM times with AIConfigurator's H100 GEMM table at the same (m, n, k).

    .venv/bin/python studies/compare_aiconfigurator_gemm.py PROFILE.parquet [--device h100_sxm]

The table (measured under vLLM 0.14.0, bf16 rows used) lives in ../shared/data beside the repo.
Prints every matching point with ratio = ours / AIConfigurator, and the geometric mean per
projection. An H200 has the H100's tensor cores and ~1.4x its memory bandwidth, so expect
ratios near 1 for compute-bound (large m) points and below 1 for bandwidth-bound (small m) ones.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[1]
AIC = REPO_ROOT.parent / "shared" / "data" / "profiles" / "aiconfigurator"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="a profile.parquet with gemm rows")
    parser.add_argument("--device", default="h100_sxm", help="AIConfigurator device folder [h100_sxm]")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    from stepcal.profiler.compare import join_gemm_reference
    table = AIC / args.device / "gemm" / "vllm" / "0.14.0" / "gemm_perf.parquet"
    profile = pd.read_parquet(args.profile)
    joined = join_gemm_reference(profile, pd.read_parquet(table), dtype=args.dtype)
    if joined.empty:
        print("no GEMM point of the profile has the same (m, n, k) as the reference table")
        return 1
    device = profile["device_name"].dropna().iloc[0] if profile["device_name"].notna().any() else "?"
    print(f"ours: {device}, reference: AIConfigurator {args.device} ({table.name}), dtype {args.dtype}")
    with pd.option_context("display.width", 120, "display.float_format", "{:.4f}".format):
        print(joined.to_string(index=False))
        summary = joined.groupby("name")["ratio"].agg(points="size", geomean=lambda r: float(np.exp(np.log(r).mean())),
                                                      min="min", max="max")
        print(summary.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
