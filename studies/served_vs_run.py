"""The engine's decode steps in an open-loop run of a measured trace against the same engine serving
the profiler's closed-loop workloads, interleaved in one process: is a miss of the profiled tables
on a campaign's run the machine's drift between profile and run, or something the served workloads
do not show (a structural gap)?

    .venv/bin/python studies/served_vs_run.py MEASURED_RUN [--rounds 3] [--seed 0]
        [--workloads continuous/c32/n64/p16-1024/o4-128 ...]

MEASURED_RUN is a `stepcal measure` directory (a campaign's measured/SCHEDULER/load_NN): its trace
is served again, open-loop on the virtual clock as the measured runs are, with its scheduler settings,
between passes of the served workloads (profiler.serve), --rounds times. A least-squares line over
(num_decode, decode_kv_sum, num_decode^2) is fitted to the served decode-only steps' device_ms (those
right after a prefill step left out); the run's decode-only steps are priced with it, split by batch
size and by whether a prefill step came just before. Run with nothing else on the machine.
"""
from __future__ import annotations

import argparse

import numpy as np

DEFAULT_WORKLOADS = ("continuous/c16/n32/p16-1024/o4-128", "continuous/c32/n64/p16-1024/o4-128",
                     "continuous/c64/n128/p16-256/o4-128")
BUCKETS = ((0, 4), (4, 16), (16, 64), (64, 1 << 20))


def decode_steps(steps, tag: int):
    """Decode-only steps of one step log, each flagged when the step before it held a prefill."""
    prefill = steps["prefill_tokens"].fillna(0).to_numpy() > 0
    out = steps.assign(after_prefill=np.r_[False, prefill[:-1]], round=tag)
    return out[~prefill & (out["num_decode"] > 0)]


def features(frame) -> np.ndarray:
    n = frame["num_decode"].to_numpy(dtype=np.float64)
    return np.c_[np.ones(len(frame)), n, frame["decode_kv_sum"].to_numpy(dtype=np.float64), n * n]


def ratios(frame, coef) -> str:
    """Measured over fitted device time, per batch-size bucket (those with at least 15 steps)."""
    predicted = features(frame) @ coef
    parts = []
    for low, high in BUCKETS:
        mask = ((frame["num_decode"] > low) & (frame["num_decode"] <= high)).to_numpy()
        if mask.sum() >= 15:
            ratio = frame["device_ms"].to_numpy()[mask].sum() / predicted[mask].sum()
            parts.append(f"{low + 1}-{high if high < 1 << 20 else 'more'} decodes {ratio:.3f} (n={mask.sum()})")
    return " | ".join(parts) or "too few steps"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measured_run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", nargs="+", default=list(DEFAULT_WORKLOADS))
    args = parser.parse_args()

    import pandas as pd
    import torch

    from stepcal.core.measured_run import read_measured_run
    from stepcal.core.model_spec import ModelSpec
    from stepcal.profiler.engine.engine import Engine, EngineConfig
    from stepcal.profiler.engine.measure import warm_up
    from stepcal.profiler.model import build_model
    from stepcal.profiler.serve import Workload, serve
    from stepcal.simulator.schedulers import SchedulerConfig
    torch.set_num_threads(1)
    run = read_measured_run(args.measured_run)
    meta = run.meta
    model = build_model(ModelSpec(**meta.model_spec), device="cpu", dtype=meta.dtype, seed=args.seed)
    warm_up(model)
    config = EngineConfig(scheduler=meta.scheduler, scheduler_config=SchedulerConfig(**meta.scheduler_config),
                          block_size=meta.block_size, prefix_caching=meta.prefix_caching_on,
                          clock="virtual", seed=meta.seed or 0)
    workloads = [Workload.parse(name) for name in args.workloads]
    served, measured = [], []
    for k in range(args.rounds):   # interleaved: a drift of the machine hits both alike
        served += [decode_steps(serve(model, w, args.seed), k) for w in workloads]
        measured.append(decode_steps(Engine(model, run.trace, config).run().steps, k))
    served_frame, run_frame = pd.concat(served), pd.concat(measured)
    fitted = served_frame[~served_frame["after_prefill"]]
    coef, *_ = np.linalg.lstsq(features(fitted), fitted["device_ms"].to_numpy(dtype=np.float64), rcond=None)
    print(f"device_ms over the served fit ({len(fitted)} served decode steps, {args.rounds} rounds):")
    print(f"  served:                      {ratios(fitted, coef)}")
    print(f"  run, after a decode step:    {ratios(run_frame[~run_frame['after_prefill']], coef)}")
    print(f"  run, after a prefill step:   {ratios(run_frame[run_frame['after_prefill']], coef)}")
    for k in range(args.rounds):
        part = run_frame[(run_frame["round"] == k) & ~run_frame["after_prefill"]]
        print(f"  round {k + 1}, run after a decode step: {ratios(part, coef)}")


if __name__ == "__main__":
    main()
