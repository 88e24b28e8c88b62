"""Features of each target: what a regressor sees, what the physics model is linear in, and
the size axis that the extrapolation split cuts along.

A target is a group of records one regressor learns: all GEMMs together (their shape is in the
features), each small per-token operator on its own, attention prefill, attention decode,
MLA prefill and decode, a mixture-of-experts layer's experts per routing distribution, whole
steps, host overhead, and any other imported op by name.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepcal.core.batch import FEATURE_NAMES
from stepcal.core.model_spec import DTYPE_BYTES

# Bytes per element of every dtype a record may carry: the model spec's, plus the quantised
# weights of imported kernel tables (block-scaled fp8, weight-only int4).
FEATURE_DTYPE_BYTES = {**DTYPE_BYTES, "fp8_block": 1, "int4": 0.5}

# Multi-head latent attention as in the MLA tables, which are DeepSeek-V3's shape: each token
# caches one compressed KV latent of 512 plus a 64-wide RoPE key, shared by all heads; decode
# scores against latent + RoPE and sums values in latent space (weights absorbed), while prefill
# expands the latent to per-head keys of 128 + 64 and values of 128.
MLA_LATENT = 512
MLA_ROPE_DIM = 64
MLA_QK_HEAD_DIM = 128 + MLA_ROPE_DIM
MLA_V_HEAD_DIM = 128
# Gate, up and down projections: the GEMMs each routed token runs through its expert.
MOE_GEMMS = 3


@dataclass(frozen=True)
class TargetKind:
    columns: tuple[str, ...]          # record columns the features are built from
    physics: tuple[str, ...]          # derived features the physics model is linear in
    size: str                         # the axis the extrapolation split cuts along
    extra: tuple[str, ...] = ()       # derived features only the trees see
    # Columns whose additive curve may fall (costmodel.additive: every other one is held
    # non-decreasing, as more work never makes a step faster).
    falling: tuple[str, ...] = ()

    def increasing(self, names) -> tuple[bool, ...]:
        """For each design column: is its additive curve held non-decreasing?"""
        return tuple(name not in self.falling for name in names)


KINDS = {
    "gemm": TargetKind(("m", "n", "k"), ("flops", "bytes"), "m",
                       ("m_tiles_64", "m_tiles_128", "tiles_128")),
    "elementwise": TargetKind(("num_tokens", "width", "tp"), ("bytes",), "num_tokens"),
    # Attention's physics has a per-sequence term: each sequence is its own work (an SDPA call in a
    # loop on the CPU, its own blocks and setup on a GPU). Without it the CPU quick grid's decode
    # attention fitted to 93% held-out error (a forest), with it 12% (physics); H100 data unchanged.
    "attn_decode": TargetKind(("num_decode", "decode_kv_sum", "decode_kv_max", "num_heads",
                               "num_kv_heads", "head_dim"), ("flops", "bytes", "blocks", "num_decode"),
                              "decode_kv_max"),
    # Decodes sharing an attention call with a prefill (LLMServingSim's mixed rows, the prefill's own
    # time taken off): the decode kind's features.
    "attn_decode_mixed": TargetKind(("num_decode", "decode_kv_sum", "decode_kv_max", "num_heads",
                                     "num_kv_heads", "head_dim"), ("flops", "bytes", "blocks", "num_decode"),
                                    "decode_kv_max"),
    "attn_prefill": TargetKind(("num_seqs", "prefill_tokens", "prefill_attn_work", "kv_sum",
                                "num_heads", "num_kv_heads", "head_dim"),
                               ("flops", "bytes", "blocks", "seq_len", "num_seqs"), "seq_len",
                               ("tile_work",)),
    # A step's per-prompt cost (masks, a causal SDPA call per prompt) is num_seqs - num_decode; prompts
    # are no feature, so an additive fit can only say it with num_seqs rising and num_decode falling.
    "step": TargetKind(FEATURE_NAMES, ("num_tokens", "num_seqs", "decode_kv_sum",
                                       "prefill_attn_work"), "num_tokens", falling=("num_decode",)),
    "overhead": TargetKind(("num_seqs", "num_tokens"), ("num_seqs", "num_tokens"), "num_seqs"),
    # The engine's host path: intercept + one piecewise-linear function of each (the additive
    # regressor, as for whole steps): per-sequence and per-token work extrapolate linearly. Decodes and
    # prompt tokens apart: fitted on sequences and tokens alone, a served profile's host term priced
    # continuous prefill steps at 1.5-1.9x their host time and Sarathi's chunk-plus-decode steps at
    # 0.79x (qs29T); with them, 1.1-1.25x and 0.92x, and the profiled tables met 218 instead of 208 of
    # 288 cells over eight quickstarts. num_decode may fall, as for whole steps (a prompt's sequence
    # costs more than a decode's). kv_sum: the host path also grows with the KV it addresses (block
    # tables, read copies: 0.021 ms per 1,000 KV tokens in served decodes of `tiny`, 48 sequences of
    # 260 tokens); without it the served profile's long-context steps put their KV's host time on
    # num_seqs, and the profiled tables priced 33-64-sequence decodes of short contexts at 1.25x
    # their host time (1.17x with it). Over four quickstarts (refitted): profiled cells 115 -> 116 of
    # 144, profiled_cal 79 -> 79 of 96 (TTFT target 14 -> 13 of 16 runs): as good, and on the KV.
    "host": TargetKind(("num_seqs", "num_tokens", "num_decode", "prefill_tokens", "kv_sum"), (), "num_seqs",
                       falling=("num_decode",)),
    # A tensor-parallel all-reduce of num_tokens x width elements over tp GPUs.
    "all_reduce": TargetKind(("tp",), ("message_bytes", "ring_bytes"), "message_bytes"),
    # One MoE layer's experts on one GPU, one target per routing distribution ('moe:balanced').
    "moe": TargetKind(("num_tokens", "width", "expert_ffn_size", "num_experts", "experts_per_token",
                       "tp", "ep"), ("flops", "weight_bytes"), "num_tokens"),
    "mla_decode": TargetKind(("num_decode", "decode_kv_sum", "decode_kv_max", "num_heads"),
                             ("flops", "bytes", "query_bytes", "blocks"), "decode_kv_max"),
    "mla_prefill": TargetKind(("num_seqs", "prefill_tokens", "prefill_attn_work", "kv_sum",
                               "num_heads"), ("flops", "bytes", "blocks", "seq_len"), "seq_len",
                              ("tile_work",)),
}


def target_of(op: str, name) -> str:
    """The target a record belongs to: e.g. 'gemm', 'elementwise:add', 'attn_decode'."""
    if op == "elementwise":
        return f"elementwise:{name}"
    if op == "all_reduce" and isinstance(name, str) and name:
        return f"all_reduce:{name}"       # one target per implementation (e.g. CUDA graph or eager)
    if op == "moe" and isinstance(name, str) and name:
        return f"moe:{name}"              # one target per routing distribution (balanced, power law)
    return str(op)


def kind_of(target: str) -> str:
    return target.split(":", 1)[0]


def gemm_target(dtype: str) -> str:
    """The target of one dtype's GEMMs, where a fit holds several ('gemm:bfloat16')."""
    return f"gemm:{dtype}"


def assign_targets(records: pd.DataFrame, fitted=None) -> pd.Series:
    """The target of every record. GEMMs of different dtypes run different kernels (an fp8_block
    GEMM is not a bf16 one with half the bytes), so where the rows hold several GEMM dtypes (fp8
    weights beside a router left in bf16) each dtype gets its own target, gemm_target(dtype);
    else they share 'gemm'. With `fitted` (a fit's target names), a GEMM row goes to its dtype's
    target where the fit has one, else to 'gemm'."""
    targets = [target_of(o, n) for o, n in zip(records["op"], records["name"])]
    gemm = (records["op"] == "gemm").to_numpy()
    dtypes = records["dtype"]
    if fitted is not None:
        fitted = set(fitted)
        targets = [gemm_target(d) if g and gemm_target(d) in fitted else t
                   for t, g, d in zip(targets, gemm, dtypes)]
    elif dtypes[gemm].dropna().nunique() > 1:
        targets = [gemm_target(d) if g and isinstance(d, str) else t for t, g, d in zip(targets, gemm, dtypes)]
    return pd.Series(targets, index=records.index, name="target")


def generic_kind(records: pd.DataFrame) -> TargetKind:
    """An imported op we know nothing about: its populated numeric shape columns, no physics."""
    cols = tuple(c for c in ("m", "n", "k") + FEATURE_NAMES + ("num_heads", "num_kv_heads",
                                                               "head_dim", "width", "tp")
                 if c in records.columns and records[c].notna().all())
    if not cols:
        cols = ("row",)
    return TargetKind(cols, (), cols[0])


def kind_for(target: str, records: pd.DataFrame) -> TargetKind:
    return KINDS.get(kind_of(target)) or generic_kind(records)


@dataclass(frozen=True)
class Design:
    """The feature matrix of one target's rows: plain columns first, then the physics ones."""
    X: np.ndarray
    names: tuple[str, ...]
    physics_index: tuple[int, ...]
    size: np.ndarray


def design(target: str, records: pd.DataFrame, kind: TargetKind | None = None) -> Design:
    kind = kind or kind_for(target, records)
    base = {c: records[c].to_numpy(dtype=np.float64) for c in kind.columns}
    for degree in ("tp", "ep"):
        if degree in base:   # no tensor or expert parallelism: one GPU
            base[degree] = np.nan_to_num(base[degree], nan=1.0)
    derived = _derived(kind_of(target), records, base)
    names = list(kind.columns) + list(kind.extra) + [p for p in kind.physics
                                                     if p not in kind.columns]
    cols = [base.get(n, derived.get(n)) for n in names]
    X = np.column_stack(cols) if cols else np.zeros((len(records), 0))
    X = np.nan_to_num(X, nan=0.0)
    physics_index = tuple(names.index(p) for p in kind.physics)
    size = base.get(kind.size, derived.get(kind.size))
    return Design(X, tuple(names), physics_index, np.nan_to_num(np.asarray(size, dtype=np.float64)))


def _derived(kind: str, records: pd.DataFrame, base: dict) -> dict:
    dtype_bytes = np.array([FEATURE_DTYPE_BYTES.get(d, 2) if isinstance(d, str) else 2
                            for d in records["dtype"]], dtype=np.float64)
    if kind == "gemm":
        m, n, k = base["m"], base["n"], base["k"]
        # Tiles: a GEMM kernel covers the output in fixed tiles, so its time steps up where m
        # crosses a multiple of the tile (a partly filled tile costs a full one).
        return {"flops": 2 * m * n * k, "bytes": (m * k + n * k + m * n) * dtype_bytes,
                "m_tiles_64": np.ceil(m / 64), "m_tiles_128": np.ceil(m / 128),
                "tiles_128": np.ceil(m / 128) * np.ceil(n / 128)}
    if kind == "elementwise":
        return {"bytes": base["num_tokens"] * base["width"] * dtype_bytes}
    if kind == "all_reduce":
        message = (records["num_tokens"].to_numpy(dtype=np.float64) * records["width"].to_numpy(dtype=np.float64)
                   * dtype_bytes)
        # ring_bytes: what each GPU sends in a ring all-reduce, 2 (tp - 1) / tp of the message.
        return {"message_bytes": message, "ring_bytes": 2 * (base["tp"] - 1) / base["tp"] * message}
    if kind in ("attn_decode", "attn_decode_mixed"):
        kv_sum, heads, kv_heads, hd = (base["decode_kv_sum"], base["num_heads"],
                                       base["num_kv_heads"], base["head_dim"])
        # blocks: the kernel's work items (a sequence's KV head over 256-token splits), whose
        # count sets how well a batch fills the device.
        return {"flops": 4 * kv_sum * heads * hd,
                "bytes": 2 * kv_sum * kv_heads * hd * dtype_bytes,
                "blocks": kv_heads * (np.ceil(base["decode_kv_max"] / 256) * base["num_decode"])}
    if kind == "attn_prefill":
        tokens, work, kv_sum = base["prefill_tokens"], base["prefill_attn_work"], base["kv_sum"]
        heads, kv_heads, hd = base["num_heads"], base["num_kv_heads"], base["head_dim"]
        return {**_prefill_tiles(base), "flops": 4 * work * heads * hd,
                "bytes": (2 * tokens * heads + 2 * (tokens + kv_sum) * kv_heads) * hd * dtype_bytes}
    if kind == "moe":
        return _moe_features(base, dtype_bytes)
    if kind == "mla_decode":
        return _mla_decode_features(base, dtype_bytes)
    if kind == "mla_prefill":
        return _mla_prefill_features(base, dtype_bytes)
    return {}


def _prefill_tiles(base: dict) -> dict:
    """What a causal FlashAttention prefill schedules: tiles, blocks and the mean sequence length."""
    tokens, kv_sum, seqs, heads = (base["prefill_tokens"], base["kv_sum"], base["num_seqs"],
                                   base["num_heads"])
    q_tiles = np.ceil(tokens / np.maximum(seqs, 1) / 128)
    # tile_work: 128x128 score tiles a causal FlashAttention kernel computes, whole tiles on
    # the diagonal included (what it costs, where flops counts only the useful half).
    kv_tiles = np.ceil(kv_sum / np.maximum(seqs, 1) / 128)
    tile_work = seqs * heads * (q_tiles * kv_tiles + q_tiles * (q_tiles + 1) / 2)
    # blocks: 128-query tiles per head and sequence, the unit a FlashAttention kernel schedules.
    return {"tile_work": tile_work, "blocks": seqs * heads * q_tiles,
            "seq_len": (tokens + kv_sum) / np.maximum(seqs, 1)}


def _moe_features(base: dict, dtype_bytes: np.ndarray) -> dict:
    """One GPU's share of a MoE layer: FLOPs of the routed tokens' GEMMs and the weights it reads."""
    tokens, width, ffn = base["num_tokens"], base["width"], base["expert_ffn_size"]
    experts, top_k, tp, ep = (base["num_experts"], base["experts_per_token"], base["tp"],
                              base["ep"])
    # Each routed token runs gate, up and down over width x ffn/tp; a GPU gets 1/ep of them.
    flops = 2 * MOE_GEMMS * tokens * top_k * width * ffn / (tp * ep)
    # An expert's weights are read once if any token picks it: with top-k of E picked uniformly,
    # T tokens hit E (1 - (1 - k/E)^T) distinct experts on average, 1/ep of them on this GPU.
    miss = np.clip(1 - top_k / np.maximum(experts, 1), 0, 1)
    local_experts_hit = experts * (1 - miss ** tokens) / ep
    weight_bytes = local_experts_hit * MOE_GEMMS * width * ffn / tp * dtype_bytes
    return {"flops": flops, "weight_bytes": weight_bytes}


def _mla_decode_features(base: dict, dtype_bytes: np.ndarray) -> dict:
    kv_sum, heads, seqs = base["decode_kv_sum"], base["num_heads"], base["num_decode"]
    latent_width = MLA_LATENT + MLA_ROPE_DIM
    # Scores over latent + RoPE, then values summed in latent space, per head and cached token;
    # the compressed cache is read once per sequence, shared by all heads.
    # query_bytes: every head of every sequence brings a latent-space query and takes back a
    # latent output. With heads sharing one cache they act as the query rows of an MQA kernel,
    # which is why short caches still cost with many sequences and heads (1024 x 128 heads at
    # one cached token take twice the time of 1024 x 64 on H100).
    # blocks: a sequence's 256-token splits of its one latent "KV head", as for attn_decode.
    return {"flops": 2 * kv_sum * heads * (latent_width + MLA_LATENT),
            "bytes": kv_sum * latent_width * dtype_bytes,
            "query_bytes": seqs * heads * (latent_width + MLA_LATENT) * dtype_bytes,
            "blocks": np.ceil(base["decode_kv_max"] / 256) * seqs}


def _mla_prefill_features(base: dict, dtype_bytes: np.ndarray) -> dict:
    tokens, work, kv_sum, heads = (base["prefill_tokens"], base["prefill_attn_work"],
                                   base["kv_sum"], base["num_heads"])
    head_width = MLA_QK_HEAD_DIM + MLA_V_HEAD_DIM
    # The latent is expanded to per-head keys and values first, so every head reads its own:
    # queries and outputs of the new tokens, keys and values of every attended token.
    return {**_prefill_tiles(base), "flops": 2 * work * heads * head_width,
            "bytes": (tokens + (tokens + kv_sum)) * heads * head_width * dtype_bytes}
