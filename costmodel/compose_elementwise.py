"""Element-wise terms of T_step: the small per-token kernels between the GEMMs (norms, RoPE, the
activation, residual adds, the embedding lookup) and greedy sampling's read of the logits.

The element-wise term comes from the data where the profiles time those kernels (Vidur's mlp.csv:
costmodel.compose sums their regressors as Vidur's profiler times them, one residual add per layer
and no final norm; our profiler's `elementwise` op times the same names on our model, both
residual adds in `add`), else from the memory roofline of costmodel.roofline on a device whose
datasheet costmodel.devices holds: per layer two RMSNorms, RoPE, the activation and two residual
adds, plus the embedding and the final norm once per step. Sampling (with the final norm) and the
KV stores come from data where our profiler timed them (per sequence), else sampling from the
roofline. Without data or a known device neither term is made and meta.json lists them as missing.

The device: the profiles' own (AIConfigurator writes the CUDA name, e.g. 'NVIDIA H100 80GB HBM3')
when it is a known one, else what --device-spec names.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.model_spec import HEAD_NORMS, ModelSpec, Parallelism
from stepcal.costmodel import roofline
from stepcal.costmodel.devices import DeviceSpec, device_spec, find_device
from stepcal.costmodel.grid_predict import predict_grid
from stepcal.costmodel.terms import FeatureCurve

# Vidur's per-layer small operators (its mlp.csv columns); `emb` runs once per step, not per layer.
PER_LAYER_ELEMENTWISE = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
DATA_ELEMENTWISE = ("emb",) + PER_LAYER_ELEMENTWISE
# Every per-token operator a composed element-wise term may hold: Vidur's, and a qk_norm model's
# per-head norms (head_norm_pricing).
SMALL_OPS = DATA_ELEMENTWISE + HEAD_NORMS
# Our profiler's per-sequence operators, and the T_step term each one makes.
SEQ_TERMS = {"sample": "sampling", "kv_store": "kv_store"}


def seq_calls_per_step(name: str, spec: ModelSpec) -> int:
    """Sampling runs once per step, a KV store once per layer."""
    return spec.num_layers if name == "kv_store" else 1


@dataclass(frozen=True, slots=True)
class RooflineOp:
    """One element-wise kernel of a step: which (a key of roofline.OP_CLASSES), the elements per
    token elementwise_widths_of() counts for it on one GPU, and how many times a step runs it."""
    name: str
    width: float
    calls_per_step: int


def elementwise_width_on(name: str, spec: ModelSpec, parallelism: Parallelism) -> float:
    """Elements per row one GPU's copy of an element-wise operator touches (a row: a token, a
    sequence for sample; the logits are gathered whole under TP)."""
    return float(spec.elementwise_widths(parallelism)[name])


def measured_seq_terms(result, spec: ModelSpec, parallelism: Parallelism, axes) -> list[FeatureCurve]:
    """The per-sequence operators our profiler times (`stepcal profile --ops elementwise`), from
    their regressors on the num_seqs knots: sample (final norm and greedy sampling, once per
    step) and kv_store (once per layer). A kv_store is priced by its sequences alone: on the
    CPU its cost is a Python loop over them, and a prefill chunk's extra tokens are one copy."""
    B = np.asarray(axes.num_seqs, dtype=np.float64)
    terms = []
    for name in SEQ_TERMS:
        if f"elementwise:{name}" not in result.targets:
            continue
        calls = seq_calls_per_step(name, spec)
        mean, spread = elementwise_ms(result, spec, parallelism, name, B)
        what = ("final norm and greedy sampling of the emitting rows" if name == "sample"
                else f"{calls} layers x the new tokens' KV store")
        terms.append(FeatureCurve(SEQ_TERMS[name], "num_seqs", B, calls * mean, calls * spread,
                                  f"{what}, by num_seqs (measured)", {"source": "data", "ops": [name]}))
    return terms


def elementwise_ms(result, spec: ModelSpec, parallelism: Parallelism, name: str, rows: np.ndarray,
                   with_spread: bool = True, priced_as: str | None = None):
    """(time, spread) in ms of one call of an element-wise operator at `rows` rows (tokens, or sequences
    for sample and kv_store), on one GPU's share of the model: by its own regressor, or by the
    regressor of `priced_as` (another operator of the same kind) at this operator's width."""
    n, target = len(rows), priced_as or name
    return predict_grid(result, f"elementwise:{target}", dict(
        row=np.arange(n), op="elementwise", name=target, num_tokens=rows, tp=np.full(n, float(parallelism.tp)),
        width=np.full(n, elementwise_width_on(name, spec, parallelism))), spec.kv_dtype or spec.dtype,
        with_spread=with_spread)


def head_norm_pricing(result, spec: ModelSpec) -> dict[str, str]:
    """How the data price a qk_norm model's per-head norms: name -> the operator whose regressor times
    it. Its own where our profiler timed it, else the layer's RMSNorm (input_layernorm, e.g. Vidur's)
    at the norm's width: the same kernel over rows of head_dim instead of hidden, the same bytes per
    element. Empty for a model without them, or data without either."""
    if not spec.qk_norm:
        return {}
    pricing = {}
    for name in HEAD_NORMS:
        if f"elementwise:{name}" in result.targets:
            pricing[name] = name
        elif "elementwise:input_layernorm" in result.targets:
            pricing[name] = "input_layernorm"
    return pricing


def roofline_device(records: pd.DataFrame, requested: str | None) -> DeviceSpec | None:
    """The device the roofline terms are computed for: the profiles' when they name a known one,
    else `requested` (--device-spec); None when neither does. A request that contradicts the
    profiles' own device is an error: kernels of one GPU and element-wise work of another."""
    named = sorted(records["device"].dropna().astype(str).unique()) if "device" in records else []
    known = {spec.name: spec for spec in map(find_device, named) if spec is not None}
    if requested is not None:
        spec = device_spec(requested)
        if known and spec.name not in known:
            raise InputError(f"--device-spec {requested}: the profiles were measured on "
                             f"{', '.join(named)} ({', '.join(known)}), not {spec.name}")
        return spec
    return next(iter(known.values())) if len(known) == 1 else None


def activation_bytes(spec: ModelSpec) -> int:
    """Bytes of one activation element between kernels: 16-bit in serving, also when the weights
    are 8- or 4-bit; 4 for a float32 model."""
    return 4 if spec.dtype in ("float32", "fp32") else 2


def roofline_ops(spec: ModelSpec, parallelism: Parallelism) -> list[RooflineOp]:
    """The element-wise kernels of one step on one GPU. A MoE layer's activation runs inside the
    fused-experts kernel its table times (AIConfigurator's moe_perf), so only dense FFN layers and
    shared experts run one here; MLA adds the norms of its latents and ropes one shared key; a qk_norm
    model (Qwen3) normalises its query and key heads, two kernels per layer."""
    p = parallelism
    L = spec.num_layers
    hidden = float(spec.hidden_size)
    if spec.is_mla:
        rope = (p.split(spec.num_heads) + 1) * spec.rope_head_dim
    else:
        rope = elementwise_width_on("attn_rope", spec, p)
    ops = [RooflineOp("emb", hidden, 1),
           RooflineOp("input_layernorm", hidden, L),
           RooflineOp("attn_rope", float(rope), L),
           RooflineOp("post_attention_layernorm", hidden, L),
           RooflineOp("add", 2 * hidden, 2 * L),
           RooflineOp("final_norm", hidden, 1)]
    if spec.num_ffn_dense_layers:
        ops.append(RooflineOp("mlp_act", 3.0 * p.split(spec.ffn_size), spec.num_ffn_dense_layers))
    if spec.is_moe and spec.num_shared_experts:
        shared = p.split(spec.num_shared_experts * spec.expert_ffn_size)
        ops.append(RooflineOp("mlp_act", 3.0 * shared, spec.num_moe_layers))
    if spec.is_mla:
        ops.append(RooflineOp("latent_norm", float(spec.kv_latent_dim + spec.q_latent_dim), L))
    for name in HEAD_NORMS if spec.qk_norm else ():
        ops.append(RooflineOp(name, elementwise_width_on(name, spec, p), L))
    return ops


def roofline_elementwise_ms(spec: ModelSpec, parallelism: Parallelism, device: DeviceSpec,
                            num_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(time, spread) in ms per step of every element-wise kernel at num_tokens tokens. The spread
    adds the kernels' up, not in quadrature: one device's error moves them all the same way."""
    T = np.asarray(num_tokens, dtype=np.float64)
    time_ms, spread_ms = np.zeros(len(T)), np.zeros(len(T))
    for op in roofline_ops(spec, parallelism):
        one = roofline_call_ms(spec, device, op, T)
        time_ms += op.calls_per_step * one
        spread_ms += op.calls_per_step * one * roofline.op_constants(op.name).relative_sd
    return time_ms, spread_ms


def roofline_call_ms(spec: ModelSpec, device: DeviceSpec, op: RooflineOp, num_tokens) -> np.ndarray:
    """The roofline time in ms of one call of `op` at num_tokens tokens (what a per-layer profile
    such as Vidur's mlp.csv times of it)."""
    moved = roofline.bytes_moved(op.name, op.width, np.asarray(num_tokens, dtype=np.float64), activation_bytes(spec))
    return roofline.op_constants(op.name).kernel_ms(moved, device.memory_bandwidth_bytes_per_s)


def sampling_ms(spec: ModelSpec, device: DeviceSpec, num_seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(time, spread) in ms of greedy sampling for num_seqs sequences: one kernel reading every
    sequence's logits (the whole vocabulary: they are gathered to one GPU under TP) once."""
    constants = roofline.op_constants("sampling")
    moved = roofline.bytes_moved("sampling", float(spec.vocab_size), np.asarray(num_seqs, dtype=np.float64),
                                 activation_bytes(spec))
    one = constants.kernel_ms(moved, device.memory_bandwidth_bytes_per_s)
    return one, one * constants.relative_sd


def roofline_source(device: DeviceSpec, op_names) -> dict:
    """meta.json's word on a roofline term: the device, its datasheet and each class's constants."""
    classes = sorted({roofline.OP_CLASSES[name] for name in op_names})
    return {"source": "roofline", "device": device.name, "device_title": device.title,
            "memory_bandwidth_bytes_per_s": device.memory_bandwidth_bytes_per_s,
            "datasheet": device.source_url,
            "constants": {c: {"efficiency": roofline.shipped_constants()[c].efficiency,
                              "launch_us": roofline.shipped_constants()[c].launch_us,
                              "relative_sd": roofline.shipped_constants()[c].relative_sd} for c in classes},
            "fitted_by": "studies/elementwise_roofline.py"}


def roofline_elementwise_term(spec: ModelSpec, parallelism: Parallelism, axes, device: DeviceSpec) -> FeatureCurve:
    """The element-wise term from the roofline, on the num_tokens knots (each kernel's time is
    affine in num_tokens, so the table is exact between them and beyond)."""
    time_ms, spread_ms = roofline_elementwise_ms(spec, parallelism, device, axes.num_tokens)
    ops = roofline_ops(spec, parallelism)
    parts = " + ".join(f"{op.calls_per_step} x {op.name}" for op in ops)
    return FeatureCurve("elementwise", "num_tokens", np.asarray(axes.num_tokens, dtype=np.float64), time_ms,
                        spread_ms, f"element-wise kernels at num_tokens, memory roofline on {device.title}: {parts}",
                        roofline_source(device, [op.name for op in ops]))


def sampling_term(spec: ModelSpec, axes, device: DeviceSpec) -> FeatureCurve:
    """Greedy sampling by num_seqs, from the roofline (no profile times it). Its own term rather than
    part of the element-wise one: it grows with the sequences that emit a token, not with the
    tokens a step computes (a 2,048-token prefill chunk samples once)."""
    time_ms, spread_ms = sampling_ms(spec, device, axes.num_seqs)
    return FeatureCurve("sampling", "num_seqs", np.asarray(axes.num_seqs, dtype=np.float64), time_ms, spread_ms,
                        f"greedy sampling: one read of {spec.vocab_size} logits per sequence, memory roofline "
                        f"on {device.title}", roofline_source(device, ["sampling"]))
