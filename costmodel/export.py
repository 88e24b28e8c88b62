"""Exports of a T_step table directory: Vidur's mlp.csv / attention.csv layouts, plain CSV, JSON."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from costmodel.tables import read_meta, term_entry
from costmodel.terms import GRID_COLUMNS, require_finite_numbers
from simulator.errors import InputError
from simulator.io import atomic_write_bytes, atomic_write_json
from simulator.readers import read_parquet

EXPORT_FORMATS = ("vidur", "csv", "json")
# Our operator names -> Vidur's (mlp.csv columns time_stats.<op>.<stat>).
VIDUR_OPS = {"qkv_proj": "attn_pre_proj", "o_proj": "attn_post_proj", "gate_up_proj": "mlp_up_proj",
             "down_proj": "mlp_down_proj", "emb": "emb", "input_layernorm": "input_layernorm",
             "attn_rope": "attn_rope", "post_attention_layernorm": "post_attention_layernorm",
             "mlp_act": "mlp_act", "add": "add"}
STATS = ("min", "max", "mean", "median", "std")
OPS_WHAT = "the per-layer operator times of a T_step table directory"


def export_tables(table_dir: str | Path, fmt: str, out: Path) -> list[Path]:
    """Write the export files into `out` (a staging directory); returns their paths."""
    table_dir = Path(table_dir)
    meta = read_meta(table_dir)
    if fmt == "vidur":
        return _vidur(table_dir, meta, out)
    if fmt == "csv":
        return _csv(table_dir, meta, out)
    if fmt == "json":
        return _json(table_dir, meta, out)
    raise InputError(f"--format: unknown export format {fmt!r}; known: {', '.join(EXPORT_FORMATS)}")


def _write_csv(frame: pd.DataFrame, path: Path) -> Path:
    atomic_write_bytes(path, frame.to_csv(index=False).encode())
    return path


def _stats(prefix: str, time_ms: np.ndarray, spread_ms: np.ndarray) -> dict:
    return {f"time_stats.{prefix}.min": np.maximum(time_ms - spread_ms, 0.5 * time_ms),
            f"time_stats.{prefix}.max": time_ms + spread_ms,
            f"time_stats.{prefix}.mean": time_ms, f"time_stats.{prefix}.median": time_ms,
            f"time_stats.{prefix}.std": spread_ms}


def _model_columns(meta: dict) -> dict:
    spec = meta.get("model_spec")
    if not spec:
        raise InputError("vidur export needs tables fitted with --model-spec (model dimensions)")
    return {"n_head": spec["num_heads"], "n_kv_head": spec["num_kv_heads"],
            "n_embd": spec["hidden_size"], "n_expanded_embd": spec["ffn_size"],
            "vocab_size": spec["vocab_size"], "use_gated_mlp": True,
            "num_tensor_parallel_workers": meta.get("tp") or 1}


def _vidur(table_dir: Path, meta: dict, out: Path) -> list[Path]:
    written = []
    model = _model_columns(meta)
    ops_path = table_dir / "ops.parquet"
    if ops_path.exists():
        ops = read_parquet(ops_path, OPS_WHAT, ("op", "num_tokens", "time_ms", "spread_ms"))
        require_finite_numbers(ops, ops_path, labels=("op",))
        tokens = np.sort(ops["num_tokens"].unique())
        cols: dict = {}
        for ours, theirs in VIDUR_OPS.items():
            rows = ops[ops["op"] == ours].set_index("num_tokens").reindex(tokens)
            if rows["time_ms"].isna().all():
                # Vidur expects every operator; an operator we have no profile of costs nothing.
                cols.update(_stats(theirs, np.zeros(len(tokens)), np.zeros(len(tokens))))
            else:
                cols.update(_stats(theirs, rows["time_ms"].to_numpy(), rows["spread_ms"].to_numpy()))
        frame = pd.DataFrame(cols)
        for key, value in model.items():
            frame[key] = value
        frame["num_tokens"] = tokens.astype(np.int64)
        written.append(_write_csv(frame, out / "mlp.csv"))
    attention = _vidur_attention(table_dir, meta, model)
    if attention is not None:
        written.append(_write_csv(attention, out / "attention.csv"))
    if not written:
        raise InputError(f"{table_dir}: no operator or attention grids to export in Vidur's layout")
    return written


def _vidur_attention(table_dir: Path, meta: dict, model: dict) -> pd.DataFrame | None:
    layers = meta.get("num_layers") or 1
    parts = []
    common = {"n_embd": model["n_embd"], "n_q_head": model["n_head"],
              "n_kv_head": model["n_kv_head"], "block_size": 16,
              "num_tensor_parallel_workers": model["num_tensor_parallel_workers"],
              "attention_backend": "stepcal"}
    decode = table_dir / "decode_attn.parquet"
    if decode.exists():
        d = read_parquet(decode, "the grid of T_step term 'decode_attn'", ("num_decode", "kv_mean") + GRID_COLUMNS)
        require_finite_numbers(d, decode)
        part = pd.DataFrame({"batch_size": d["num_decode"].astype(np.int64),
                             "kv_cache_size": d["kv_mean"].astype(np.int64),
                             "prefill_chunk_size": 0, "is_prefill": False,
                             **_stats("attn_decode", d["time_ms"].to_numpy() / layers,
                                      d["spread_ms"].to_numpy() / layers)})
        parts.append(part)
    prefill = table_dir / "prefill_attn.parquet"
    if prefill.exists():
        p = read_parquet(prefill, "the grid of T_step term 'prefill_attn'",
                         ("prefill_tokens", "prefill_ctx") + GRID_COLUMNS)
        require_finite_numbers(p, prefill)
        # Vidur times one prompt chunk of q tokens over a cache of s: our single-sequence points.
        s = p["prefill_ctx"] - (p["prefill_tokens"] + 1) / 2
        p = p[s >= 0].assign(kv=s[s >= 0])
        part = pd.DataFrame({"batch_size": 1, "kv_cache_size": p["kv"].round().astype(np.int64),
                             "prefill_chunk_size": p["prefill_tokens"].astype(np.int64),
                             "is_prefill": True,
                             **_stats("attn_prefill", p["time_ms"].to_numpy() / layers,
                                      p["spread_ms"].to_numpy() / layers)})
        parts.append(part)
    if not parts:
        return None
    frame = pd.concat(parts, ignore_index=True)
    for key, value in common.items():
        frame[key] = value
    frame["max_model_len"] = int(frame["kv_cache_size"].max() + frame["prefill_chunk_size"].max())
    for name in ("attn_input_reshape", "attn_output_reshape"):
        frame = frame.assign(**_stats(name, np.zeros(len(frame)), np.zeros(len(frame))))
    return frame


def _term_files(table_dir: Path, meta: dict) -> dict[str, Path]:
    """Each grid's file and what it is (for messages): the terms', and ops.parquet where it was written."""
    files = {name: (table_dir / term_entry(table_dir, meta, name)["file"], f"the grid of T_step term {name!r}")
             for name in meta["terms"]}
    if (table_dir / "ops.parquet").exists():
        files["ops"] = (table_dir / "ops.parquet", OPS_WHAT)
    return files


def _csv(table_dir: Path, meta: dict, out: Path) -> list[Path]:
    written = [_write_csv(read_parquet(path, what), out / f"{name}.csv")
               for name, (path, what) in _term_files(table_dir, meta).items()]
    atomic_write_json(out / "meta.json", meta)
    return written + [out / "meta.json"]


def _json(table_dir: Path, meta: dict, out: Path) -> list[Path]:
    tables = {name: json.loads(read_parquet(path, what).to_json(orient="records"))
              for name, (path, what) in _term_files(table_dir, meta).items()}
    atomic_write_json(out / "tables.json", {"meta": meta, "tables": tables})
    return [out / "tables.json"]
