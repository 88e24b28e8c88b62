"""Run-to-run comparison of two profiles of the same grid: is the noise within the reported spread?"""
from __future__ import annotations

import numpy as np
import pandas as pd

from stepcal.profiler.serve import SERVED

KEY = "point_key"


def pair_points(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """The ok points of both runs, side by side, with their run-to-run differences.

    rel_diff = |median_a - median_b| / mean of the two; cv = the two medians' std / mean
    (for two values: rel_diff / sqrt(2)); within_spread: each median lies inside the other
    run's [p10, p90] (strict: fails for a small shift when the p10 hugs the median);
    within_width: |median_a - median_b| <= the mean of the two p10-p90 widths.
    """
    cols = [KEY, "op", "name", "time_ms", "time_ms_p10", "time_ms_p90"]
    ok_a = a.loc[a["status"] == "ok", cols]
    ok_b = b.loc[b["status"] == "ok", [KEY, "time_ms", "time_ms_p10", "time_ms_p90"]]
    pairs = ok_a.merge(ok_b, on=KEY, suffixes=("_a", "_b"))
    # served steps (profiler.serve) are one sample a round: summarised apart from the held points
    pairs["op"] = pairs["op"].where(pairs["name"] != SERVED, pairs["op"] + ":" + SERVED)
    mean = (pairs["time_ms_a"] + pairs["time_ms_b"]) / 2
    diff = (pairs["time_ms_a"] - pairs["time_ms_b"]).abs()
    pairs["rel_diff"] = diff / mean
    pairs["cv"] = pairs["rel_diff"] / np.sqrt(2)
    pairs["spread_rel"] = ((pairs["time_ms_p90_a"] - pairs["time_ms_p10_a"])
                           + (pairs["time_ms_p90_b"] - pairs["time_ms_p10_b"])) / 2 / mean
    a_in_b = pairs["time_ms_a"].between(pairs["time_ms_p10_b"], pairs["time_ms_p90_b"])
    b_in_a = pairs["time_ms_b"].between(pairs["time_ms_p10_a"], pairs["time_ms_p90_a"])
    pairs["within_spread"] = a_in_b & b_in_a
    pairs["within_width"] = diff <= pairs["spread_rel"] * mean
    return pairs


def summarise(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per op: points, median |Δ|/median, median and p90 CV, shares of points within the spread."""
    def one(group: pd.DataFrame) -> pd.Series:
        return pd.Series({
            "points": len(group),
            "median_rel_diff": group["rel_diff"].median(),
            "median_cv": group["cv"].median(),
            "p90_cv": group["cv"].quantile(0.9),
            "median_spread_rel": group["spread_rel"].median(),
            "within_spread": group["within_spread"].mean(),
            "within_width": group["within_width"].mean(),
        })
    by_op = pairs.groupby("op", sort=False)[list(pairs.columns)].apply(one)
    return pd.concat([by_op, one(pairs).to_frame("all").T])


def join_gemm_reference(profile: pd.DataFrame, reference: pd.DataFrame, *,
                        dtype: str = "bfloat16") -> pd.DataFrame:
    """Our GEMM points beside a reference table's at the same (m, n, k), e.g. AIConfigurator's
    `gemm_perf` (columns gemm_dtype, m, n, k, latency in ms); ratio = ours / reference."""
    ours = profile.loc[(profile["op"] == "gemm") & (profile["status"] == "ok"),
                       ["name", "m", "n", "k", "time_ms", "time_ms_p10", "time_ms_p90"]]
    ours = ours.astype({"m": "int64", "n": "int64", "k": "int64"})
    ref = reference.loc[reference["gemm_dtype"] == dtype, ["m", "n", "k", "latency"]]
    ref = ref.groupby(["m", "n", "k"], as_index=False)["latency"].median()
    joined = ours.merge(ref.rename(columns={"latency": "reference_ms"}), on=["m", "n", "k"])
    joined["ratio"] = joined["time_ms"] / joined["reference_ms"]
    return joined.sort_values(["name", "m"]).reset_index(drop=True)
