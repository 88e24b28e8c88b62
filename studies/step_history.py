"""Does a step's time depend only on its batch? Two measurements of the history a T_step table cannot see.

    .venv/bin/python studies/step_history.py --rounds 6          # the engine's model, in isolation
    .venv/bin/python studies/step_history.py --campaign runs/quickstart   # a quickstart's own logs
    .venv/bin/python studies/step_history.py --cache --rounds 6   # the same step, caches warm or cold

1. Interleave: one 1-sequence decode step timed back to back, with a 128-token prefill (another
   request's) run every N decode steps. If step time were a function of the batch alone, the
   mean decode time would not depend on N.
2. Campaign: the tables of a quickstart directory against every measured run's step log:
   Σ measured / Σ predicted per run and, for decode-only steps, per batch size. The tables are
   fitted on the lowest load; a ratio that moves with the load, for the same batch sizes, is
   step time the batch does not explain.
3. Cache: the same 1-sequence decode step back to back, and after reading a buffer of 4 MB (the
   size of the L2 caches) or 64 MB (twice this VM's shared L3) that evicts the weights (10 MB for
   `tiny` in fp32). If the step runs cold in the engine, and other tenants of the L3 and of memory
   bandwidth decide how cold, its time follows what ran before it and the machine's load.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

INTERVALS = (3, 5, 10, 20, 50, 200)


def decode_model(model_spec: str):
    """The model on one thread, and one request's cache holding 100 tokens."""
    import torch

    from stepcal.core.model_files import load_model_spec
    from stepcal.profiler.model import build_model
    torch.set_num_threads(1)
    model = build_model(load_model_spec(model_spec))
    cache = model.new_cache()
    with torch.inference_mode():
        model.forward_step([torch.arange(100) % model.spec.vocab_size], [cache], [True])
    return model, cache


def decode_step_s(model, cache) -> float:
    """One 1-sequence decode step on top of the cache's first 100 tokens, in seconds."""
    import torch
    cache.truncate(100)
    t0 = time.perf_counter()
    model.forward_step([torch.tensor([1])], [cache], [True])
    return time.perf_counter() - t0


def interleave(model_spec: str, rounds: int) -> dict[int, list[float]]:
    """Mean decode step time (ms) per prefill interval N, one value per round (rounds interleave the Ns)."""
    import torch
    model, decode_cache = decode_model(model_spec)
    prefill_cache = model.new_cache()
    prompt = torch.arange(128) % model.spec.vocab_size
    means: dict[int, list[float]] = {n: [] for n in INTERVALS}
    with torch.inference_mode():
        for _ in range(rounds):
            for n in INTERVALS:
                times = []
                for _ in range(max(600 // n, 3)):
                    prefill_cache.truncate(0)
                    model.forward_step([prompt], [prefill_cache], [True])
                    times += [decode_step_s(model, decode_cache) for _ in range(n)]
                means[n].append(1000.0 * sum(times) / len(times))
    return means


CACHE_CASES = {"back to back": 0, "after a 4 MB read": 4 << 20, "after a 64 MB read": 64 << 20}


def cache_state(model_spec: str, rounds: int) -> dict[str, list[float]]:
    """Median 1-sequence decode step time (ms) per case, one value per round (rounds interleave the cases)."""
    import statistics

    import torch
    model, cache = decode_model(model_spec)
    buffers = {name: torch.ones(size // 4) for name, size in CACHE_CASES.items() if size}
    medians: dict[str, list[float]] = {name: [] for name in CACHE_CASES}
    with torch.inference_mode():
        for _ in range(rounds):
            for name in CACHE_CASES:
                times = []
                for _ in range(150):
                    if name in buffers:
                        buffers[name].sum()          # reads the whole buffer through the caches
                    times.append(decode_step_s(model, cache))
                medians[name].append(1000.0 * statistics.median(times))
    return medians


def campaign(root: Path) -> list[str]:
    import numpy as np
    import pandas as pd

    from stepcal.experiments.step_models import resolve_step_model
    from stepcal.experiments.validation.measured import load_measured_run
    from stepcal.experiments.validation.steps import predict_steps
    model = resolve_step_model(str(root / "tables"))
    bins = [0, 1, 2, 4, 8, 16, 1 << 20]
    lines = ["| run | Σ measured / Σ predicted | decode-only steps by batch size: 1, 2, 3-4, 5-8, 9-16, >16 |",
             "|---|---|---|"]
    for run in sorted(p for p in (root / "measured").glob("*/*") if p.is_dir() and not p.name.startswith(".")):
        steps = load_measured_run(run).steps      # every repeat's step log
        steps["predicted_ms"] = predict_steps(model, steps)
        decode = steps[steps["prefill_tokens"] == 0]
        size = pd.cut(decode["num_seqs"], bins)
        by_size = decode.groupby(size, observed=False)
        ratios = by_size["duration_ms"].sum() / by_size["predicted_ms"].sum()
        cells = " / ".join("-" if not np.isfinite(r) else f"{r:.2f}" for r in ratios)
        total = steps["duration_ms"].sum() / steps["predicted_ms"].sum()
        lines.append(f"| {run.parent.name} {run.name} | {total:.3f} | {cells} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-spec", default="tiny")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--campaign", type=Path, default=None, help="a quickstart output directory")
    parser.add_argument("--cache", action="store_true", help="the same decode step with the caches warm or cold")
    args = parser.parse_args()
    if args.campaign is not None:
        print("\n".join(campaign(args.campaign)))
        return 0
    if args.cache:
        rows = cache_state(args.model_spec, args.rounds)
        print("\n".join(rounds_table("1-sequence decode step", "median", rows, "back to back")))
    else:
        rows = interleave(args.model_spec, args.rounds)
        print("\n".join(rounds_table("prefill every N decode steps", "mean decode step", rows, INTERVALS[-1])))
    return 0


def rounds_table(case: str, statistic: str, rows: dict, reference) -> list[str]:
    """Markdown: per case, the median over rounds (ms), its ratio to the reference case, every round."""
    import statistics
    ref = statistics.median(rows[reference])
    lines = [f"| {case} | {statistic} (ms), median of rounds | / {reference} | rounds |", "|---|---|---|---|"]
    for name, values in rows.items():
        m = statistics.median(values)
        lines.append(f"| {name} | {m:.3f} | {m / ref:.2f} | {' '.join(f'{v:.2f}' for v in values)} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
