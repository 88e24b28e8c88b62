"""Benchmark: T_step tables on the fixed log grid (before) vs on the data's axes (after, the
default of costmodel.build.build_tables; the rule: costmodel.axes). Prints figures.

One random-forest fit (`--regressor rf`, the same record selection as `stepcal fit
--model-spec`) of Vidur's Llama-3-8B A100 mlp.csv, composed twice from the same regressors:
with Axes.default() and with the data's axes. For each:
1. table vs DATA at every profiled num_tokens: the linear and elementwise terms (GEMMs and small
   ops) against the profile's own sum (32 x the per-layer operators' medians + the embedding), P50 and P99
   of |error|; the regressors' own error next to it;
2. table vs regressor (costmodel.resolution): P50 / P99 / max of |table / summed regressor
   predictions - 1| at every training point of the per-token terms (linear by num_tokens,
   lm_head by num_seqs) and at the chunk sizes 256 ... 4096; and at every integer 1 .. 8,192
   tokens (between the knots too);
3. the linear + elementwise terms at 256 / 504 / 512 / 520 / 1,024 tokens, in ms per step;
4. wall time of `stepcal simulate` on the Azure conv trace with Sarathi (chunk 512) on each
   table directory: runs interleaved, each in its own process, median reported (with the
   simulator's own loop time and step count: finer tables change the schedule too);
5. the lookups alone, on the same 200,000 random batches for both directories: vectorised
   (features_ms) per batch, and the scalar one-step path (row_ms) per call.

Usage: .venv/bin/python bench/bench_table_resolution.py [--repeats 3] [--keep DIR]
           [--profile mlp.csv] [--model-spec llama-3-8b] [--trace TRACE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
PROFILE = SHARED / "profiles" / "vidur" / "a100" / "meta-llama" / "Meta-Llama-3-8B" / "mlp.csv"
TRACE = SHARED / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
PER_LAYER_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "input_layernorm",
                 "attn_rope", "post_attention_layernorm", "mlp_act", "add")
SHOWN_TOKENS = (256, 504, 512, 520, 1024)


def fit(profile: Path, spec, parallelism):
    """Fit as `stepcal fit --regressor rf --model-spec` does (its record selection)."""
    from stepcal.costmodel.build import composed_ops
    from stepcal.costmodel.fitting import FitConfig, dtypes_for, fit_all, select_records
    from stepcal.costmodel.importers import load_profiles
    records = select_records(load_profiles([str(profile)], "auto"), dtype=dtypes_for(spec),
                             ops=composed_ops(spec, parallelism))
    return fit_all(records, FitConfig(regressor="rf"))


def data_linear_ms(profile: Path, spec) -> pd.Series:
    """The profile's linear term by num_tokens at TP 1: layers x the per-layer operators' median
    times + the embedding once (duplicated num_tokens rows: their median)."""
    frame = pd.read_csv(profile)
    frame = frame[frame["num_tensor_parallel_workers"] == 1].groupby("num_tokens").median(numeric_only=True)
    per_layer = sum(frame[f"time_stats.{op}.median"] for op in PER_LAYER_OPS)
    return spec.num_layers * per_layer + frame["time_stats.emb.median"]


def linear_term(directory: Path):
    from stepcal.costmodel.tables import load_step_model
    return next(t for t in load_step_model(directory).terms if t.name == "linear")


def layer_table_ms(directory: Path, x: np.ndarray) -> np.ndarray:
    """The tables' GEMMs and measured small operators at x tokens: the linear and elementwise terms
    (the small operators have had a term of their own since the elementwise term; the profile's sum
    holds both)."""
    from stepcal.costmodel.tables import load_step_model
    terms = [t for t in load_step_model(directory).terms if t.name in ("linear", "elementwise")]
    return sum(np.interp(x, t.knots, t.time_ms) for t in terms)


def layer_regressor_ms(result, spec, parallelism, x: np.ndarray) -> np.ndarray:
    from stepcal.costmodel.compose import per_token_terms_ms
    terms = per_token_terms_ms(result, spec, parallelism, x)
    return terms["linear"] + terms.get("elementwise", 0.0)


def pct(values) -> str:
    p50, p99 = np.percentile(np.abs(values) * 100, [50, 99])
    return f"P50 {p50:6.2f}%  P99 {p99:6.2f}%"


def report_data_error(data: pd.Series, regressor: np.ndarray, tables: dict[str, Path]) -> None:
    tokens = data.index.to_numpy(dtype=np.float64)
    print(f"\n1. table vs data, linear + elementwise terms at the {len(tokens)} profiled num_tokens (TP 1), |error|:")
    print(f"   regressors (no table)  {pct(regressor / data.to_numpy() - 1)}")
    for name, directory in tables.items():
        table = layer_table_ms(directory, tokens)
        print(f"   table {name:<16} {pct(table / data.to_numpy() - 1)}   ({len(linear_term(directory).knots)} knots)")


def report_regressor_error(result, spec, parallelism, tables: dict[str, Path]) -> None:
    from stepcal.costmodel.compose import per_token_terms_ms
    from stepcal.costmodel.resolution import resolution_of_directory, summary
    every = np.arange(1.0, 8193.0)
    regressor = per_token_terms_ms(result, spec, parallelism, every)["linear"]
    print("\n2. table vs summed regressor predictions, |table / regressor - 1| (P50 / P99 / max, %):")
    for name, directory in tables.items():
        stats = summary(resolution_of_directory(directory))
        term = linear_term(directory)
        between = np.abs(np.interp(every, term.knots, term.time_ms) / regressor - 1) * 100
        parts = [f"{kind} {s['p50_pct']:.2f} / {s['p99_pct']:.2f} / {s['max_pct']:.2f} (n={s['n']})"
                 for kind, s in ((k, stats[k]) for k in ("measured", "chunk", "linear", "lm_head"))]
        print(f"   {name:<8} " + ";  ".join(parts))
        print(f"   {'':<8} every integer 1..8192 (linear) {np.percentile(between, 50):.2f} / "
              f"{np.percentile(between, 99):.2f} / {between.max():.2f}")


def report_values(data: pd.Series, regressor: pd.Series, tables: dict[str, Path]) -> None:
    print("\n3. linear + elementwise terms, ms per step (32 layers + embedding):")
    print(f"   {'tokens':>6} {'data':>8} {'regressor':>10}" + "".join(f" {n:>16}" for n in tables))
    shown = np.asarray(SHOWN_TOKENS, dtype=np.float64)
    values = {name: layer_table_ms(d, shown) for name, d in tables.items()}
    for i, x in enumerate(SHOWN_TOKENS):
        cells = "".join(f" {float(v[i]):9.2f} ({float(v[i]) / data[x] - 1:+5.1%})" for v in values.values())
        print(f"   {x:>6} {data[x]:8.2f} {regressor[x]:10.2f}{cells}")


def simulate_s(directory: Path, trace: Path, out: Path) -> tuple[float, dict]:
    """Wall time of one `stepcal simulate` in its own process, and its summary.json."""
    command = [str(Path(sys.executable).parent / "stepcal"), "simulate", "--trace", str(trace),
               "--scheduler", "sarathi", "--chunk-size", "512", "--step-model", str(directory),
               "--quiet", "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    return time.perf_counter() - started, json.loads((out / "summary.json").read_text())


def report_simulate(tables: dict[str, Path], trace: Path, repeats: int, scratch: Path) -> None:
    walls: dict[str, list[float]] = {name: [] for name in tables}
    summaries = {}
    for i in range(repeats):
        for name, directory in tables.items():      # interleaved: drift on a shared machine hits both
            wall, summaries[name] = simulate_s(directory, trace, scratch / f"sim_{name}_{i}")
            walls[name].append(wall)
    print(f"\n4. stepcal simulate, {trace.name}, sarathi chunk 512, {repeats} runs each, interleaved:")
    for name, values in walls.items():
        print(f"   {name:<8} median {np.median(values):6.2f} s  (runs: {', '.join(f'{v:.2f}' for v in values)})"
              f"   {_headline(summaries[name])}")


def _headline(summary: dict) -> str:
    """The simulated run's loop time, steps and latencies: finer tables change the schedule."""
    per_step_us = summary["sim_wall_s"] / summary["num_steps"] * 1e6
    return (f"loop {summary['sim_wall_s']:.2f} s, {summary['num_steps']} steps ({per_step_us:.1f} us each), TTFT P50 "
            f"{summary['ttft_ms']['p50']:.1f} ms, TPOT P50 {summary['tpot_ms']['p50']:.2f} ms")


def report_lookups(tables: dict[str, Path], n: int = 200_000, seed: int = 0) -> None:
    from bench_lookups import batches  # this folder: the same random batches as bench_lookups times

    from stepcal.costmodel.tables import load_step_model
    features, _, rows = batches(seed, n, 20_000)
    print(f"\n5. lookups alone ({n} random batches vectorised, {len(rows)} one at a time):")
    for name, directory in tables.items():
        model = load_step_model(directory)
        vectorised = _best_s(lambda m=model: m.features_ms(features)) / n * 1e9
        scalar = _best_s(lambda m=model: [m.row_ms(r) for r in rows]) / len(rows) * 1e9
        print(f"   {name:<8} features_ms {vectorised:6.1f} ns per batch   row_ms {scalar:6.0f} ns per call")


def _best_s(call, repeats: int = 5) -> float:
    """The fastest of a few runs: the least disturbed by other work on a shared machine."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--model-spec", default="llama-3-8b")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the two table directories here (else a temporary one)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from stepcal.core.model_files import load_model_spec
    from stepcal.core.model_spec import Parallelism
    from stepcal.costmodel.build import build_tables
    from stepcal.costmodel.compose import Axes

    spec, parallelism = load_model_spec(args.model_spec), Parallelism(tp=1)
    started = time.perf_counter()
    result = fit(args.profile, spec, parallelism)
    print(f"{args.profile}\nfit (rf, {args.model_spec}): {time.perf_counter() - started:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = args.keep or Path(tmp)
        tables = {"before": scratch / "tables_fixed_axes", "after": scratch / "tables_data_axes"}
        for name, axes in (("before", Axes.default()), ("after", None)):
            started = time.perf_counter()
            meta = build_tables(result, tables[name], spec=spec, parallelism=parallelism, axes=axes)
            print(f"build {name}: {time.perf_counter() - started:.1f} s, {len(meta.axes['num_tokens'])} "
                  f"num_tokens knots; rule: {meta.axes['rule']}")
        data = data_linear_ms(args.profile, spec)
        regressor = layer_regressor_ms(result, spec, parallelism, data.index.to_numpy(dtype=np.float64))
        report_data_error(data, regressor, tables)
        report_regressor_error(result, spec, parallelism, tables)
        report_values(data, pd.Series(regressor, index=data.index), tables)
        report_simulate(tables, args.trace, args.repeats, scratch)
        report_lookups(tables)


if __name__ == "__main__":
    main()
