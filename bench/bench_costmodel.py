"""Benchmark of the cost model on real profiles by others (../shared/data/profiles); prints figures.

1. Vidur mlp.csv (H100 and A100): held-out MAPE of per-layer time (the sum of a layer's
   operators), ours (Optuna-tuned families incl. the physics-informed model) vs a plain random
   forest per operator and TP degree over num_tokens with grid search (Vidur's approach), on a
   random split and an extrapolation split (train on the smaller half of num_tokens).
2. AIConfigurator H100 decode and prefill attention, and all-reduce: held-out MAPE, random and
   extrapolation.
3. Wall time of `stepcal fit` with the defaults, and T_step of Qwen3-14B on H100 (bf16) for a
   few batches, composed from the AIConfigurator tables; the cost of one table lookup.

Usage: .venv/bin/python bench/bench_costmodel.py [--trials N] [--all] [--only-vidur]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO.parent / "shared" / "data" / "profiles"
VIDUR = [("H100", "h100/meta-llama/Llama-2-7b-hf"), ("A100", "a100/meta-llama/Llama-2-7b-hf"),
         ("H100", "h100/meta-llama/Llama-2-70b-hf"), ("A100", "a100/meta-llama/Meta-Llama-3-8B")]
VIDUR_GRID = {"n_estimators": [100], "max_depth": [8, 16, 32], "min_samples_split": [2, 5, 10]}


def vidur_splits(records: pd.DataFrame, seed: int) -> dict[str, np.ndarray]:
    """Test masks over source rows (all operators of one mlp.csv row stay together)."""
    from stepcal.costmodel.evaluation import extrapolation_split, random_split
    rows = records["row"].to_numpy()
    return {"random": random_split(rows, 0.2, seed),
            "extrapolation": extrapolation_split(records["num_tokens"].to_numpy())}


def ours(records, test, trials, seed) -> np.ndarray:
    """Predictions for the test records: per target, tuned on the training records only."""
    from stepcal.costmodel.features import assign_targets, design, kind_of
    from stepcal.costmodel.fitting import build_estimator
    from stepcal.costmodel.tuning import tune
    targets = assign_targets(records).to_numpy()
    y = records["time_ms"].to_numpy()
    pred = np.full(len(records), np.nan)
    for target in np.unique(targets):
        mask = targets == target
        d = design(target, records[mask].reset_index(drop=True))
        train = ~test[mask]
        choice, _ = tune(lambda c, pi=d.physics_index: build_estimator(c, pi, seed), d.X[train],
                         y[mask][train], d.size[train], kind=kind_of(target), has_physics=True,
                         n_trials=trials, seed=seed)
        model = build_estimator(choice, d.physics_index, seed).fit(d.X[train], y[mask][train])
        part = np.full(mask.sum(), np.nan)
        part[~train] = model.predict(d.X[~train])
        pred[mask] = part
    return pred


def vidur_forest(records, test, seed) -> np.ndarray:
    """Vidur's approach: a random forest per operator and TP degree on num_tokens, grid-searched."""
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.model_selection import GridSearchCV
    pred = np.full(len(records), np.nan)
    for _, group in records.groupby(["name", "tp"]):
        idx = group.index.to_numpy()
        train = idx[~test[idx]]
        held = idx[test[idx]]
        if not len(held):
            continue
        X = records.loc[:, ["num_tokens"]].to_numpy()
        search = GridSearchCV(RandomForestRegressor(random_state=seed), VIDUR_GRID, cv=3,
                              scoring="neg_mean_absolute_percentage_error", n_jobs=1)
        search.fit(X[train], records["time_ms"].to_numpy()[train])
        pred[held] = search.predict(X[held])
    return pred


def layer_mape(records, test, pred) -> tuple[float, float]:
    """MAPE of per-layer time (sum over the per-layer operators of a row) and of the operators."""
    from stepcal.costmodel.evaluation import ape_percent
    per_layer = records["name"] != "emb"
    held = test & per_layer.to_numpy()
    frame = pd.DataFrame({"row": records["row"][held], "y": records["time_ms"][held], "p": pred[held]})
    sums = frame.groupby("row")[["y", "p"]].sum()
    return (float(ape_percent(sums["y"], sums["p"]).mean()),
            float(ape_percent(frame["y"], frame["p"]).mean()))


def bench_vidur(trials: int, seed: int, everything: bool) -> None:
    from threadpoolctl import threadpool_limits

    from stepcal.costmodel.importers import load_profiles
    print("\n== Vidur mlp.csv: held-out MAPE of per-layer time (and of single operators) ==")
    print(f"{'device/model':<34}{'split':<15}{'ours layer':>11}{'ours ops':>10}"
          f"{'Vidur RF layer':>16}{'Vidur RF ops':>14}")
    for device, rel in VIDUR if everything else VIDUR[:2]:
        records = load_profiles([PROFILES / "vidur" / rel / "mlp.csv"])
        for split, test in vidur_splits(records, seed).items():
            with threadpool_limits(1):
                ours_l, ours_o = layer_mape(records, test, ours(records, test, trials, seed))
                rf_l, rf_o = layer_mape(records, test, vidur_forest(records, test, seed))
            print(f"{device + ' ' + rel.split('/')[-1]:<34}{split:<15}{ours_l:>10.2f}%{ours_o:>9.2f}%"
                  f"{rf_l:>15.2f}%{rf_o:>13.2f}%", flush=True)


def bench_attention(trials: int, seed: int) -> None:
    from stepcal.costmodel.fitting import FitConfig, fit_all, select_records
    from stepcal.costmodel.importers import load_profiles
    print("\n== AIConfigurator H100 attention (bf16 KV): held-out error, tuned ==")
    records = select_records(load_profiles([PROFILES / "aiconfigurator/h100_sxm/attention"]),
                             dtype="bfloat16")
    result = fit_all(records, FitConfig(regressor="tuned", trials=trials, seed=seed))
    for target, fit in result.targets.items():
        for split, e in fit.errors.items():
            print(f"{target:<14}{split:<15} MAPE {e['mape']:6.2f}%  P90 {e['p90_ape']:6.2f}%  "
                  f"max {e['max_ape']:6.1f}%  ({e['n']} rows, family {fit.choice.family})")


def bench_all_reduce(trials: int, seed: int) -> None:
    from stepcal.costmodel.fitting import FitConfig, fit_all, select_records
    from stepcal.costmodel.importers import load_profiles
    print("\n== all-reduce on H100, 2/4/8 GPUs (AIConfigurator custom_allreduce_perf bf16; Vidur "
          "network/all_reduce.csv): held-out error ==")
    for path in (PROFILES / "aiconfigurator/h100_sxm/comm", PROFILES / "vidur/network/h100_dgx/all_reduce.csv"):
        records = select_records(load_profiles([path]), dtype="bfloat16")
        result = fit_all(records, FitConfig(regressor="tuned", trials=trials, seed=seed))
        for target, fit in result.targets.items():
            for split, e in fit.errors.items():
                print(f"{target:<24}{split:<15} MAPE {e['mape']:6.2f}%  P90 {e['p90_ape']:6.2f}%  "
                      f"({e['n']} rows, family {fit.choice.family})")


def bench_fit_wall_time() -> Path:
    print("\n== `stepcal fit` with the defaults (tuned, MLflow on) ==")
    out = Path(tempfile.mkdtemp(prefix="bench_fit_")) / "qwen3-14b-h100"
    cases = [("AIConfigurator H100, Qwen3-14B", ["--profile", str(PROFILES / "aiconfigurator/h100_sxm"),
                                                 "--model-spec", "qwen3-14b"], out),
             ("Vidur H100 Llama-2-7B", ["--profile", str(PROFILES / "vidur/h100/meta-llama/"
                                                          "Llama-2-7b-hf/mlp.csv"),
                                        "--model-spec", "llama-2-7b"], out.parent / "llama")]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    for label, args, dest in cases:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "stepcal.experiments.cli", "fit", *args, "--out", str(dest)],
                       env=env, check=True, capture_output=True)
        print(f"{label:<36} {time.perf_counter() - started:6.1f} s wall")
    return out


def bench_composed(table_dir: Path) -> None:
    from stepcal.core.batch import StepBatch, feature_row
    from stepcal.costmodel.tables import load_step_model
    model = load_step_model(table_dir)
    print(f"\n== T_step of Qwen3-14B on H100, bf16, from AIConfigurator tables ({table_dir}) ==")
    cases = {
        "decode 1 seq, KV 1024": ([1], [1024]),
        "decode 32 seqs, KV 2048": ([1] * 32, [2048] * 32),
        "decode 128 seqs, KV 1024": ([1] * 128, [1024] * 128),
        "prefill 1 x 2048": ([2048], [0]),
        "prefill 8 x 512": ([512] * 8, [0] * 8),
        "chunk 512 over 3584 + 64 decodes KV 4096": ([512] + [1] * 64, [3584] + [4096] * 64),
    }
    for label, (q, s) in cases.items():
        batch = StepBatch.of(range(len(q)), q, s)
        terms = model.term_ms(batch.features())
        parts = "  ".join(f"{k} {float(v[0]):.3f}" for k, v in terms.items())
        print(f"{label:<42} {model.step_ms(batch):8.3f} ms ± {model.step_ms_spread(batch):.3f}   [{parts}]")
    batch = StepBatch.of(range(65), [512] + [1] * 64, [3584] + [4096] * 64)
    row = feature_row(batch.q_lens, batch.kv_lens)
    print(f"one lookup (row_ms, 4 terms): {_median_us(lambda: model.row_ms(row)):.1f} µs; "
          f"feature_row of a 65-sequence batch: {_median_us(lambda: feature_row(batch.q_lens, batch.kv_lens)):.1f} µs")


def _median_us(fn, calls: int = 2000, repeats: int = 7) -> float:
    for _ in range(200):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - started) / calls * 1e6)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--all", action="store_true", dest="everything",
                        help="four Vidur files (H100 and A100, 7B to 70B) instead of two")
    parser.add_argument("--only-vidur", action="store_true", help="skip the fit, lookup and attention parts")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    print(f"CPU cores: {os.cpu_count()}; Optuna trials per target: {args.trials}")
    if not args.only_vidur:
        table_dir = bench_fit_wall_time()
        bench_composed(table_dir)
        bench_attention(args.trials, args.seed)
        bench_all_reduce(args.trials, args.seed)
    bench_vidur(args.trials, args.seed, args.everything)


if __name__ == "__main__":
    main()
