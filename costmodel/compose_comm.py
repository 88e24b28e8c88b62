"""Collective terms of T_step: tensor parallelism's all-reduces (from measured all-reduce data) and
expert parallelism's all-to-all dispatch and combine (no table of it exists in the inputs we read:
bytes over a stated link bandwidth plus a stated latency, and meta.json says so)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepcal.core.errors import InputError
from stepcal.core.model_spec import ModelSpec, Parallelism
from stepcal.costmodel.features import assign_targets, design
from stepcal.costmodel.grid_predict import predict_grid
from stepcal.costmodel.records import make_records
from stepcal.costmodel.terms import FeatureCurve, Term

# vLLM V1 replays a CUDA graph (full for decodes, piecewise around attention for mixed steps, the
# all-reduces inside either) for a step of up to its largest captured size, and runs a larger step
# eagerly: vllm/v1/cudagraph_dispatcher.py returns CUDAGraphMode.NONE for num_tokens above
# max_cudagraph_capture_size, which vllm/config/vllm.py `_set_cudagraph_sizes` sets to
# min(2 x max_num_seqs, 512) unless configured: 512 at the default max_num_seqs of 256 and above.
GRAPH_MAX_TOKENS = 512


@dataclass(frozen=True)
class Composition:
    """Choices composition makes that the data do not: how tokens route to experts, the link
    expert parallelism's all-to-all runs over, and the device whose datasheet the roofline terms
    (element-wise work, sampling) read where the profiles do not name a known one. 450 GB/s:
    NVLink 4, one direction, per H100/H200 SXM GPU (900 GB/s both ways, NVIDIA's datasheet); the
    latency is an assumption, stated."""
    moe_distribution: str | None = None     # None: balanced where the data have it, else the least skewed
    ep_link_gbps: float = 450.0
    ep_latency_us: float = 10.0
    device_spec: str | None = None          # a name costmodel.devices knows (--device-spec)
    graph_max_tokens: int | None = GRAPH_MAX_TOKENS    # None: every step's all-reduces as graph replays
    # The link tensor parallelism's all-reduces run over where no all-reduce was measured (None: no
    # all_reduce term then, and meta.json lists it missing); its per-hop latency.
    tp_link_gbps: float | None = None
    tp_latency_us: float = 0.0
    # Decode attention's share of the gap between the batch's longest and mean KV (LLMServingSim's skew
    # profile; None: no decode_attn_skew term, the mean KV prices the batch).
    decode_skew_alpha: float | None = None

    def __post_init__(self) -> None:
        for flag, value in (("--ep-link-gbps", self.ep_link_gbps), ("--ep-latency-us", self.ep_latency_us),
                            ("--tp-link-gbps", self.tp_link_gbps), ("--tp-latency-us", self.tp_latency_us)):
            if value is None:
                continue
            if not math.isfinite(value) or value < 0 or (flag.endswith("gbps") and value == 0):
                raise InputError(f"{flag} must be a finite positive number, got {value}")


DEFAULT_COMPOSITION = Composition()


def collective_terms(result, spec: ModelSpec, parallelism: Parallelism, axes,
                     composition: Composition) -> list[Term]:
    terms = []
    if parallelism.tp > 1 and all_reduce_target(result) is not None:
        terms.append(_all_reduce_term(result, spec, parallelism, axes, composition))
    elif parallelism.tp > 1 and composition.tp_link_gbps is not None:
        terms.append(_link_all_reduce_term(spec, parallelism, axes, composition))
    if spec.is_moe and parallelism.ep > 1:
        terms.append(_all_to_all_term(spec, parallelism, axes, composition))
    return terms


def all_reduce_target(result) -> str | None:
    """The all-reduce regressor composition uses: a CUDA-graph implementation where profiled
    (what serving engines replay for decode steps), else the first one."""
    names = sorted(t for t in result.targets if t.split(":", 1)[0] == "all_reduce")
    graph = [t for t in names if "graph" in t]
    return (graph or names or [None])[0]


def all_reduce_eager_target(result) -> str | None:
    """The eagerly launched all-reduce regressor beside a CUDA-graph one (AIConfigurator measures vLLM's
    custom all-reduce both ways: `vllm_graph`, `vllm_eager`); None where only one way was profiled."""
    names = sorted(t for t in result.targets if t.split(":", 1)[0] == "all_reduce")
    eager = [t for t in names if "eager" in t]
    return eager[0] if eager and "graph" in (all_reduce_target(result) or "") else None


def all_reduces_per_step(spec: ModelSpec, parallelism: Parallelism) -> int:
    """All-reduces of the hidden state per step: after every layer's attention output projection,
    and after every FFN whose output is a partial sum over GPUs (dense FFNs, and MoE layers whose
    experts are split over more than one GPU; with one GPU per expert, combine does it)."""
    moe_layers = spec.num_moe_layers if parallelism.moe_tp > 1 else 0
    return spec.num_layers + spec.num_ffn_dense_layers + moe_layers


def all_reduce_ms(result, spec: ModelSpec, parallelism: Parallelism, T: np.ndarray, with_spread: bool = True,
                  graph_max_tokens: int | None = GRAPH_MAX_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """(time, spread) in ms per step of the step's all-reduces at token counts T, straight from the
    all-reduce regressor: what the all_reduce term holds at its knots. Where both a graph and an eager
    regressor were profiled, steps of more than `graph_max_tokens` tokens take the eager one, as vLLM
    launches them (None: every step the graph one)."""
    T = np.asarray(T, dtype=np.float64)
    mean, spread = _all_reduce_at(result, all_reduce_target(result), spec, parallelism, T, with_spread)
    eager = all_reduce_eager_target(result) if graph_max_tokens is not None else None
    above = T > (graph_max_tokens or 0)
    if eager is not None and above.any():
        mean[above], spread[above] = _all_reduce_at(result, eager, spec, parallelism, T[above], with_spread)
    per_step = all_reduces_per_step(spec, parallelism)
    return per_step * mean, per_step * spread


def _all_reduce_at(result, target: str, spec: ModelSpec, parallelism: Parallelism, T: np.ndarray,
                   with_spread: bool) -> tuple[np.ndarray, np.ndarray]:
    mean, spread = predict_grid(result, target, _message_columns(target, spec, parallelism, T),
                                spec.kv_dtype or spec.dtype, with_spread=with_spread)
    return np.array(mean, dtype=np.float64), np.array(spread, dtype=np.float64)


def _message_columns(target: str, spec: ModelSpec, parallelism: Parallelism, T: np.ndarray) -> dict:
    """Record columns of an all-reduce of T tokens' hidden states over the TP group."""
    return dict(row=np.arange(len(T)), op="all_reduce", name=target.split(":", 1)[1] if ":" in target else None,
                num_tokens=T, tp=np.full(len(T), float(parallelism.tp)), width=np.full(len(T), float(spec.hidden_size)))


def all_reduce_tokens(result, spec: ModelSpec, parallelism: Parallelism) -> np.ndarray:
    """The message sizes the all-reduce regressor was measured at (at this TP degree), as the token
    counts whose hidden states make a message of as many bytes: the all_reduce term's measured values
    on its num_tokens axis. Empty without tensor parallelism or all-reduce data."""
    target = all_reduce_target(result) if parallelism.tp > 1 else None
    if target is None:
        return np.empty(0)
    records = result.records[(assign_targets(result.records) == target).to_numpy()]
    records = records[np.nan_to_num(records["tp"].to_numpy(dtype=np.float64), nan=1.0) == parallelism.tp]
    if not len(records):
        return np.empty(0)
    # Bytes as the regressor's own features count them, in the records' dtype and in the model's.
    measured = design(target, records)
    one_token = design(target, make_records({**_message_columns(target, spec, parallelism, np.ones(1)),
                                             "dtype": spec.kv_dtype or spec.dtype}, source="grid", file="grid"))
    column = measured.names.index("message_bytes")
    return np.unique(measured.X[:, column] / one_token.X[0, column])


def _all_reduce_term(result, spec: ModelSpec, parallelism: Parallelism, axes, composition: Composition) -> Term:
    T = axes.num_tokens
    time_ms, spread_ms = all_reduce_ms(result, spec, parallelism, T, graph_max_tokens=composition.graph_max_tokens)
    per_step = all_reduces_per_step(spec, parallelism)
    eager = all_reduce_eager_target(result) if composition.graph_max_tokens is not None else None
    modes = f"; graph replays up to {composition.graph_max_tokens} tokens, eager above" if eager else ""
    return FeatureCurve("all_reduce", "num_tokens", T, time_ms, spread_ms,
                        f"{per_step} all-reduces of num_tokens x hidden over {parallelism.tp} GPUs "
                        f"({spec.num_layers} after attention, {per_step - spec.num_layers} after FFNs{modes})")


def ring_all_reduce_s(message_bytes, tp: int, link_gbps: float, latency_us: float) -> np.ndarray:
    """Seconds of one ring all-reduce of `message_bytes` over `tp` GPUs: 2 (tp - 1) steps (a
    reduce-scatter, then an all-gather), each sending 1/tp of the message over one link and paying
    the link's latency once (the alpha-beta cost of the ring algorithm NCCL uses on one node)."""
    hops = 2 * (tp - 1)
    return hops * latency_us * 1e-6 + hops / tp * np.asarray(message_bytes, dtype=np.float64) / (link_gbps * 1e9)


def _link_all_reduce_term(spec: ModelSpec, parallelism: Parallelism, axes, composition: Composition) -> Term:
    T = axes.num_tokens
    per_step = all_reduces_per_step(spec, parallelism)
    message = T * spec.hidden_size * spec.kv_dtype_bytes
    seconds = ring_all_reduce_s(message, parallelism.tp, composition.tp_link_gbps, composition.tp_latency_us)
    return FeatureCurve("all_reduce", "num_tokens", T, per_step * seconds * 1e3, np.zeros(len(T)),
                        f"{per_step} ring all-reduces of num_tokens x hidden over {parallelism.tp} GPUs "
                        f"({spec.num_layers} after attention, {per_step - spec.num_layers} after FFNs): "
                        f"bytes at {composition.tp_link_gbps:g} GB/s + {composition.tp_latency_us:g} us a hop, "
                        "no measured data")


def all_to_all_bytes(spec: ModelSpec, parallelism: Parallelism, num_tokens) -> np.ndarray:
    """Bytes one GPU sends in one dispatch (and again in one combine) of a MoE layer: its 1/ep of
    the step's tokens, each to experts_per_token experts, (ep-1)/ep of them on other GPUs, as
    hidden-size activations in the compute dtype."""
    ep = parallelism.ep
    per_token = spec.experts_per_token * spec.hidden_size * spec.kv_dtype_bytes * (ep - 1) / ep
    return np.asarray(num_tokens, dtype=np.float64) / ep * per_token


def _all_to_all_term(spec: ModelSpec, parallelism: Parallelism, axes, composition: Composition) -> Term:
    T = axes.num_tokens
    seconds = composition.ep_latency_us * 1e-6 + all_to_all_bytes(spec, parallelism, T) / (composition.ep_link_gbps * 1e9)
    per_step = 2 * spec.num_moe_layers
    return FeatureCurve("all_to_all", "num_tokens", T, per_step * seconds * 1e3, np.zeros(len(T)),
                        f"{per_step} all-to-alls ({spec.num_moe_layers} MoE layers x dispatch and combine) "
                        f"over {parallelism.ep} GPUs: bytes at {composition.ep_link_gbps:g} GB/s + "
                        f"{composition.ep_latency_us:g} us each, no measured data")
