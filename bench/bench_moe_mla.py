"""Benchmark of the cost model on AIConfigurator's MoE and MLA kernel tables (vLLM 0.14.0); prints figures.

For each device, the bf16 MoE experts' kernel (one target per routing distribution) and MLA
decode and prefill attention (bf16 KV cache): held-out MAPE and P90 APE of ours (`fit_target`,
Optuna-tuned families incl. the physics-informed model) beside a plain random forest
(scikit-learn defaults, 100 trees, on the target's raw record columns), both on the SAME splits:
a random 20% of rows held out (grouped by source row, as costmodel.fitting does) and the
extrapolation split (fit on the smaller half of the size axis, score on the larger).

`repeat` is the tables' own scatter: the MAPE of one measurement against the other
measurements of the same kernel shape (the target's record columns), where a table has several
(the MLA tables time each per-GPU head count under two TP degrees, the H100 MoE table repeats
some rows). No model of the mean can be expected to beat it by much on held-out rows.

`floor` is what that scatter costs any model of the kernel's shape on the held-out rows: the MAPE
of predicting each held-out row by the value that minimises its shape's APE sum (the 1/y-weighted
median of the shape's measurements, the smaller one of a pair). A model's features cannot tell
repeats of one shape apart, so over random splits it cannot expect to score below it.

Usage: .venv/bin/python bench/bench_moe_mla.py [--devices h100_sxm a100_sxm] [--trials N] [--seed S]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
AICONFIGURATOR = REPO.parent / "shared" / "data" / "profiles" / "aiconfigurator"
TABLES = {"moe": "moe/vllm/0.14.0/moe_perf.parquet",
          "mla_decode": "mla/vllm/0.14.0/generation_mla_perf.parquet",
          "mla_prefill": "mla/vllm/0.14.0/context_mla_perf.parquet"}
DTYPE = "bfloat16"


def target_rows(device_dir: Path) -> dict[str, pd.DataFrame]:
    """The bf16 records of every MoE and MLA target of one device, by target name."""
    from stepcal.costmodel.features import assign_targets
    from stepcal.costmodel.fitting import select_records
    from stepcal.costmodel.importers import load_profiles
    out = {}
    for table in TABLES.values():
        records = select_records(load_profiles([device_dir / table]), dtype=DTYPE)
        targets = assign_targets(records)
        for target in sorted(targets.unique()):
            out[target] = records[targets == target].reset_index(drop=True)
    return out


def splits(target: str, rows: pd.DataFrame, seed: int) -> dict[str, np.ndarray]:
    """The test masks fit_target scores on, rebuilt the same way for the plain forest."""
    from stepcal.costmodel.evaluation import extrapolation_split, group_ids, random_split
    from stepcal.costmodel.features import design
    return {"random": random_split(group_ids(rows), 0.2, seed),
            "extrapolation": extrapolation_split(design(target, rows).size)}


def plain_forest(target: str, rows: pd.DataFrame, test: np.ndarray, seed: int) -> np.ndarray:
    """A default random forest on the raw record columns of the target (no derived features)."""
    from sklearn.ensemble import RandomForestRegressor

    from stepcal.costmodel.features import kind_for
    columns = list(kind_for(target, rows).columns)
    X = rows[columns].fillna(1.0).to_numpy(dtype=np.float64)
    y = rows["time_ms"].to_numpy(dtype=np.float64)
    model = RandomForestRegressor(n_estimators=100, random_state=seed, n_jobs=1)
    return model.fit(X[~test], y[~test]).predict(X[test])


def repeat_mape(target: str, rows: pd.DataFrame) -> float | None:
    """MAPE of each repeated measurement against the mean of its repeats (None: no repeats)."""
    from stepcal.costmodel.evaluation import ape_percent
    from stepcal.costmodel.features import kind_for
    groups = rows.groupby(list(kind_for(target, rows).columns), dropna=False)["time_ms"]
    count, total = groups.transform("size"), groups.transform("sum")
    repeated = (count >= 2).to_numpy()
    if not repeated.any():
        return None
    others = ((total - rows["time_ms"]) / (count - 1)).to_numpy()[repeated]
    return float(ape_percent(rows["time_ms"].to_numpy()[repeated], others).mean())


def mape_optimal_per_shape(target: str, rows: pd.DataFrame) -> np.ndarray:
    """Per row: the 1/y-weighted median of its shape's times (the target's record columns), the one
    value that minimises the shape's sum of absolute percentage errors."""
    from stepcal.costmodel.features import kind_for
    y = rows["time_ms"].to_numpy(dtype=np.float64)
    best = y.copy()
    for idx in rows.groupby(list(kind_for(target, rows).columns), dropna=False).indices.values():
        if len(idx) > 1:
            times = np.sort(y[idx])
            weight = np.cumsum(1.0 / times)
            best[idx] = times[np.searchsorted(weight, weight[-1] / 2)]
    return best


def floor_mape(target: str, rows: pd.DataFrame, test: np.ndarray) -> float:
    """MAPE on the held-out rows of the best prediction a model of shape alone can make."""
    from stepcal.costmodel.evaluation import ape_percent
    y = rows["time_ms"].to_numpy(dtype=np.float64)
    return float(ape_percent(y[test], mape_optimal_per_shape(target, rows)[test]).mean())


def bench_target(target: str, rows: pd.DataFrame, trials: int, seed: int) -> list[tuple]:
    """(split, n held out, ours stats, forest stats, family, floor MAPE) per split of one target."""
    from stepcal.costmodel.evaluation import error_stats
    from stepcal.costmodel.fitting import FitConfig, fit_target
    fit = fit_target(target, rows, FitConfig(regressor="tuned", trials=trials, seed=seed))
    y = rows["time_ms"].to_numpy(dtype=np.float64)
    out = []
    for split, test in splits(target, rows, seed).items():
        if test is None or split not in fit.errors:
            continue
        forest = error_stats(y[test], plain_forest(target, rows, test, seed))
        out.append((split, int(test.sum()), fit.errors[split], forest, fit.choice.family,
                    floor_mape(target, rows, test)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", nargs="+", default=["h100_sxm", "a100_sxm"],
                        help="AIConfigurator system folders")
    parser.add_argument("--trials", type=int, default=12, help="Optuna trials per target")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from threadpoolctl import threadpool_limits
    started = time.perf_counter()
    print(f"CPU cores: {os.cpu_count()}; Optuna trials per target: {args.trials}; dtype {DTYPE}")
    print(f"{'device':<10}{'target':<22}{'rows':>6} {'split':<14}{'held':>6}"
          f"{'ours MAPE':>11}{'ours P90':>10}{'RF MAPE':>10}{'RF P90':>9}{'repeat':>9}{'floor':>8}  family   fit s")
    for device in args.devices:
        for target, rows in target_rows(AICONFIGURATOR / device).items():
            t0 = time.perf_counter()
            with threadpool_limits(1):
                results = bench_target(target, rows, args.trials, args.seed)
            seconds = time.perf_counter() - t0
            repeat = repeat_mape(target, rows)
            repeat_text = f"{repeat:>8.2f}%" if repeat is not None else f"{'-':>9}"
            for split, held, ours, forest, family, floor in results:
                print(f"{device:<10}{target:<22}{len(rows):>6} {split:<14}{held:>6}"
                      f"{ours['mape']:>10.2f}%{ours['p90_ape']:>9.2f}%{forest['mape']:>9.2f}%"
                      f"{forest['p90_ape']:>8.2f}%{repeat_text}{floor:>7.2f}%  {family:<8}{seconds:>6.0f}", flush=True)
    print(f"wall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
