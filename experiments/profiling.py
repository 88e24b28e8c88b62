"""The work of `stepcal profile`: a kernel sweep with its settings checked (the campaign runs it too).

Imports only core.errors at load time: the command module reads OPS for its --help.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from stepcal.core.bounds import choices
from stepcal.core.errors import InputError
from stepcal.core.model_files import load_model_spec
from stepcal.core.model_spec import DTYPE_BYTES

OPS = ("gemm", "attn_prefill", "attn_decode", "step", "overhead", "host", "moe", "elementwise", "serve")
REPLAY = "replay:"     # --device replay:PROFILE (experiments.replay)


def profile_kernels(model_spec: str | None, out: str | Path | None, *, device: str = "cpu", ops: str | None = None,
                    grid: str = "quick", dtype: str | None = None, threads: int = 1, max_minutes: float | None = None,
                    shard: str = "0/1", seed: int = 0, retry_failed: bool = False, progress: bool = True,
                    rounds: int | None = None, noise=None, budget_s: float | None = None,
                    for_trace: str | None = None, trace_format: str | None = None,
                    trace_step_model: str | None = None):
    """Sweep `ops` of a model spec over a grid into OUT (resumable); returns profiler.sweep's result.
    `ops` None: every op the model has (moe for mixture-of-experts models only). `rounds`: passes
    over the grid instead of the grid's own number (the quickstart splits them over its run).
    `noise`: the sweep's profiler.noise_policy.NoisePolicy (None: the device's). `budget_s`: a
    budgeted adaptive campaign over the grid's points instead (experiments.budget.campaign),
    weighted by where the steps of the trace `for_trace` land (experiments.budget.trace_weights)."""
    from stepcal.profiler.grid import load_grid, ops_for, parse_shard  # lazy: loads numpy

    if not model_spec:
        raise InputError("profile: --model-spec is required")
    if not out:
        raise InputError("profile: --out is required")
    if threads < 1:
        raise InputError(f"--threads: must be at least 1, got {threads}")
    if max_minutes is not None and max_minutes <= 0:
        raise InputError(f"--max-minutes: must be positive, got {max_minutes:g}")
    if budget_s is not None and not budget_s > 0:
        raise InputError(f"--budget-s: must be positive, got {budget_s:g}")
    if (for_trace is not None or trace_step_model is not None) and budget_s is None:
        raise InputError("--for-trace: weights a budgeted campaign; give --budget-s too")
    op_names = parse_ops(ops) if ops else None
    shard_part = parse_shard(shard)
    spec = load_model_spec(model_spec)
    op_names = op_names or ops_for(spec, OPS)
    dtype = resolve_dtype(dtype, device)
    points = load_grid(grid, spec).for_ops(op_names)
    if not points.points:
        raise InputError(f"--grid {grid}: no points for ops {','.join(op_names)}")
    if rounds is not None:
        points = replace(points, timing={**points.timing, "rounds": rounds})

    from stepcal.profiler.sweep import SweepConfig, run_sweep  # lazy: loads numpy, pandas, tqdm
    config = SweepConfig(spec=spec, device=device, dtype=dtype, ops=op_names, grid=points,
                         num_threads=threads, shard=shard_part, seed=seed, noise=noise)
    if budget_s is not None:
        return budget_campaign(config, out, budget_s, max_minutes,
                               target_trace(for_trace, trace_format, trace_step_model))
    if device.startswith(REPLAY):
        from stepcal.experiments.replay.sweep import run_replay_sweep  # lazy: loads pandas, scipy
        replay = load_replay(device, spec, op_names, dtype)
        return run_replay_sweep(config, out, replay, max_minutes=max_minutes, retry_failed=retry_failed)
    return run_sweep(config, out, max_minutes=max_minutes, retry_failed=retry_failed, progress=progress)


def target_trace(for_trace: str | None, trace_format: str | None, step_model: str | None):
    """The simulated step log of --for-trace (experiments.budget.trace_weights); None without one."""
    if for_trace is None:
        return None
    from stepcal.experiments.budget.trace_weights import DEFAULT_TRACE_STEP_MODEL, trace_weighting  # lazy: loads pandas
    return trace_weighting(for_trace, trace_format, step_model or DEFAULT_TRACE_STEP_MODEL)


def budget_campaign(config, out, budget_s: float, max_minutes: float | None, for_trace=None):
    """The budgeted adaptive campaign of `stepcal profile --budget-s` on the config's device,
    weighted by `for_trace` (a trace_weights.TraceWeighting) where given."""
    from stepcal.experiments.budget.campaign import run_budget_campaign  # lazy: loads pandas, sklearn
    if config.device.startswith(REPLAY):
        from stepcal.experiments.replay.sweep import ReplayMeasurer  # lazy: loads pandas, scipy
        measurer = ReplayMeasurer(config, load_replay(config.device, config.spec, config.ops, config.dtype))
        return run_budget_campaign(config, out, budget_s, measurer, max_minutes=max_minutes, for_trace=for_trace)
    from stepcal.experiments.budget.measurers import DeviceMeasurer  # lazy: loads torch, numpy, pandas, tqdm
    from stepcal.profiler.sweep import _check_device  # lazy: loads pandas
    from stepcal.profiler.timing import torch_threads  # lazy: loads numpy
    _check_device(config.device)
    with torch_threads(config.num_threads):
        return run_budget_campaign(config, out, budget_s, DeviceMeasurer(config), max_minutes=max_minutes,
                                   for_trace=for_trace)


def plan_profile(model_spec: str | None, device: str, *, ops: str | None = None, grid: str = "quick",
                 dtype: str | None = None, budget_s: float | None = None):
    """The plan of `stepcal profile` with these settings (experiments.budget.plan), before any
    device time; `budget_s`: the budget's share of the grid per op."""
    from stepcal.profiler.grid import load_grid, ops_for  # lazy: loads numpy

    if not model_spec:
        raise InputError("profile plan: --model-spec is required")
    if budget_s is not None and not budget_s > 0:
        raise InputError(f"--budget-s: must be positive, got {budget_s:g}")
    spec = load_model_spec(model_spec)
    op_names = parse_ops(ops) if ops else ops_for(spec, OPS)
    dtype = resolve_dtype(dtype, "cpu" if device == "cpu" else "cuda")   # a GPU's by default
    points = load_grid(grid, spec).for_ops(op_names)
    from stepcal.experiments.budget.plan import Plan, kernel_time_source, plan_campaign  # lazy: loads pandas, scipy
    price, source = kernel_time_source(device, spec, dtype)
    return Plan(device, source, budget_s, plan_campaign(points, spec, price, budget_s))


def load_replay(device: str, spec, op_names, dtype: str):
    """The replay device `replay:PROFILE`, checked to hold every op asked for at the dtype."""
    from stepcal.experiments.replay.device import ReplayDevice  # lazy: loads pandas, scipy
    replay = ReplayDevice.load(device[len(REPLAY):], spec)
    replay.check_ops(op_names, dtype)
    return replay


def describe_sweep(result) -> str:
    """The line `stepcal profile` prints when a sweep stops."""
    if hasattr(result, "budget_s"):
        from stepcal.experiments.budget.campaign import describe_budget  # lazy: loads pandas, sklearn
        return describe_budget(result)
    if hasattr(result, "num_interpolated"):
        from stepcal.experiments.replay.sweep import describe_replay  # lazy: loads pandas, scipy
        return describe_replay(result)
    state = "complete" if result.complete else "incomplete (run again to resume)"
    rounds = f" x {result.rounds} rounds" if result.rounds > 1 else ""
    return (f"{result.out}/profile.parquet: {result.num_points} points{rounds}, "
            f"{result.num_measured} measured now ({result.num_done_before} points done before{_reused(result)}), "
            f"{result.num_failed} failed; {state}; {result.elapsed_s:.1f} s")


def _reused(result) -> str:
    """Measurements kept from earlier runs beyond whole points (a sweep stopped mid-pass)."""
    partial = result.num_reused - result.num_done_before * result.rounds
    return f", {result.num_reused} measurements reused" if partial > 0 else ""


def parse_ops(text: str) -> tuple[str, ...]:
    try:
        return choices(text, OPS)
    except InputError as exc:
        raise InputError(f"--ops: {exc}") from None


def resolve_dtype(dtype: str | None, device: str) -> str:
    if dtype is None:
        return "bfloat16" if device.startswith(("cuda", REPLAY)) else "float32"
    canonical = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
    if canonical not in ("float32", "bfloat16", "float16"):
        known = "float32, bfloat16, float16"
        hint = " (not supported by the torch model)" if dtype in DTYPE_BYTES else ""
        raise InputError(f"--dtype: {dtype!r}{hint}; choose from {known}")
    return canonical
