"""Splitwise's perf_model.csv: whole-model prefill and per-token decode times.

Each row gives `prompt_time` (ms, the prefill of `batch_size` prompts of `prompt_size` tokens)
and `token_time` (ms, one decode iteration of the batch). Both become whole-step records; a
decode's cache length is taken at the middle of generation, prompt_size + token_size / 2.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from stepcal.costmodel.records import check_positive, check_times, make_records, require_columns

COLUMNS = ("prompt_size", "batch_size", "token_size", "prompt_time", "token_time")


def import_perf_model(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    require_columns(frame, COLUMNS, path=path, what="Splitwise perf_model.csv")
    frame = frame.reset_index(drop=True)
    check_positive(frame, ("prompt_size", "batch_size", "token_size"), path=path)
    check_times(frame, "prompt_time", path=path)
    check_times(frame, "token_time", path=path)
    b = frame["batch_size"].to_numpy(dtype=np.float64)
    p = frame["prompt_size"].to_numpy(dtype=np.float64)
    kv = p + frame["token_size"].to_numpy(dtype=np.float64) / 2
    zeros = np.zeros(len(frame))
    common = dict(row=np.arange(len(frame)), op="step",
                  device=frame["hardware"] if "hardware" in frame.columns else None,
                  tp=frame["tensor_parallel"] if "tensor_parallel" in frame.columns else np.nan)
    prompt = make_records(dict(common, name="prompt", num_seqs=b, num_tokens=b * p, num_decode=zeros,
                               decode_kv_sum=zeros, decode_kv_max=zeros, prefill_tokens=b * p,
                               prefill_attn_work=b * p * (p + 1) / 2, kv_sum=zeros,
                               time_ms=frame["prompt_time"]), source="splitwise", file=path)
    token = make_records(dict(common, name="token", num_seqs=b, num_tokens=b, num_decode=b,
                              decode_kv_sum=b * kv, decode_kv_max=kv, prefill_tokens=zeros,
                              prefill_attn_work=zeros, kv_sum=b * kv, time_ms=frame["token_time"]),
                         source="splitwise", file=path)
    return pd.concat([prompt, token], ignore_index=True)
