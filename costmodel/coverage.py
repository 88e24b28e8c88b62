"""Where composition asks a regressor about shapes its data do not hold: the notes meta.json carries
(each says whether the time is interpolated between measured shapes or extrapolated beyond them)."""
from __future__ import annotations

import pandas as pd

from stepcal.core.model_spec import ModelSpec, Parallelism
from stepcal.costmodel.compose import gemm_dtype_notes, moe_target
from stepcal.costmodel.compose_comm import Composition
from stepcal.costmodel.features import assign_targets

# The one MLA shape AIConfigurator's tables are measured at (DeepSeek-V3's).
MLA_TABLE_SHAPE = {"kv_latent_dim": 512, "rope_head_dim": 64, "head_dim": 128}


def coverage_notes(result, spec: ModelSpec, parallelism: Parallelism, composition: Composition) -> list[str]:
    notes = _gemm_notes(result.records, spec, parallelism) + gemm_dtype_notes(result, spec)
    target = moe_target(result, spec, composition)
    if target is not None:
        notes += _shape_notes(_rows(result.records, target), "MoE experts", {
            "width": spec.hidden_size, "expert_ffn_size": spec.expert_ffn_size, "num_experts": spec.num_experts,
            "experts_per_token": spec.experts_per_token, "tp": parallelism.moe_tp, "ep": parallelism.ep})
    if spec.is_mla:
        odd = {k: getattr(spec, k) for k, v in MLA_TABLE_SHAPE.items() if getattr(spec, k) != v}
        if odd:
            notes.append(f"MLA attention is measured at DeepSeek-V3's shape {MLA_TABLE_SHAPE}; this model has "
                         f"{odd}: its attention time is that shape's, not scaled")
        for target in ("mla_decode", "mla_prefill"):
            notes += _shape_notes(_rows(result.records, target), target,
                                  {"num_heads": parallelism.split(spec.num_heads), "tp": parallelism.tp})
    return notes


def _rows(records: pd.DataFrame, target: str) -> pd.DataFrame:
    return records[(assign_targets(records) == target).to_numpy()]


def _shape_notes(rows: pd.DataFrame, what: str, shape: dict) -> list[str]:
    """One note if no measured row has exactly this shape: which values lie between measured ones
    (interpolated) and which beyond them (extrapolated)."""
    if not len(rows):
        return []
    exact = pd.Series(True, index=rows.index)
    for column, value in shape.items():
        exact &= rows[column] == value
    if exact.any():
        return []
    beyond = [f"{c}={v:g} (measured {rows[c].min():g}..{rows[c].max():g})" for c, v in shape.items()
              if not rows[c].min() <= v <= rows[c].max()]
    how = "extrapolated: " + ", ".join(beyond) if beyond else "interpolated between measured shapes"
    return [f"{what}: no measured row has this model's shape {shape}; its time is {how}"]


def _gemm_notes(records: pd.DataFrame, spec: ModelSpec, parallelism: Parallelism) -> list[str]:
    notes = []
    gemm = records[records["op"] == "gemm"]
    if len(gemm):
        n_max, k_max = gemm["n"].max(), gemm["k"].max()
        for name, (n, k) in spec.gemm_shapes(parallelism).items():
            if n > n_max or k > k_max:
                notes.append(f"{name} GEMM (n={n:g}, k={k:g}) lies beyond the profiled shapes "
                             f"(n <= {n_max:g}, k <= {k_max:g}): its time is extrapolated")
    return notes
