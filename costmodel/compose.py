"""Composition: the T_step terms of a model on a device, from per-operator regressors.

T_step(batch) = Σ over layers of (dense GEMMs at Σq tokens + attention of the model's kind) + the
element-wise kernels (norms, RoPE, activation, residual adds, embedding) + the experts of
mixture-of-experts layers + LM head + sampling + overhead, and the collectives of tensor and
expert parallelism. Each term is evaluated on a grid (costmodel.tables looks it up);
grid points past the profiled range take the regressor's own extrapolation (linear in FLOPs and
bytes for the physics-informed family). The grids' knots: costmodel.axes (data_axes() builds them
from the data the regressors were fitted to). Attention terms: costmodel.compose_attention;
collectives: costmodel.compose_comm; element-wise work and sampling (measured, or a memory
roofline): costmodel.compose_elementwise.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.model_spec import ModelSpec, Parallelism
from stepcal.costmodel.additive import AdditiveGridRegressor, bootstrap_relative_spread
from stepcal.costmodel.axes import Axes, measured_values, refine_steps
from stepcal.costmodel.compose_attention import attention_terms
from stepcal.costmodel.compose_comm import (
    DEFAULT_COMPOSITION,
    Composition,
    all_reduce_ms,
    all_reduce_target,
    all_reduce_tokens,
    collective_terms,
)
from stepcal.costmodel.compose_elementwise import (
    DATA_ELEMENTWISE,
    SEQ_TERMS,
    SMALL_OPS,
    elementwise_ms,
    head_norm_pricing,
    measured_seq_terms,
    roofline_device,
    roofline_elementwise_term,
    sampling_term,
    seq_calls_per_step,
)
from stepcal.costmodel.features import FEATURE_DTYPE_BYTES, assign_targets, design, gemm_target
from stepcal.costmodel.fitting import FitResult
from stepcal.costmodel.grid_predict import predict_grid
from stepcal.costmodel.records import normalise_dtype
from stepcal.costmodel.terms import AdditiveStep, FeatureCurve, Term

OPS_COLUMNS = ["op", "num_tokens", "time_ms", "spread_ms", "layers"]
EXPERTS_OP = "moe_experts"


def _op_frame(name: str, T: np.ndarray, mean, spread, layers: int) -> pd.DataFrame:
    return pd.DataFrame({"op": name, "num_tokens": T, "time_ms": mean, "spread_ms": spread, "layers": layers})


def gemm_pricing(result: FitResult, dtype: str) -> tuple[str, str] | None:
    """(target, dtype) that prices a GEMM running in `dtype`: that dtype's own regressor where the
    fit has one per dtype; else the shared 'gemm' one, at `dtype` when its rows are of that dtype
    (or name none), else at its rows' dtype; else another dtype's, of the same width first. A
    GEMM priced at another dtype gets the wrong kernel's time, which gemm_dtype_notes reports.
    None without GEMM data."""
    dtype = normalise_dtype(dtype)
    per_dtype = {t.split(":", 1)[1]: t for t in result.targets if t.startswith(gemm_target(""))}
    if dtype in per_dtype:
        return per_dtype[dtype], dtype
    if "gemm" in result.targets:
        # Regressors loaded back without their rows (costmodel.export) price at the dtype asked.
        records = getattr(result, "records", None)
        have = [] if records is None else sorted(
            set(records.loc[records["op"] == "gemm", "dtype"].dropna()) - set(per_dtype))
        return "gemm", dtype if not have or dtype in have else have[0]
    if not per_dtype:
        return None
    width = FEATURE_DTYPE_BYTES.get(dtype)
    nearest = min(per_dtype, key=lambda d: (FEATURE_DTYPE_BYTES.get(d) != width, d))
    return per_dtype[nearest], nearest


def gemm_dtypes_priced(result: FitResult, spec: ModelSpec) -> dict[str, dict[str, str]]:
    """Per GEMM of the model: the dtype it runs in and the dtype its time was priced at."""
    out = {}
    for name, dtype in spec.gemm_dtypes().items():
        pricing = gemm_pricing(result, dtype)
        if pricing is not None:
            out[name] = {"runs_in": normalise_dtype(dtype), "priced_at": pricing[1]}
    return out


def gemm_dtype_notes(result: FitResult, spec: ModelSpec) -> list[str]:
    """One note per GEMM priced at a dtype other than the one it runs in (no rows of its dtype)."""
    return [f"{name} GEMM runs in {d['runs_in']} but the profiles hold no {d['runs_in']} GEMM rows: "
            f"its time is the {d['priced_at']} kernel's" for name, d in gemm_dtypes_priced(result, spec).items()
            if d["runs_in"] != d["priced_at"]]


def _gemm_at(result: FitResult, n, k, dtype: str, M: np.ndarray, with_spread: bool):
    """(mean, spread) of an (M x k) @ (k x n) GEMM running in `dtype`, priced by gemm_pricing."""
    target, priced = gemm_pricing(result, dtype)
    return predict_grid(result, target, dict(
        row=np.arange(len(M)), op="gemm", m=M, n=np.full(len(M), n), k=np.full(len(M), k)),
        priced, with_spread=with_spread)


def op_grids(result: FitResult, spec: ModelSpec, parallelism: Parallelism, axes: Axes,
             composition: Composition = DEFAULT_COMPOSITION) -> pd.DataFrame:
    """Per-layer time of each operator over num_tokens (the layout Vidur's mlp.csv takes), with
    the number of layers that run it per step (`layers`: 1 for the embedding)."""
    return _ops_at(result, spec, parallelism, axes.num_tokens, composition)


def _ops_at(result: FitResult, spec: ModelSpec, parallelism: Parallelism, T: np.ndarray,
            composition: Composition, with_spread: bool = True) -> pd.DataFrame:
    """op_grids() at the token counts T: one block of len(T) rows per operator, in T's order."""
    parts = []
    if gemm_pricing(result, spec.dtype) is not None:
        counts, dtypes = spec.gemm_layer_counts(), spec.gemm_dtypes()
        for name, (n, k) in spec.gemm_shapes(parallelism).items():
            if name == "lm_head":
                continue
            mean, spread = _gemm_at(result, n, k, dtypes[name], T, with_spread)
            parts.append(_op_frame(name, T, mean, spread, counts[name]))
    for name in DATA_ELEMENTWISE:
        target = f"elementwise:{name}"
        if target in result.targets:
            mean, spread = elementwise_ms(result, spec, parallelism, name, T, with_spread)
            parts.append(_op_frame(name, T, mean, spread, 1 if name == "emb" else spec.num_layers))
    for name, priced_as in head_norm_pricing(result, spec).items():
        mean, spread = elementwise_ms(result, spec, parallelism, name, T, with_spread, priced_as)
        parts.append(_op_frame(name, T, mean, spread, spec.num_layers))
    experts = _experts_ops(result, spec, parallelism, T, composition, with_spread)
    if experts is not None:
        parts.append(experts)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=OPS_COLUMNS)


def moe_target(result: FitResult, spec: ModelSpec, composition: Composition) -> str | None:
    """The experts' regressor for the chosen routing distribution (unchosen: balanced where the data
    have it, else the least skewed power law); None where no MoE data was fitted."""
    if not spec.is_moe:
        return None
    have = sorted((t.split(":", 1)[1] for t in result.targets if t.startswith("moe:")), key=_skew)
    if not have:
        return None
    wanted = composition.moe_distribution
    if wanted is None:
        return f"moe:{have[0]}"
    if wanted not in have:
        raise InputError(f"--moe-distribution {wanted}: no MoE data for it; the profiles have {', '.join(have)}")
    return f"moe:{wanted}"


def _skew(distribution: str) -> float:
    """balanced first, then power laws by exponent (AIConfigurator's names: power_law_<alpha>)."""
    if distribution == "balanced":
        return 0.0
    try:
        return float(distribution.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return float("inf")


def _experts_ops(result, spec: ModelSpec, parallelism: Parallelism, T: np.ndarray,
                 composition: Composition, with_spread: bool = True) -> pd.DataFrame | None:
    """One MoE layer's routed experts (one fused kernel) over num_tokens T, on one GPU."""
    target = moe_target(result, spec, composition)
    if target is None:
        return None
    n = len(T)
    mean, spread = predict_grid(result, target, dict(
        row=np.arange(n), op="moe", name=target.split(":", 1)[1], num_tokens=T,
        width=np.full(n, float(spec.hidden_size)), expert_ffn_size=np.full(n, float(spec.expert_ffn_size)),
        num_experts=np.full(n, float(spec.num_experts)),
        experts_per_token=np.full(n, float(spec.experts_per_token)),
        tp=np.full(n, float(parallelism.moe_tp)), ep=np.full(n, float(parallelism.ep))), spec.dtype,
        with_spread=with_spread)
    return _op_frame(EXPERTS_OP, T, mean, spread, spec.num_moe_layers)


def _layer_curve(name: str, ops: pd.DataFrame, description: str, source: dict | None = None) -> FeatureCurve:
    """Σ layers × per-layer time of `ops`, by num_tokens."""
    weighted = ops.assign(time_ms=ops["time_ms"] * ops["layers"], spread_ms=ops["spread_ms"] * ops["layers"])
    sums = weighted.groupby("num_tokens")[["time_ms", "spread_ms"]].sum()
    return FeatureCurve(name, "num_tokens", sums.index.to_numpy(dtype=np.float64), sums["time_ms"].to_numpy(),
                        sums["spread_ms"].to_numpy(), description, source)


def _counts(ops: pd.DataFrame) -> pd.Series:
    """The layers (calls per step) of each operator in `ops`, in their order."""
    return ops.groupby("op", sort=False)["layers"].first()


def compose_terms(result: FitResult, spec: ModelSpec, parallelism: Parallelism, axes: Axes,
                  ops: pd.DataFrame, composition: Composition = DEFAULT_COMPOSITION) -> list[Term]:
    terms = []
    dense = ops[ops["op"] != EXPERTS_OP]
    measured_small = dense["op"].isin(SMALL_OPS).to_numpy()
    gemms, small = dense[~measured_small], dense[measured_small]
    if len(gemms):
        parts = " + ".join(f"{layers} x {op}" for op, layers in _counts(gemms).items())
        # Which dtype's kernel priced each GEMM: the router runs in the compute dtype beside
        # quantised weights (ModelSpec.gemm_dtypes).
        priced = {name: d["priced_at"] for name, d in gemm_dtypes_priced(result, spec).items()
                  if name in set(gemms["op"])}
        terms.append(_layer_curve("linear", gemms, f"GEMMs at num_tokens: {parts}",
                                  {"source": "data", "gemm_dtypes": priced}))
    device = roofline_device(result.records, composition.device_spec)
    if len(small):
        # Counted as Vidur's profiler times them: one residual add per layer, no final norm.
        counts = _counts(small)
        parts = " + ".join(f"{layers} x {op}" for op, layers in counts.items())
        terms.append(_layer_curve("elementwise", small, f"measured element-wise operators at num_tokens: {parts}",
                                  {"source": "data", "ops": list(counts.index)}))
    elif device is not None:
        terms.append(roofline_elementwise_term(spec, parallelism, axes, device))
    experts = ops[ops["op"] == EXPERTS_OP]
    if len(experts):
        routing = moe_target(result, spec, composition).split(":", 1)[1]
        terms.append(_layer_curve("moe", experts, f"{spec.num_moe_layers} MoE layers x routed experts "
                                  f"({spec.num_experts} experts, top {spec.experts_per_token}, "
                                  f"{routing} routing) at num_tokens"))
    lm = lm_head_ops(result, spec, parallelism, axes)
    if len(lm):
        # One LM-head row per sequence in the step: decodes and prompts that finish emit a token.
        terms.append(FeatureCurve("lm_head", "num_seqs", axes.num_seqs, lm["time_ms"].to_numpy(),
                                  lm["spread_ms"].to_numpy(), "LM head GEMM at one row per sequence",
                                  {"source": "data", "dtype": gemm_dtypes_priced(result, spec)["lm_head"]["priced_at"]}))
    measured_seq = measured_seq_terms(result, spec, parallelism, axes)
    terms += measured_seq
    if device is not None and "sampling" not in {t.name for t in measured_seq}:
        terms.append(sampling_term(spec, axes, device))
    terms += attention_terms(result, spec, parallelism, axes, composition.decode_skew_alpha)
    terms += collective_terms(result, spec, parallelism, axes, composition)
    if "host" in result.targets:   # the whole host path: input building is part of it
        terms.append(host_term(result))
    elif "overhead" in result.targets:
        mean, spread = _overhead_at(result, spec, axes.num_seqs)
        terms.append(FeatureCurve("overhead", "num_seqs", axes.num_seqs, mean, spread,
                                  "host overhead per step by batch size"))
    return terms


def host_term(result: FitResult) -> AdditiveStep:
    """The engine's host time per iteration (the profiler's `host` op), as its additive fit."""
    return additive_term(result, "host", "engine host path per iteration (schedule, inputs, bookkeeping): "
                         "intercept + a piecewise-linear function of each of num_seqs, num_tokens, num_decode "
                         "and prefill_tokens")


def additive_term(result: FitResult, target: str, description: str | None = None) -> AdditiveStep:
    """A target fitted by the additive regressor as its term, with the spread of its fit (a bootstrap
    of its rows, costmodel.additive.bootstrap_relative_spread) for --ranges to draw; zero for another
    regressor's fit."""
    fit = result.targets[target]
    spread = 0.0
    if isinstance(fit.estimator, AdditiveGridRegressor):
        rows = result.records[(assign_targets(result.records) == target).to_numpy()].reset_index(drop=True)
        spread = bootstrap_relative_spread(fit.estimator, design(target, rows).X,
                                           rows["time_ms"].to_numpy(dtype=float), seed=result.config.seed)
    extra = {"description": description} if description else {}
    return AdditiveStep.from_estimator(fit.estimator, target, fit.feature_names, relative_spread=spread, **extra)


def _overhead_at(result: FitResult, spec: ModelSpec, B: np.ndarray, with_spread: bool = True):
    return predict_grid(result, "overhead", dict(
        row=np.arange(len(B)), op="overhead", num_seqs=B, num_tokens=B), spec.dtype, with_spread=with_spread)


def lm_head_ops(result: FitResult, spec: ModelSpec, parallelism: Parallelism,
                axes: Axes) -> pd.DataFrame:
    return _lm_head_at(result, spec, parallelism, axes.num_seqs)


def _lm_head_at(result: FitResult, spec: ModelSpec, parallelism: Parallelism, B: np.ndarray,
                with_spread: bool = True) -> pd.DataFrame:
    dtype = spec.gemm_dtypes()["lm_head"]
    if gemm_pricing(result, dtype) is None:
        return pd.DataFrame(columns=["op", "num_tokens", "time_ms", "spread_ms"])
    n, k = spec.gemm_shapes(parallelism)["lm_head"]
    mean, spread = _gemm_at(result, n, k, dtype, B, with_spread)
    return pd.DataFrame({"op": "lm_head", "num_tokens": B, "time_ms": mean, "spread_ms": spread})


# ---------------------------------------------------------------------------- the grids' knots

def per_token_terms_ms(result: FitResult, spec: ModelSpec, parallelism: Parallelism, T: np.ndarray,
                       composition: Composition = DEFAULT_COMPOSITION) -> dict[str, np.ndarray]:
    """The per-token terms (linear, elementwise where measured, moe, and under TP the all-reduces) at
    token counts T straight from the regressors: what their tables hold at their knots, in ms per step."""
    T = np.asarray(T, dtype=np.float64)
    ops = _ops_at(result, spec, parallelism, T, composition, with_spread=False) if len(T) else []
    out = {}
    if len(ops):
        # One row per operator, in T's order (_ops_at's layout), weighted by the layers that run it.
        per_op = (ops["time_ms"] * ops["layers"]).to_numpy(dtype=np.float64).reshape(-1, len(T))
        names = ops["op"].to_numpy()[::len(T)]
        experts, small = names == EXPERTS_OP, np.isin(names, SMALL_OPS)
        parts = {"linear": per_op[~experts & ~small], "elementwise": per_op[small], "moe": per_op[experts]}
        out = {name: rows.sum(axis=0) for name, rows in parts.items() if len(rows)}
    if len(T) and parallelism.tp > 1 and all_reduce_target(result) is not None:
        out["all_reduce"] = all_reduce_ms(result, spec, parallelism, T, with_spread=False,
                                          graph_max_tokens=composition.graph_max_tokens)[0]
    return out


def per_seq_terms_ms(result: FitResult, spec: ModelSpec, parallelism: Parallelism,
                     B: np.ndarray) -> dict[str, np.ndarray]:
    """The per-sequence terms (lm_head, overhead, measured sampling and KV stores) at batch sizes B
    straight from the regressors."""
    B = np.asarray(B, dtype=np.float64)
    out = {}
    lm = _lm_head_at(result, spec, parallelism, B, with_spread=False)
    if len(lm):
        out["lm_head"] = lm["time_ms"].to_numpy(dtype=np.float64)
    if "overhead" in result.targets:
        out["overhead"] = _overhead_at(result, spec, B, with_spread=False)[0]
    for name, term in SEQ_TERMS.items():
        if f"elementwise:{name}" in result.targets:
            out[term] = seq_calls_per_step(name, spec) * elementwise_ms(result, spec, parallelism, name, B,
                                                                        with_spread=False)[0]
    return out


def _linear_with_elementwise(terms: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The measured element-wise operators added back into linear, as the tables held them before
    they had a term of their own: the knots refine_steps finds (and so every table) stay the same."""
    terms = dict(terms)
    if "elementwise" in terms:
        small = terms.pop("elementwise")
        terms["linear"] = terms["linear"] + small if "linear" in terms else small
    return terms


def data_axes(result: FitResult, spec: ModelSpec, parallelism: Parallelism,
              composition: Composition = DEFAULT_COMPOSITION) -> Axes:
    """The knots of every term's grid by costmodel.axes.DATA_RULE: the data's own values and a
    knot each side of every step the composed 1-D terms take between them (the all-reduces' too)."""
    measured = measured_axes(result, spec, parallelism)
    axes = Axes.from_data(measured)

    def rows(terms: dict[str, np.ndarray], n: int) -> np.ndarray:
        return np.stack(list(terms.values())) if terms else np.zeros((1, n))

    num_tokens = refine_steps(axes.num_tokens, measured["num_tokens"], lambda T: rows(
        _linear_with_elementwise(per_token_terms_ms(result, spec, parallelism, T, composition)), len(T)))
    num_seqs = refine_steps(axes.num_seqs, measured["num_seqs"], lambda B: rows(
        per_seq_terms_ms(result, spec, parallelism, B), len(B)))
    return replace(axes, num_tokens=num_tokens, num_seqs=num_seqs)


def measured_axes(result: FitResult, spec: ModelSpec, parallelism: Parallelism) -> dict[str, np.ndarray]:
    """The values each axis was measured at (costmodel.axes.measured_values), with the all-reduces'
    message sizes on num_tokens as the token counts that make them (under TP): the all_reduce term
    is tabulated on num_tokens like the GEMMs, and its data are knots by the same rule."""
    measured = measured_values(result.records)
    tokens = all_reduce_tokens(result, spec, parallelism)
    if len(tokens):
        # Knots start at 1 like the fixed grid: a message smaller than one token's is no step's.
        measured["num_tokens"] = np.union1d(measured["num_tokens"], tokens[tokens >= 1])
    return measured
