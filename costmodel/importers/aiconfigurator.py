"""AIConfigurator kernel tables (Parquet): gemm_perf, context_attention_perf, generation_attention_perf,
custom_allreduce_perf, moe_perf, context_mla_perf, generation_mla_perf.

`num_heads` / `num_key_value_heads` there are the heads on one GPU; `latency` is in ms.
Context attention is a prefill from an empty cache of `batch_size` prompts of `isl` tokens;
generation attention is one decode step of `batch_size` sequences over `step` cached tokens.
The MLA tables (DeepSeek-style multi-head latent attention) are read the same way: op
`mla_prefill` or `mla_decode`, `num_heads` the heads on one GPU, `tp` = `tp_size`, dtype the KV
cache's.

moe_perf is one MoE layer's fused-experts kernel (router GEMM excluded): op `moe`, name the
routing distribution (`balanced`, `power_law_1.01`, ...), one record column per shape
(`num_tokens`, `width` = hidden_size, `expert_ffn_size` = inter_size, the whole expert's FFN
width, `num_experts`, `experts_per_token` = topk, `tp` = moe_tp_size, `ep` = moe_ep_size) and
dtype the weights' (`int4_wo` becomes `int4`). A table may time one dtype with several kernels
(`kernel_source`); a target must learn one kernel, so for each dtype only the rows of the first
kernel present in MOE_KERNELS (then MLA_KERNELS for MLA; unknown kernels after, by name) are kept:
vLLM's Triton fused-MoE before Marlin, FlashMLA before FlashAttention MLA before Triton MLA. In
the vLLM 0.14.0 tables no dtype has two kernels: bf16, fp8 and fp8_block run vllm_fused_moe,
int4_wo runs vllm_marlin_moe; the bf16 KV cache runs vllm_flash_attn_mla (H100) or
vllm_triton_mla (A100), the fp8 one vllm_flashmla.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from stepcal.costmodel.records import check_positive, check_text, check_times, make_records, require_columns

TABLES = ("gemm_perf", "context_attention_perf", "generation_attention_perf", "custom_allreduce_perf",
          "moe_perf", "context_mla_perf", "generation_mla_perf")
# Which kernel's rows a dtype keeps when a table times it with several (see the module's notes).
MOE_KERNELS = ("vllm_fused_moe", "vllm_marlin_moe")
MLA_KERNELS = ("vllm_flashmla", "vllm_flash_attn_mla", "vllm_triton_mla")
_MARKERS = ("gemm_dtype", "isl", "message_size", "moe_dtype", "num_experts", "mla_dtype")


def is_aiconfigurator_table(columns) -> bool:
    return "latency" in columns and any(c in columns for c in _MARKERS)


def table_files(directory: Path) -> list[Path]:
    """Every supported table under a system directory such as .../aiconfigurator/h100_sxm."""
    return sorted(p for p in directory.rglob("*.parquet") if p.stem in TABLES)


def import_table(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    frame = frame.reset_index(drop=True)
    if "gemm_dtype" in frame.columns:
        return _gemm(frame, path)
    if "message_size" in frame.columns:
        return _all_reduce(frame, path)
    if "moe_dtype" in frame.columns or "num_experts" in frame.columns:
        return _moe(frame, path)
    if _is_mla(frame):
        return _mla(frame, path)
    require_columns(frame, ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
                            "latency"), path=path, what="AIConfigurator attention")
    check_times(frame, "latency", path=path)
    check_positive(frame, ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim"),
                   path=path)
    op_name = _op_name(frame)
    if "generation" in op_name or ("step" in frame.columns and "context" not in op_name
                                   and (frame["step"] > 0).any()):
        return _decode(frame, path)
    return _prefill(frame, path)


def _op_name(frame: pd.DataFrame) -> str:
    return str(frame["op_name"].iloc[0]) if "op_name" in frame.columns and len(frame) else ""


def _is_mla(frame: pd.DataFrame) -> bool:
    return "mla_dtype" in frame.columns or _op_name(frame) in ("context_mla", "generation_mla")


def _common(frame: pd.DataFrame) -> dict:
    return dict(row=np.arange(len(frame)), time_ms=frame["latency"].to_numpy(dtype=np.float64),
                device=frame["device"] if "device" in frame.columns else None,
                num_heads=frame["num_heads"], num_kv_heads=frame["num_key_value_heads"],
                head_dim=frame["head_dim"],
                dtype=frame["kv_cache_dtype"] if "kv_cache_dtype" in frame.columns else None)


def _gemm(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    require_columns(frame, ("m", "n", "k", "latency"), path=path, what="AIConfigurator gemm_perf")
    check_times(frame, "latency", path=path)
    check_positive(frame, ("m", "n", "k"), path=path)
    cols = dict(row=np.arange(len(frame)), op="gemm", m=frame["m"], n=frame["n"], k=frame["k"],
                time_ms=frame["latency"].to_numpy(dtype=np.float64), dtype=frame["gemm_dtype"],
                device=frame["device"] if "device" in frame.columns else None)
    return make_records(cols, source="aiconfigurator", file=path)


def _prefill(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    b = frame["batch_size"].to_numpy(dtype=np.float64)
    q = frame["isl"].to_numpy(dtype=np.float64)
    zeros = np.zeros(len(frame))
    cols = _common(frame)
    cols.update(op="attn_prefill", num_seqs=b, num_tokens=b * q, num_decode=zeros,
                decode_kv_sum=zeros, decode_kv_max=zeros, prefill_tokens=b * q,
                prefill_attn_work=b * q * (q + 1) / 2, kv_sum=zeros)
    return make_records(cols, source="aiconfigurator", file=path)


def _decode(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    require_columns(frame, ("step",), path=path, what="AIConfigurator generation_attention_perf")
    check_positive(frame, ("step",), path=path)
    b = frame["batch_size"].to_numpy(dtype=np.float64)
    s = frame["step"].to_numpy(dtype=np.float64)
    zeros = np.zeros(len(frame))
    cols = _common(frame)
    cols.update(op="attn_decode", num_seqs=b, num_tokens=b, num_decode=b, decode_kv_sum=b * s,
                decode_kv_max=s, prefill_tokens=zeros, prefill_attn_work=zeros, kv_sum=b * s)
    return make_records(cols, source="aiconfigurator", file=path)


def _all_reduce(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    """custom_allreduce_perf: `message_size` elements of `allreduce_dtype` reduced over `num_gpus`.

    Read as elements: at the largest message (2^29) on 8 H100s that gives a bus bandwidth of
    ~320 GB/s, in NVLink's range (read as bytes it would be half that)."""
    require_columns(frame, ("num_gpus", "message_size", "latency"), path=path,
                    what="AIConfigurator custom_allreduce_perf")
    check_times(frame, "latency", path=path)
    check_positive(frame, ("num_gpus", "message_size"), path=path)
    name = frame["backend"] if "backend" in frame.columns else None
    cols = dict(row=np.arange(len(frame)), op="all_reduce", name=name, tp=frame["num_gpus"],
                num_tokens=frame["message_size"], width=np.ones(len(frame)),
                time_ms=frame["latency"].to_numpy(dtype=np.float64),
                dtype=frame["allreduce_dtype"] if "allreduce_dtype" in frame.columns else None,
                device=frame["device"] if "device" in frame.columns else None)
    return make_records(cols, source="aiconfigurator", file=path)


def _one_kernel_per_dtype(frame: pd.DataFrame, dtype_column: str,
                          preference) -> tuple[pd.DataFrame, np.ndarray]:
    """The rows of one kernel per dtype (the first of `preference` present, else the first by
    name), renumbered from 0, and their row numbers in the file."""
    if "kernel_source" not in frame.columns:
        return frame, np.arange(len(frame))
    kernels = frame["kernel_source"].astype(str)
    dtypes = frame[dtype_column].astype(str)
    rank = {k: i for i, k in enumerate(preference)}
    keep = np.zeros(len(frame), dtype=bool)
    for dtype in dtypes.unique():
        here = (dtypes == dtype).to_numpy()
        chosen = min(kernels[here].unique(), key=lambda k: (rank.get(k, len(rank)), k))
        keep |= here & (kernels == chosen).to_numpy()
    return frame[keep].reset_index(drop=True), np.flatnonzero(keep)


def _moe(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    """moe_perf: one MoE layer's experts (gate, up and down GEMMs of each routed token) on one GPU."""
    shape = ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
             "moe_ep_size")
    require_columns(frame, shape + ("moe_dtype", "distribution", "latency"), path=path,
                    what="AIConfigurator moe_perf")
    check_times(frame, "latency", path=path)
    check_positive(frame, shape, path=path)
    check_text(frame, "distribution", path=path)
    # Validated on every row first, so that errors name the file's own row numbers.
    kept, rows = _one_kernel_per_dtype(frame, "moe_dtype", MOE_KERNELS)
    cols = dict(row=rows, op="moe", name=kept["distribution"], num_tokens=kept["num_tokens"],
                width=kept["hidden_size"], expert_ffn_size=kept["inter_size"], num_experts=kept["num_experts"],
                experts_per_token=kept["topk"], tp=kept["moe_tp_size"], ep=kept["moe_ep_size"],
                time_ms=kept["latency"].to_numpy(dtype=np.float64),
                dtype=kept["moe_dtype"], device=_device(kept))
    return make_records(cols, source="aiconfigurator", file=path)


def _mla(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    """context_mla_perf / generation_mla_perf: MLA prefill from an empty cache, or one decode step."""
    require_columns(frame, ("batch_size", "isl", "num_heads", "tp_size", "kv_cache_dtype",
                            "latency"), path=path, what="AIConfigurator MLA")
    check_times(frame, "latency", path=path)
    check_positive(frame, ("batch_size", "isl", "num_heads", "tp_size"), path=path)
    op_name = _op_name(frame)
    decode = op_name == "generation_mla" or (op_name != "context_mla" and "step" in frame.columns
                                             and (frame["step"] > 0).any())
    if decode:
        require_columns(frame, ("step",), path=path, what="AIConfigurator generation_mla_perf")
        check_positive(frame, ("step",), path=path)
    kept, rows = _one_kernel_per_dtype(frame, "kv_cache_dtype", MLA_KERNELS)
    b = kept["batch_size"].to_numpy(dtype=np.float64)
    zeros = np.zeros(len(kept))
    cols = dict(row=rows, time_ms=kept["latency"].to_numpy(dtype=np.float64),
                num_heads=kept["num_heads"], tp=kept["tp_size"], dtype=kept["kv_cache_dtype"],
                device=_device(kept))
    if decode:
        s = kept["step"].to_numpy(dtype=np.float64)
        cols.update(op="mla_decode", num_seqs=b, num_tokens=b, num_decode=b, decode_kv_sum=b * s,
                    decode_kv_max=s, prefill_tokens=zeros, prefill_attn_work=zeros, kv_sum=b * s)
    else:
        q = kept["isl"].to_numpy(dtype=np.float64)
        cols.update(op="mla_prefill", num_seqs=b, num_tokens=b * q, num_decode=zeros,
                    decode_kv_sum=zeros, decode_kv_max=zeros, prefill_tokens=b * q,
                    prefill_attn_work=b * q * (q + 1) / 2, kv_sum=zeros)
    return make_records(cols, source="aiconfigurator", file=path)


def _device(frame: pd.DataFrame):
    return frame["device"] if "device" in frame.columns else None
