"""Profiling to a budget on replayed GPU data: held-out error against measurement time spent, for
budgeted adaptive sampling (experiments.budget.adaptive), the fixed quick and full grids and
uniform random sampling, each over 5 seeds. Not run by CI.

Each dataset is a measured profile (../shared/data/profiles): AIConfigurator's H100 GEMM, prefill
and decode attention tables (bf16, every head configuration), and LLMServingSim's RTX PRO 6000
bundle of Llama-3.1-8B at TP 1 (its GEMMs, element-wise ops and attention together). Per seed a
random 20% of its shapes is held out; the rest are the candidates. Measuring a candidate replays
it: samples drawn around its measured time with the profile's scatter (2% where it keeps medians
only), at the cost profiler.timing.measure would spend under the default TimingPolicy
(profiler.simulated_timing). The model is the op's regressor as `stepcal fit --regressor rf`
builds it; the error is its MAPE on the held-out shapes' measured times. The quick grid keeps the
candidates at every other distinct value of each size axis; the full grid is every candidate.

Target: adaptive reaches the full grid's held-out error (within 10%, relative) at <= 35% of the
full grid's measurement time.

Usage: .venv/bin/python bench/bench_profile_budget.py [--seeds 5] [--only NAME] [--csv FILE]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PROFILES = REPO.parent / "shared" / "data" / "profiles"
AIC = PROFILES / "aiconfigurator" / "h100_sxm"
LSS = PROFILES / "llmservingsim" / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16"
FRACTIONS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5)     # of the full grid's measurement time
HOLD_OUT = 0.2
TARGET_FRACTION, TARGET_RATIO = 0.35, 1.10


def datasets(only: str | None) -> dict[str, pd.DataFrame]:
    from stepcal.core.model_spec import PRESETS
    from stepcal.costmodel.importers import load_profiles
    out = {}
    loaders = {
        "aic_h100_gemm": lambda: load_profiles([AIC / "gemm"]).query("op == 'gemm'"),
        "aic_h100_attn_prefill": lambda: load_profiles([AIC / "attention"]).query("op == 'attn_prefill'"),
        "aic_h100_attn_decode": lambda: load_profiles([AIC / "attention"]).query("op == 'attn_decode'"),
        "lss_rtxpro6000_llama8b": lambda: load_profiles([LSS], "llmservingsim", spec=PRESETS["llama-3-8b"], tp=1),
    }
    for name, load in loaders.items():
        if only and only not in name:
            continue
        records = load()
        records = records[records["dtype"].isna() | (records["dtype"] == "bfloat16")]
        out[name] = records[records["time_ms"] > 0].reset_index(drop=True)
    return out


def replayed(records: pd.DataFrame, seed: int, policy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per record: the median of its replayed samples, the seconds measuring it took and the
    median's relative precision."""
    from stepcal.experiments.replay.device import rel_scatter
    from stepcal.profiler.point import point_rng
    from stepcal.profiler.simulated_timing import simulate_rounds
    scatter = rel_scatter(records)
    medians, costs, precision = (np.empty(len(records)) for _ in range(3))
    for i, (t, s) in enumerate(zip(records["time_ms"].to_numpy(float), scatter)):
        sim = simulate_rounds(float(t), float(s), policy, 1, point_rng("bench", seed, i))
        medians[i], costs[i], precision[i] = sim.measurement.time_ms, sim.measure_s, sim.measurement.rel_precision
    return medians, costs, precision


def quick_mask(candidates: pd.DataFrame) -> np.ndarray:
    """Candidates at every other distinct value (by rank, from the smallest; the largest kept) of
    each size axis, per op and sub-operation: a coarser grid of the same shapes."""
    from stepcal.experiments.replay.device import DEFAULT_AXES, SIZE_AXES
    keep = np.ones(len(candidates), dtype=bool)
    groups = np.array([f"{op}/{name}" for op, name in zip(candidates["op"], candidates["name"])])
    for group in np.unique(groups):
        rows = groups == group
        for col in SIZE_AXES.get(group.split("/")[0], DEFAULT_AXES):
            values = candidates.loc[rows, col]
            if values.isna().all():
                continue
            distinct = np.sort(values.dropna().unique())
            rank = {v: i for i, v in enumerate(distinct)}
            even = np.array([pd.isna(v) or rank[v] % 2 == 0 or rank[v] == len(distinct) - 1 for v in values])
            keep[np.flatnonzero(rows)[~even]] = False
    return keep


class Scorer:
    """Held-out MAPE of the op's regressor fitted on a subset of the candidates."""

    def __init__(self, candidates, held_out, seed):
        from stepcal.experiments.budget.op_model import OpModel
        both = pd.concat([candidates, held_out], ignore_index=True)
        self.model = OpModel(both, seed)
        self.num_candidates = len(candidates)
        self.truth = held_out["time_ms"].to_numpy(float)

    def error(self, chosen: np.ndarray, medians: np.ndarray) -> float:
        predicted, _ = self.model.predict(np.asarray(chosen, int), medians[chosen])
        held = predicted[self.num_candidates:]
        # a target with too few points predicts nothing: counted as missing by 100%
        ape = np.where(np.isfinite(held), np.abs(held - self.truth) / self.truth, 1.0)
        return float(np.mean(ape) * 100)


def curve(order: np.ndarray, costs: np.ndarray, full_s: float, scorer: Scorer, medians) -> list[tuple]:
    """(fraction of full time, seconds spent, points, held-out MAPE %) at each budget fraction, for
    the measurement order `order` cut where its cumulative cost passes the budget."""
    spent = np.cumsum(costs[order])
    out = []
    for fraction in FRACTIONS:
        n = int(np.searchsorted(spent, fraction * full_s, side="right"))
        if n < 8:
            out.append((fraction, float(spent[n - 1]) if n else 0.0, n, float("nan")))
            continue
        out.append((fraction, float(spent[n - 1]), n, scorer.error(order[:n], medians)))
    return out


def adaptive_order(candidates, costs, full_s, seed, policy) -> np.ndarray:
    """The candidates in the order the adaptive design measures them, up to the largest fraction."""
    from stepcal.experiments.budget.adaptive import AdaptiveDesign, CostCurve
    design = AdaptiveDesign(candidates, CostCurve.for_policy(policy), seed=seed)
    medians, precision = candidates["_median"].to_numpy(), candidates["_precision"].to_numpy()
    budget_s = max(FRACTIONS) * full_s
    measured, order, spent = {}, [], 0.0
    while spent < budget_s:
        batch = [i for i in design.next_batch(measured, spent, budget_s, dict(enumerate(precision)))
                 if i not in measured]
        if not batch:
            break
        for i in batch:
            measured[i] = float(medians[i])
            order.append(i)
            spent += costs[i]
    return np.array(order, dtype=int)


def run_seed(records: pd.DataFrame, seed: int, policy) -> list[dict]:
    rng = np.random.default_rng(seed)
    held = rng.random(len(records)) < HOLD_OUT
    candidates, held_out = records[~held].reset_index(drop=True), records[held].reset_index(drop=True)
    medians, costs, precision = replayed(candidates, seed, policy)
    candidates = candidates.assign(_median=medians, _precision=precision)
    full_s = float(costs.sum())
    scorer = Scorer(candidates.drop(columns=["_median", "_precision"]), held_out, seed)
    rows = []
    every = np.arange(len(candidates))
    rows.append({"method": "full", "fraction": 1.0, "spent_s": full_s, "points": len(every),
                 "mape": scorer.error(every, medians)})
    quick = np.flatnonzero(quick_mask(candidates))
    rows.append({"method": "quick", "fraction": costs[quick].sum() / full_s, "spent_s": float(costs[quick].sum()),
                 "points": len(quick), "mape": scorer.error(quick, medians)})
    for method, order in (("random", rng.permutation(len(candidates))),
                          ("adaptive", adaptive_order(candidates, costs, full_s, seed, policy))):
        for fraction, spent, n, mape in curve(order, costs, full_s, scorer, medians):
            rows.append({"method": method, "fraction": fraction, "spent_s": spent, "points": n, "mape": mape})
    return [{**r, "seed": seed} for r in rows]


def summarize(name: str, frame: pd.DataFrame) -> str:
    # a fixed grid's share of the full time differs a little by seed (its held-out shapes): one row
    fixed = frame["method"].isin(["quick", "full"])
    frame = frame.assign(fraction=frame["fraction"].where(~fixed, frame.groupby("method")["fraction"].transform("mean")))
    table = frame.groupby(["method", "fraction"]).agg(spent_s=("spent_s", "mean"), points=("points", "mean"),
                                                      mape=("mape", "mean"), mape_sd=("mape", "std"))
    full = float(table.loc[("full", 1.0), "mape"])
    lines = [f"== {name}: full grid held-out MAPE {full:.2f}% at {table.loc[('full', 1.0), 'spent_s']:.1f} s"]
    lines += ["method    fraction  spent_s   points   MAPE%  (sd)   / full"]
    for (method, fraction), r in table.iterrows():
        lines.append(f"{method:<9}{fraction:>8.2f}{r.spent_s:>9.1f}{r.points:>9.0f}{r.mape:>8.2f}"
                     f"  ({r.mape_sd:.2f}){r.mape / full:>8.2f}")
    adaptive = table.loc["adaptive"]
    reached = adaptive[adaptive["mape"] <= TARGET_RATIO * full]
    first = f"{reached.index.min():.2f}" if len(reached) else "not within 0.50"
    ok = len(reached) and reached.index.min() <= TARGET_FRACTION
    lines.append(f"target (adaptive within {TARGET_RATIO - 1:.0%} of full at <= {TARGET_FRACTION:.0%} of its time): "
                 f"first reached at fraction {first} -> {'MET' if ok else 'NOT MET'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", default=None, help="run the datasets whose name holds this")
    parser.add_argument("--csv", default=None, help="write every curve point to this CSV")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    from stepcal.profiler.timing import TimingPolicy
    policy = TimingPolicy()
    frames = []
    with threadpool_limits(limits=1):
        for name, records in datasets(args.only).items():
            started = time.perf_counter()
            rows = [r for seed in range(args.seeds) for r in run_seed(records, seed, policy)]
            frame = pd.DataFrame(rows).assign(dataset=name)
            frames.append(frame)
            print(summarize(name, frame), f"\n({len(records)} shapes, {time.perf_counter() - started:.0f} s)\n",
                  flush=True)
    if args.csv and frames:
        pd.concat(frames).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
