"""The step's parts (docs/design.md, "The step's four parts"): how much of the predicted step time over
a run's steps is kernels, element-wise work and host time, and what the front end adds per request.

A table's terms each belong to one part by name; calibrated host terms (per step, sequence and
token) are host time. A whole-step term fitted to measured steps holds every part at once and is
reported as such ("whole_step"), not guessed apart.
"""
from __future__ import annotations

import numpy as np

from stepcal.core.batch import StepFeatures
from stepcal.simulator.step_model import HostTermsModel, ScaledStepModel

PARTS = ("kernels", "elementwise", "host", "whole_step")
PART_OF_TERM = {"elementwise": "elementwise", "sampling": "elementwise", "kv_store": "elementwise",
                "host": "host", "overhead": "host",
                "step": "whole_step"}      # every other term (GEMMs, attention, experts, collectives): kernels


def term_parts_ms(model, features) -> dict[str, np.ndarray] | None:
    """The model's time per part for each batch, or None for a model without terms (const:, linear:)."""
    if isinstance(model, ScaledStepModel):
        parts = term_parts_ms(model.base, features)
        return None if parts is None else {k: v * model.factor for k, v in parts.items()}
    if isinstance(model, HostTermsModel):
        parts = term_parts_ms(model.base, features)
        if parts is None:
            return None
        parts = {k: v * model.terms.base_scale for k, v in parts.items()}
        extra = model._extra(features.num_seqs, features.num_tokens) * np.ones(len(features))
        return {**parts, "host": parts.get("host", 0.0) + extra}
    if not hasattr(model, "term_ms"):
        return None
    parts: dict[str, np.ndarray] = {}
    for name, values in model.term_ms(features).items():
        part = PART_OF_TERM.get(name, "kernels")
        parts[part] = parts.get(part, 0.0) + values
    return parts


def step_split(model, steps, front_end_ms: float | None) -> dict | None:
    """Predicted ms per part summed over the measured steps' batches, their shares, and the front end's
    mean delay per request (TTFT and E2E only: not step time). None without a step log or terms."""
    if steps is None or not len(steps):
        return None
    parts = term_parts_ms(model, StepFeatures.from_columns(steps))
    if parts is None:
        return None
    totals = {part: float(np.sum(parts[part])) for part in PARTS if part in parts}
    whole = sum(totals.values())
    split = {"total_ms": totals, "share": {part: (ms / whole if whole > 0 else None) for part, ms in totals.items()},
             "num_steps": int(len(steps)), "front_end_ms_per_request": front_end_ms}
    scale = _base_scale(model)
    return {**split, "base_scale": scale} if scale != 1.0 else split


def _base_scale(model) -> float:
    """The calibrated scale on the model's base (HostTerms.base_scale; 1 without one)."""
    while not isinstance(model, HostTermsModel) and hasattr(model, "base"):
        model = model.base
    return model.terms.base_scale if isinstance(model, HostTermsModel) else 1.0


def mean_front_end_ms(front, trace, simulated_requests, seed: int) -> float | None:
    """The front end's mean delay per request in a simulated run (None without a front end): its
    fixed and per-token parts from the trace, its per-stream part from the streams the simulated
    run had in the system at each arrival (arrived before it, not finished by then)."""
    if front.is_zero:
        return None
    delays_ms = 1000.0 * front.base_delays_s(trace.request_id, trace.num_prompt_tokens, seed)
    if front.per_stream_ms > 0:
        arrival = simulated_requests["arrival_s"].to_numpy(dtype=np.float64)
        finish = np.sort(simulated_requests["finish_s"].to_numpy(dtype=np.float64))   # NaN (never) last
        started = np.searchsorted(np.sort(arrival), arrival, side="left")
        ended = np.searchsorted(finish, arrival, side="right")
        delays_ms = delays_ms.mean() + front.per_stream_ms * np.maximum(started - ended, 0)
    return float(np.mean(delays_ms))


def describe_split(split: dict | None) -> str | None:
    """One line for validation.md."""
    if not split:
        return None
    names = {"kernels": "kernels", "elementwise": "element-wise", "host": "host", "whole_step": "whole steps"}
    shares = ", ".join(f"{names[p]} {100 * s:.0f}%" for p, s in split["share"].items() if s is not None)
    line = f"predicted step time over the measured steps: {shares}"
    if split.get("base_scale"):
        line += f"; the base's times x {split['base_scale']:.3f} (calibrated: it priced the calibration run too slow)"
    front = split.get("front_end_ms_per_request")
    if front:
        line += f"; front end {front:.3g} ms per request (TTFT and E2E)"
    return line
