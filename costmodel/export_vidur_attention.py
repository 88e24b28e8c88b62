"""attention.csv of the Vidur export: the points Vidur's attention profiler times (decode:
batch_size x kv_cache_size; prefill: one chunk of prefill_chunk_size over kv_cache_size), from the
attention regressors, else the tables' attention grids; with neither the export refuses (Vidur cannot
run without the file). attn_kv_cache_save: from our profiler's kv_store regressor where the tables
were fitted with the `elementwise` op; else an estimate, the bytes of K and V of the new tokens over
the device memory bandwidth (--hbm-gbps), a lower bound without launch latency."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from stepcal.core.batch import StepFeatures
from stepcal.core.errors import InputError
from stepcal.core.model_spec import ModelSpec, Parallelism
from stepcal.core.readers import read_parquet
from stepcal.costmodel.saved_regressors import fitted, load_regressor
from stepcal.costmodel.table_meta import TableMeta
from stepcal.costmodel.terms import GRID_COLUMNS, read_term
from stepcal.costmodel.vidur_models import (
    ATTENTION_KEYS,
    MLP_KEYS,
    VIDUR_BLOCK_SIZE,
    VIDUR_MAX_BATCH_SIZE,
    VIDUR_MAX_SEQ_LEN,
    attention_inputs,
    stat_columns,
)

# Device memory bandwidth of the KV-cache-save estimate: A100-SXM4-80GB's HBM2e, 2039 GB/s.
DEFAULT_HBM_GBPS = 2039.0
ATTENTION_BACKEND = "stepcal"
# Vidur's attention kinds -> our regressor (target) and T_step grid (term) of each.
ATTENTION_SOURCES = {"decode": ("attn_decode", "decode_attn"), "prefill": ("attn_prefill", "prefill_attn")}


def attention_features(points: pd.DataFrame) -> dict[str, np.ndarray]:
    """StepFeatures columns of Vidur's attention points: a decode batch of batch_size sequences, each
    one new token over kv_cache_size cached ones; or one prompt chunk of prefill_chunk_size tokens over
    kv_cache_size cached ones (Vidur's chunks are 32 tokens or more: never a decode)."""
    b, s, c = (points[n].to_numpy(dtype=np.float64) for n in ("batch_size", "kv_cache_size", "prefill_chunk_size"))
    decode = ~points["is_prefill"].to_numpy(dtype=bool)
    zero = np.zeros(len(points))
    return {"num_seqs": np.where(decode, b, 1.0), "num_tokens": np.where(decode, b, c),
            "num_decode": np.where(decode, b, zero), "decode_kv_sum": np.where(decode, b * s, zero),
            "decode_kv_max": np.where(decode, s, zero), "prefill_tokens": np.where(decode, zero, c),
            "prefill_attn_work": np.where(decode, zero, c * s + c * (c + 1) / 2),
            "kv_sum": np.where(decode, b * s, s)}


def vidur_attention(table_dir: Path, meta: TableMeta, spec: ModelSpec, tp: int, keys: dict,
                    hbm_gbps: float) -> tuple[pd.DataFrame, list[str]]:
    points = attention_inputs(VIDUR_MAX_SEQ_LEN, VIDUR_MAX_BATCH_SIZE)
    p = Parallelism(tp=tp)
    heads, kv_heads = p.split(spec.num_heads), p.kv_heads(spec.num_kv_heads)
    cols, sources, missing = {}, [], []
    for kind, (target, term) in ATTENTION_SOURCES.items():
        part = points[points["is_prefill"] == (kind == "prefill")]
        times = _attention_times(table_dir, meta, spec, (heads, kv_heads), target, term, part)
        if times is None:
            missing.append(f"{kind} (no {target} regressor or {term} grid)")
            continue
        time_ms, spread_ms, source = times
        sources.append(source)
        for name, values in stat_columns(f"attn_{kind}", np.maximum(time_ms, 0.0), np.maximum(spread_ms, 0.0)).items():
            cols[name] = pd.Series(values, index=part.index)
    if missing:
        raise InputError(f"{table_dir}: tables fitted without attention data for {' and '.join(missing)}: Vidur "
                         f"needs attention.csv for prefill and decode attention; fit with --profile .../attention "
                         f"tables too (e.g. AIConfigurator's attention/ directory), or Vidur cannot run")
    frame = pd.DataFrame(cols, index=points.index)
    save_ms, save_spread, save_note = _kv_cache_save(table_dir, meta, spec, p, points, hbm_gbps)
    frame = frame.assign(**stat_columns("attn_kv_cache_save", save_ms, save_spread))
    for name in ("attn_input_reshape", "attn_output_reshape"):
        frame = frame.assign(**stat_columns(name, np.zeros(len(frame)), np.zeros(len(frame))))
    by_vidur_field = {k.vidur: keys[k.column] for k in MLP_KEYS if k.column in keys}
    by_vidur_field.update(tp=tp, block_size=VIDUR_BLOCK_SIZE)
    for key in ATTENTION_KEYS:
        frame[key.column] = by_vidur_field[key.vidur]
    frame["max_model_len"] = VIDUR_MAX_SEQ_LEN
    frame = pd.concat([frame, points], axis=1)
    frame["attention_backend"] = ATTENTION_BACKEND
    decode = int((~points["is_prefill"]).sum())
    notes = [f"attention.csv: {decode} decode and {len(points) - decode} prefill rows at Vidur's attention "
             f"sweep (sequences to {VIDUR_MAX_SEQ_LEN}, batches to {VIDUR_MAX_BATCH_SIZE}) from "
             f"{' and '.join(sources)}", save_note]
    return frame, notes


def _kv_cache_save(table_dir: Path, meta: TableMeta, spec: ModelSpec, p: Parallelism, points: pd.DataFrame,
                   hbm_gbps: float) -> tuple[np.ndarray, np.ndarray, str]:
    """Per-layer KV-cache save at Vidur's points: from our profiler's kv_store regressor where the tables
    have one (priced by sequences: the batch's decodes, or the one prefill chunk), else the estimate."""
    from stepcal.costmodel.compose_elementwise import elementwise_ms  # lazy: loads sklearn
    target = "elementwise:kv_store"
    model = load_regressor(table_dir, meta, target)
    if model is None:
        zeros = np.zeros(len(points))
        return (kv_cache_save_ms(points, spec, p.kv_heads(spec.num_kv_heads), hbm_gbps), zeros,
                f"attn_kv_cache_save estimated: K and V bytes of the new tokens at {hbm_gbps:g} GB/s "
                f"(--hbm-gbps; no input times it)")
    seqs = np.where(points["is_prefill"].to_numpy(dtype=bool), 1.0,
                    points["batch_size"].to_numpy(dtype=np.float64))
    time_ms, spread_ms = elementwise_ms(fitted({target: model}), spec, p, "kv_store", seqs)
    return (np.maximum(time_ms, 0.0), np.maximum(spread_ms, 0.0),
            f"attn_kv_cache_save from the {target} regressor (our profiler's KV store, by sequences)")


def _attention_times(table_dir: Path, meta: TableMeta, spec: ModelSpec, heads: tuple[int, int], target: str,
                     term: str, part: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, str] | None:
    """Per-layer time and spread of one attention kind at Vidur's points: from its regressor, else the
    tables' grid over the layers; None with neither."""
    from stepcal.costmodel.grid_predict import predict_grid  # lazy: loads sklearn
    features = attention_features(part)
    model = load_regressor(table_dir, meta, target)
    if model is not None:
        n = len(part)
        time_ms, spread_ms = predict_grid(fitted({target: model}), target, dict(
            row=np.arange(n), op=target, num_heads=np.full(n, float(heads[0])),
            num_kv_heads=np.full(n, float(heads[1])), head_dim=np.full(n, float(spec.head_dim)),
            **features), spec.kv_dtype or spec.dtype)
        return time_ms, spread_ms, f"the {target} regressor"
    if term not in (meta.terms or {}):
        return None
    grid = _term(table_dir, meta, term)
    f = StepFeatures.from_columns(features)
    return (grid.evaluate(f) / spec.num_layers, grid.evaluate(f, "spread_ms") / spec.num_layers,
            f"the {term} grid (no regressor)")


def kv_cache_save_ms(points: pd.DataFrame, spec: ModelSpec, kv_heads: int, hbm_gbps: float) -> np.ndarray:
    """K and V of the new tokens (Vidur's num_tokens: the chunk, or one per decode) written at HBM speed."""
    new_tokens = np.maximum(points["prefill_chunk_size"], points["batch_size"]).to_numpy(dtype=np.float64)
    kv_bytes = new_tokens * 2 * kv_heads * spec.head_dim * spec.kv_dtype_bytes
    return kv_bytes / (hbm_gbps * 1e9) * 1e3


def _term(table_dir: Path, meta: TableMeta, name: str):
    entry = meta.term_entry(table_dir, name)
    file = table_dir / entry["file"]
    frame = read_parquet(file, f"the grid of T_step term {name!r}, listed in meta.json", GRID_COLUMNS)
    return read_term(name, entry, frame, file)
