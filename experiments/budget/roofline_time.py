"""A kernel's expected time from a GPU's datasheet, for planning a campaign before any device time.

time = launch floor + max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency)): the
larger of the compute and the memory time at shares of the datasheet peaks that well-tuned kernels
reach. A plan needs the order of a campaign's cost, not a kernel's time to a few percent; the
efficiencies are round numbers typical of cuBLAS GEMMs and FlashAttention on H100-class parts.
"""
from __future__ import annotations

from stepcal.core.errors import InputError
from stepcal.core.model_spec import DTYPE_BYTES

LAUNCH_MS = 0.006            # a kernel's floor: launch plus one wave of blocks
COMPUTE_EFFICIENCY = 0.7     # share of the dense tensor-core peak a large GEMM or attention reaches
MEMORY_EFFICIENCY = 0.8      # share of the datasheet bandwidth a streaming kernel reaches
ROOFLINE_OPS = ("gemm", "attn_prefill", "attn_decode", "elementwise", "moe")


def work(shape: dict, dtype: str) -> tuple[float, float]:
    """(FLOPs, bytes moved) of one kernel, from a profile row's shape columns."""
    op, size = shape["op"], float(DTYPE_BYTES.get(dtype, 2))
    if op == "gemm":
        m, n, k = (float(shape[c]) for c in ("m", "n", "k"))
        return 2 * m * n * k, (m * k + k * n + m * n) * size
    heads, kv_heads, head_dim = (float(shape.get(c) or 0) for c in ("num_heads", "num_kv_heads", "head_dim"))
    if op == "attn_prefill":
        q_tokens, kv_tokens = float(shape["num_tokens"]), float(shape["kv_sum"] or 0) + float(shape["num_tokens"])
        flops = 4 * heads * head_dim * float(shape["prefill_attn_work"])
        return flops, (2 * q_tokens * heads + 2 * kv_tokens * kv_heads) * head_dim * size
    if op == "attn_decode":
        kv = float(shape["decode_kv_sum"])
        return 4 * heads * head_dim * kv, (2 * kv * kv_heads + 2 * float(shape["num_seqs"]) * heads) * head_dim * size
    if op == "elementwise":
        return 0.0, 2 * float(shape["num_tokens"]) * float(shape["width"]) * size
    if op == "moe":
        tokens, hidden = float(shape["num_tokens"]), float(shape["width"])
        ffn, experts, top_k = (float(shape[c]) for c in ("expert_ffn_size", "num_experts", "experts_per_token"))
        active = min(experts, tokens * top_k)
        return 6 * tokens * top_k * hidden * ffn, 3 * active * hidden * ffn * size
    raise InputError(f"profile plan: no roofline for op {op!r} (it has one for {', '.join(ROOFLINE_OPS)}); "
                     f"plan it with --device replay:PROFILE")


def kernel_ms(shape: dict, dtype: str, peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """The roofline time of one kernel in ms (see the module's docstring)."""
    flops, moved = work(shape, dtype)
    seconds = max(flops / (peak_flops_per_s * COMPUTE_EFFICIENCY), moved / (bandwidth_bytes_per_s * MEMORY_EFFICIENCY))
    return LAUNCH_MS + seconds * 1e3
