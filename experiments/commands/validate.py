"""`stepcal validate`: how far is the simulator from a measured run of the same workload?"""
from __future__ import annotations

import argparse

HELP = """Replay a measured run (from `stepcal measure`) in the simulator with the same trace, scheduler
settings and KV capacity, timing each step with --step-model, and report for TTFT, TPOT, ITL and
E2E the measured and simulated mean, P50, P90, P95, P99 and the relative error of each (with the
measured run-to-run noise floor beside it when the run has repeats), the throughput error, and the
step-level error (MAPE of predicted vs measured step time on the measured step log).
Writes OUT/validation.json, OUT/validation.md, OUT/simulated_requests.parquet (the simulated request
log) and OUT/step_predictions.parquet (each measured step: features, measured_ms, predicted_ms)."""


def register(subparsers) -> None:
    p = subparsers.add_parser("validate", help="compare the simulator with a measured run",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--measured", required=True, help="directory written by `stepcal measure`")
    p.add_argument("--step-model", required=True, help="const:MS, linear:A,B,C or a T_step table directory")
    p.add_argument("--step-overhead-ms", type=float, default=0.0, help="host time added to every simulated step")
    p.add_argument("--out", default=None, help="output directory (default: MEASURED/validation)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from experiments.step_models import request_overhead_ms, resolve_step_model
    from experiments.validation import (
        compare,
        format_table,
        load_measured_run,
        predict_steps,
        sim_config_for,
        step_level_error,
        step_matched_errors,
        step_noise_floor,
    )
    from simulator.io import atomic_output_dir, atomic_write_bytes, atomic_write_json, atomic_write_parquet
    from simulator.simulation import simulate

    measured = load_measured_run(args.measured)
    model = resolve_step_model(args.step_model)
    config = sim_config_for(measured, args.step_overhead_ms, request_overhead_ms(model))
    result = simulate(measured.trace, model, config)
    predicted = predict_steps(model, measured.steps)
    step_error = step_level_error(model, measured.steps, predicted)
    step_error["noise_floor"] = step_noise_floor(measured)
    record = compare(measured, result.requests, result.summary, step_error)
    record["step_model"] = args.step_model
    record["step_matched"] = step_matched_errors(measured, model, step_error, config)
    table = format_table(record)
    out = Path(args.out) if args.out else Path(args.measured) / "validation"
    with atomic_output_dir(out) as staging:
        atomic_write_json(staging / "validation.json", record)
        atomic_write_bytes(staging / "validation.md", (table + "\n").encode())
        atomic_write_parquet(result.requests, staging / "simulated_requests.parquet")
        step_columns = [c for c in measured.steps.columns if c not in ("request_ids", "q_lens", "kv_lens")]
        steps = measured.steps[step_columns].rename(columns={"duration_ms": "measured_ms"})
        atomic_write_parquet(steps.assign(predicted_ms=predicted), staging / "step_predictions.parquet")
    if not args.quiet:
        print(table)
        print(f"wrote {out}/validation.json and validation.md")
    return 0
