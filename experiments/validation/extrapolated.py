"""Measured steps beyond the batches a step model's whole steps were fitted on.

Tables fitted on whole steps (the profiler's step, host and served rows, or engine step logs) price a
batch of more sequences or tokens than any training row by extrapolating their curves. On the CPU
quickstart, decodes past the 64 its served workloads held were priced 10-20% high, and at 90% load
those steps made most of a run's misses. `validate` says how much of the measured step time fell
there, so that such a miss is not read as the model's error where it was fitted.
"""
from __future__ import annotations

import numpy as np

from stepcal.experiments.step_models import tables_meta


def beyond_fitted(model, steps) -> dict | None:
    """{"max_fitted": {feature: max}, "num_steps", "share_of_steps", "share_of_time"}: the measured
    steps with num_seqs or num_tokens above the maximum of the tables' `step` training rows
    (meta.json `fitted_range`, costmodel.build.fitted_ranges), read from the step model's tables as
    loaded (under calibrated host terms too). None without a step log, or for a model without that
    record (const: and linear: models, tables fitted before it was kept)."""
    ranges = (tables_meta(model).fitted_range or {}).get("step") or {}
    if steps is None or not len(steps):
        return None
    max_fitted = {f: float(hi) for f, (_, hi) in ranges.items() if f in steps}
    if not max_fitted:
        return None
    beyond = np.zeros(len(steps), dtype=bool)
    for feature, high in max_fitted.items():
        beyond |= steps[feature].to_numpy(dtype=np.float64) > high
    duration = steps["duration_ms"].to_numpy(dtype=np.float64)
    total = float(duration.sum())
    return {"max_fitted": max_fitted, "num_steps": int(beyond.sum()), "share_of_steps": float(beyond.mean()),
            "share_of_time": float(duration[beyond].sum()) / total if total > 0 else 0.0}


def describe_beyond(block: dict | None) -> str | None:
    """validation.md's warning line, where some measured steps were beyond the fitted batches."""
    if not block or not block.get("num_steps"):
        return None
    limits = " and ".join(f"{int(high)} {feature.removeprefix('num_')}"
                          for feature, high in block["max_fitted"].items())
    return (f"warning: {block['num_steps']} measured steps ({100 * block['share_of_time']:.1f}% of the measured "
            f"step time) hold more sequences or tokens than the tables' whole steps were fitted on (at most "
            f"{limits}): their prices are extrapolated; profile bigger batches (a grid's [serve] concurrency)")
