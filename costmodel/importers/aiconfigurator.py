"""AIConfigurator kernel tables (Parquet): gemm_perf, context_attention_perf, generation_attention_perf,
custom_allreduce_perf.

`num_heads` / `num_key_value_heads` there are the heads on one GPU; `latency` is in ms.
Context attention is a prefill from an empty cache of `batch_size` prompts of `isl` tokens;
generation attention is one decode step of `batch_size` sequences over `step` cached tokens.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from costmodel.records import check_positive, check_times, make_records, require_columns

TABLES = ("gemm_perf", "context_attention_perf", "generation_attention_perf", "custom_allreduce_perf")


def is_aiconfigurator_table(columns) -> bool:
    return "latency" in columns and ("gemm_dtype" in columns or "isl" in columns or "message_size" in columns)


def table_files(directory: Path) -> list[Path]:
    """Every supported table under a system directory such as .../aiconfigurator/h100_sxm."""
    return sorted(p for p in directory.rglob("*.parquet") if p.stem in TABLES)


def import_table(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    frame = frame.reset_index(drop=True)
    if "gemm_dtype" in frame.columns:
        return _gemm(frame, path)
    if "message_size" in frame.columns:
        return _all_reduce(frame, path)
    require_columns(frame, ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
                            "latency"), path=path, what="AIConfigurator attention")
    check_times(frame, "latency", path=path)
    check_positive(frame, ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim"),
                   path=path)
    op_name = str(frame["op_name"].iloc[0]) if "op_name" in frame.columns and len(frame) else ""
    if "generation" in op_name or ("step" in frame.columns and "context" not in op_name
                                   and (frame["step"] > 0).any()):
        return _decode(frame, path)
    return _prefill(frame, path)


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
