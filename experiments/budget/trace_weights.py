"""`stepcal profile --budget-s S --for-trace TRACE`: per-candidate weights from where a trace's
serving steps land.

The trace is run once through the simulator (the vllm scheduler at its defaults, an unlimited KV
cache) under a cheap step model, and each step of its step log is mapped to the shapes of the ops
it runs: a GEMM (and any op sized by tokens alone) of m = num_tokens, decode attention over its
decodes (num_seqs = num_decode, decode_kv_sum), prefill attention over its prefills (their number,
prefill_tokens, and their cached context kv_sum - decode_kv_sum). Each step shape counts for the
candidate nearest to it in log(1 + size) space, within every group of candidates that share what a
step does not set (a GEMM's n and k, the heads). A candidate's weight is its count over the mean
count of its op's candidates, plus a floor, so that shapes no step reaches still draw a little of
the budget: the held-out error elsewhere does not go unwatched.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.workload import load_workload
from stepcal.experiments.budget.adaptive import axes_of
from stepcal.simulator.simulation import SimConfig, Simulation
from stepcal.simulator.step_model import parse_builtin_step_model

# about an 8B model's step on one H100 in bf16: the step log's batch shapes, not its times, matter
DEFAULT_TRACE_STEP_MODEL = "linear:8,0.03,0.00005"
WEIGHT_FLOOR = 0.05


@dataclass(frozen=True)
class TraceWeighting:
    """A target trace's step log, and the weighting it gives as meta.json's budget record names it."""
    trace: str
    step_model: str
    steps: pd.DataFrame

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def to_dict(self) -> dict:
        return {"kind": "for-trace", "trace": self.trace, "step_model": self.step_model,
                "num_steps": self.num_steps, "floor": WEIGHT_FLOOR}


def trace_weighting(trace: str, trace_format: str | None = None,
                    step_model: str = DEFAULT_TRACE_STEP_MODEL) -> TraceWeighting:
    """The step log (its aggregate columns) of `trace` simulated under `step_model`."""
    model = parse_builtin_step_model(step_model, "--trace-step-model")
    if model is None:
        raise InputError(f"--trace-step-model {step_model!r}: expected const:MS or linear:A,B,C")
    workload = load_workload(trace, trace_format=trace_format, arg_name="--for-trace")
    result = Simulation(workload, model, SimConfig(record_batches=False)).run(progress=False)
    return TraceWeighting(trace, step_model, result.steps)


def step_op_shapes(steps: pd.DataFrame, op: str) -> pd.DataFrame:
    """Per step that runs `op`: the op's size axes it sets (columns named as the candidates')."""
    if op in ("attn_decode", "mla_decode"):
        rows = steps[steps["num_decode"] > 0]
        return pd.DataFrame({"num_seqs": rows["num_decode"], "decode_kv_sum": rows["decode_kv_sum"]})
    if op in ("attn_prefill", "mla_prefill"):
        rows = steps[steps["prefill_tokens"] > 0]
        return pd.DataFrame({"num_seqs": rows["num_seqs"] - rows["num_decode"],
                             "prefill_tokens": rows["prefill_tokens"],
                             "kv_sum": rows["kv_sum"] - rows["decode_kv_sum"]})
    rows = steps[steps["num_tokens"] > 0]
    column = "m" if op == "gemm" else "num_tokens"
    return pd.DataFrame({column: rows["num_tokens"]})


def candidate_weights(candidates: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Per candidate row (a record frame, in its order): how often the steps land nearest to it,
    over its op's mean, plus WEIGHT_FLOOR; 1 for every candidate of an op no step runs."""
    weights = np.ones(len(candidates))
    for op in candidates["op"].unique():
        rows = np.flatnonzero((candidates["op"] == op).to_numpy())
        shapes = step_op_shapes(steps, op)
        if shapes.empty:
            continue
        counts = _nearest_counts(candidates.iloc[rows], shapes, op)
        if counts.sum() > 0:
            weights[rows] = counts / counts.mean() + WEIGHT_FLOOR
    return weights


def _nearest_counts(candidates: pd.DataFrame, shapes: pd.DataFrame, op: str) -> np.ndarray:
    """Per candidate of one op: the steps whose shape is nearest to it within its group."""
    axes = list(shapes.columns)
    others = [c for c in ("name", *axes_of(op)) if c not in axes and c in candidates]
    unique, step_count = np.unique(np.log1p(shapes.to_numpy(dtype=float)), axis=0, return_counts=True)
    counts = np.zeros(len(candidates))
    keyed = candidates[others].reset_index(drop=True).assign(_all=0)
    for index in keyed.groupby([*others, "_all"], dropna=False, sort=True).indices.values():
        coords = np.log1p(candidates.iloc[index][axes].to_numpy(dtype=float))
        span = np.ptp(coords, axis=0)
        scale = np.where(span > 0, span, 1.0)
        for start in range(0, len(unique), 4096):      # chunks bound the distance matrix's memory
            chunk = unique[start:start + 4096]
            distance = (((chunk[:, None, :] - coords[None, :, :]) / scale) ** 2).sum(axis=2)
            np.add.at(counts, index[np.argmin(distance, axis=1)], step_count[start:start + 4096])
    return counts
