"""Benchmark: T_step table lookups, old vs new, in one process (issue 19). Prints figures.

Tables from one random-forest fit (`--regressor rf`, the record selection of `stepcal fit
--model-spec llama-3-8b`) of Vidur's Llama-3-8B A100 mlp.csv, built on the fixed log grid
(Axes.default(): 66 num_tokens knots) and on the data's axes (costmodel.axes: ~9x the knots).
Four ways to look them up:
  fixed/search   the fixed grid, binary search       (the old 66-knot lookups)
  data/search    the data's axes, binary search      (the finer tables before the index)
  data/index     the data's axes, SegmentIndex       (now)
  fixed/index    the fixed grid, SegmentIndex
The same random batches for all: num_seqs 1-255, num_tokens num_seqs + 0-511. Three paths:
features_ms on 200,000 batches (ns per batch), features_ms on 64 batches a call (a decode run; us
per call), and row_ms one batch at a time (the simulator's one-step path; ns per call). Every round
times each way once, in turn (drift on a shared machine hits all alike); medians over the rounds,
with the 10th-90th percentile range.

Usage: .venv/bin/python bench/bench_lookups.py [--rounds 30] [--profile mlp.csv]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PROFILE = REPO.parent / "shared/data/profiles/vidur/a100/meta-llama/Meta-Llama-3-8B/mlp.csv"
NUM_BATCHES = 200_000
RUN_BATCHES = 64
NUM_ROWS = 20_000


def tables(profile: Path, scratch: Path) -> dict:
    """{"fixed": TableStepModel, "data": TableStepModel} from one fit."""
    from stepcal.core.model_files import load_model_spec
    from stepcal.core.model_spec import Parallelism
    from stepcal.costmodel.axes import Axes
    from stepcal.costmodel.build import build_tables, composed_ops
    from stepcal.costmodel.fitting import FitConfig, dtypes_for, fit_all, select_records
    from stepcal.costmodel.importers import load_profiles
    from stepcal.costmodel.tables import load_step_model
    spec, parallelism = load_model_spec("llama-3-8b"), Parallelism(tp=1)
    records = select_records(load_profiles([str(profile)], "auto"), dtype=dtypes_for(spec),
                             ops=composed_ops(spec, parallelism))
    started = time.perf_counter()
    result = fit_all(records, FitConfig(regressor="rf"))
    print(f"{profile}\nfit (rf, llama-3-8b): {time.perf_counter() - started:.1f} s")
    models = {}
    for name, axes in (("fixed", Axes.default()), ("data", None)):
        build_tables(result, scratch / name, spec=spec, parallelism=parallelism, axes=axes)
        models[name] = load_step_model(scratch / name)
        knots = {t.name: len(t.knots) for t in models[name].terms}
        print(f"tables on the {name} axes: terms {knots} (knots)")
    return models


def ways(models: dict) -> dict:
    """The four lookups: each table directory with and without the segment index."""
    from stepcal.costmodel.tables import TableStepModel

    def searched(model):
        return TableStepModel([dataclasses.replace(t, indexed=False) for t in model.terms], model.meta)
    return {"fixed/search": searched(models["fixed"]), "data/search": searched(models["data"]),
            "data/index": models["data"], "fixed/index": models["fixed"]}


def batches(seed: int = 0, num_batches: int = NUM_BATCHES, num_rows: int = NUM_ROWS):
    """Random decode-heavy batches: all of them as one StepFeatures, the first RUN_BATCHES as another,
    and the first num_rows as feature rows (bench_table_resolution times the same)."""
    from stepcal.core.batch import FEATURE_NAMES, StepFeatures
    rng = np.random.default_rng(seed)
    seqs = rng.integers(1, 256, num_batches).astype(np.float64)
    columns = {name: np.zeros(num_batches) for name in FEATURE_NAMES}
    columns.update(num_seqs=seqs, num_decode=seqs, num_tokens=seqs + rng.integers(0, 512, num_batches),
                   decode_kv_sum=seqs * rng.integers(1, 4096, num_batches))
    every = StepFeatures.from_columns(columns)
    run = StepFeatures.from_columns({name: c[:RUN_BATCHES] for name, c in columns.items()})
    rows = [tuple(float(columns[name][i]) for name in FEATURE_NAMES) for i in range(num_rows)]
    return every, run, rows


def timed_s(call, number: int = 1) -> float:
    started = time.perf_counter()
    for _ in range(number):
        call()
    return (time.perf_counter() - started) / number


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    with tempfile.TemporaryDirectory() as tmp:
        lookups = ways(tables(args.profile, Path(tmp)))
    every, run, rows = batches()
    reference = lookups["data/search"].features_ms(every)
    assert np.array_equal(lookups["data/index"].features_ms(every), reference), "the index changed the bits"
    figures = {name: {"vectorised": [], "run": [], "scalar": []} for name in lookups}
    for _ in range(args.rounds):
        for name, model in lookups.items():     # interleaved: each round times every way once
            figures[name]["vectorised"].append(timed_s(lambda m=model: m.features_ms(every)) / NUM_BATCHES * 1e9)
            figures[name]["run"].append(timed_s(lambda m=model: m.features_ms(run), number=200) * 1e6)
            figures[name]["scalar"].append(timed_s(lambda m=model: [m.row_ms(r) for r in rows]) / NUM_ROWS * 1e9)
    print(f"\nlookups, median of {args.rounds} interleaved rounds (10th-90th percentile):")
    units = {"vectorised": f"ns per batch ({NUM_BATCHES} a call)", "run": f"us per call of {RUN_BATCHES} batches",
             "scalar": "ns per row_ms call"}
    for path, unit in units.items():
        print(f"  {path}: {unit}")
        for name, by_path in figures.items():
            p10, p50, p90 = np.percentile(by_path[path], [10, 50, 90])
            print(f"    {name:<13} {p50:8.1f}   ({p10:.1f}-{p90:.1f})")


if __name__ == "__main__":
    main()
