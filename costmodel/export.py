"""Exports of a T_step table directory: Vidur's profile layout (mlp.csv, attention.csv), plain CSV, JSON.

Vidur's layout (costmodel.vidur_models holds what Vidur reads and where the facts come from):
- mlp.csv: per-layer operator times at Vidur's own num_tokens sweep (every 8 tokens to 1024, ...) up
  to the tables' range, evaluated from the fitted regressors in models/ with the same record columns
  ops.parquet was built from (costmodel.compose.op_grids), not interpolated in ops.parquet's coarse
  grid. Only an operator whose regressor is missing is interpolated in ops.parquet (linear in
  log num_tokens); the printed line says which.
- attention.csv: the points Vidur's attention profiler times (decode: batch_size x kv_cache_size;
  prefill: one chunk of prefill_chunk_size over kv_cache_size), from the attention regressors, else
  the tables' attention grids; with neither the export refuses (Vidur cannot run without the file).
  attn_kv_cache_save: no input we read times it, so it is an estimate: the bytes of K and V of the
  new tokens over the device memory bandwidth (--hbm-gbps), a lower bound without launch latency.
- the filter keys: from the input mlp.csv when the tables were fitted from a Vidur profile, else from
  the model spec in Vidur's convention (its config of the same shape, whose vocabulary Vidur pads),
  or those of a named Vidur model config (--vidur-model).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from costmodel.importers.vidur import KEY_COLUMNS as VIDUR_PROFILE_KEYS
from costmodel.tables import read_meta, term_entry
from costmodel.terms import GRID_COLUMNS, read_term, require_finite_numbers
from costmodel.vidur_models import (
    ATTENTION_KEYS,
    MLP_KEYS,
    MODEL_COLUMNS,
    SHAPE_COLUMNS,
    VIDUR_BLOCK_SIZE,
    VIDUR_MAX_BATCH_SIZE,
    VIDUR_MAX_SEQ_LEN,
    attention_inputs,
    like_spec,
    model_keys,
    num_tokens_sweep,
    spec_keys,
    vidur_model,
)
from simulator.batch import StepFeatures
from simulator.errors import InputError, shown
from simulator.io import atomic_write_bytes, atomic_write_json
from simulator.model_spec import ModelSpec, Parallelism
from simulator.readers import one_line, read_parquet

EXPORT_FORMATS = ("vidur", "csv", "json")
# Our operator names -> Vidur's (mlp.csv columns time_stats.<op>.<stat>).
VIDUR_OPS = {"qkv_proj": "attn_pre_proj", "o_proj": "attn_post_proj", "gate_up_proj": "mlp_up_proj",
             "down_proj": "mlp_down_proj", "emb": "emb", "input_layernorm": "input_layernorm",
             "attn_rope": "attn_rope", "post_attention_layernorm": "post_attention_layernorm",
             "mlp_act": "mlp_act", "add": "add"}
GEMM_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
STATS = ("min", "max", "mean", "median", "std")
OPS_WHAT = "the per-layer operator times of a T_step table directory"
# Device memory bandwidth of the KV-cache-save estimate: A100-SXM4-80GB's HBM2e, 2039 GB/s.
DEFAULT_HBM_GBPS = 2039.0
ATTENTION_BACKEND = "stepcal"
# Vidur's attention kinds -> our regressor (target) and T_step grid (term) of each.
ATTENTION_SOURCES = {"decode": ("attn_decode", "decode_attn"), "prefill": ("attn_prefill", "prefill_attn")}


@dataclass(frozen=True)
class Export:
    """The files an export wrote, and what a person should know of how they were made."""
    files: list[Path]
    notes: tuple[str, ...] = ()


def export_tables(table_dir: str | Path, fmt: str, out: Path, *, vidur_model: str | None = None,
                  hbm_gbps: float = DEFAULT_HBM_GBPS) -> Export:
    """Write the export files into `out` (a staging directory)."""
    table_dir = Path(table_dir)
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"--format: unknown export format {fmt!r}; known: {', '.join(EXPORT_FORMATS)}")
    if fmt != "vidur" and vidur_model is not None:
        raise InputError(f"--vidur-model applies to --format vidur only, not {fmt}")
    meta = read_meta(table_dir)
    if fmt == "vidur":
        return _vidur(table_dir, meta, out, vidur_model, hbm_gbps)
    return Export(_csv(table_dir, meta, out) if fmt == "csv" else _json(table_dir, meta, out))


def _write_csv(frame: pd.DataFrame, path: Path) -> Path:
    atomic_write_bytes(path, frame.to_csv(index=False).encode())
    return path


def _stats(prefix: str, time_ms: np.ndarray, spread_ms: np.ndarray) -> dict:
    return {f"time_stats.{prefix}.min": np.maximum(time_ms - spread_ms, 0.5 * time_ms),
            f"time_stats.{prefix}.max": time_ms + spread_ms,
            f"time_stats.{prefix}.mean": time_ms, f"time_stats.{prefix}.median": time_ms,
            f"time_stats.{prefix}.std": spread_ms}


# ---------------------------------------------------------------------------- Vidur's layout

def _vidur(table_dir: Path, meta: dict, out: Path, model_name: str | None, hbm_gbps: float) -> Export:
    spec, tp = _vidur_spec(table_dir, meta)
    keys, key_note = _filter_keys(meta, spec, tp, model_name)
    ops = _read_ops(table_dir)
    mlp, mlp_notes = _vidur_mlp(table_dir, meta, spec, tp, keys, ops)
    attention, attention_notes = _vidur_attention(table_dir, meta, spec, tp, keys, hbm_gbps)
    files = [_write_csv(mlp, out / "mlp.csv"), _write_csv(attention, out / "attention.csv")]
    return Export(files, (key_note, *mlp_notes, *attention_notes))


def _vidur_spec(table_dir: Path, meta: dict) -> tuple[ModelSpec, int]:
    """The tables' model and TP degree, refused where Vidur cannot express the model."""
    data = meta.get("model_spec")
    if not data:
        raise InputError(f"{table_dir}: vidur export needs tables fitted with --model-spec (model dimensions)")
    if not isinstance(data, dict):
        raise InputError(f"{table_dir / 'meta.json'}: model_spec must be an object of ModelSpec fields, "
                         f"got {shown(data)}")
    try:
        spec = ModelSpec(**data)
    except TypeError as exc:
        raise InputError(f"{table_dir / 'meta.json'}: model_spec is not a model spec ({one_line(exc)})") from None
    tp = meta.get("tp") or 1
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise InputError(f"{table_dir / 'meta.json'}: tp must be a positive integer, got {shown(tp)}")
    if spec.is_moe:
        raise InputError(f"{table_dir}: model {spec.name!r} is a mixture of experts: Vidur's mlp.csv times one "
                         f"dense FFN per layer, so Vidur cannot express it")
    if spec.is_mla:
        raise InputError(f"{table_dir}: model {spec.name!r} uses multi-head latent attention: Vidur's "
                         f"attention.csv is for GQA (n_q_head, n_kv_head), so Vidur cannot express it")
    if spec.num_heads * spec.head_dim != spec.hidden_size:
        raise InputError(f"{table_dir}: model {spec.name!r} has head_dim {spec.head_dim}, but Vidur takes "
                         f"n_embd / n_head = {spec.hidden_size / spec.num_heads:g}, so Vidur cannot express it")
    return spec, tp


def _filter_keys(meta: dict, spec: ModelSpec, tp: int, model_name: str | None) -> tuple[dict, str]:
    """mlp.csv's model keys (Vidur column -> value) and a note on where they came from."""
    keys, said = _profile_keys(meta, spec, tp)
    if keys is not None:
        own = dict(keys)
        note = f"filter keys from the Vidur profile {said}"
    else:
        keys, like = spec_keys(spec), like_spec(spec)
        own = dict(keys)
        if like is None:
            note = f"filter keys from model spec {spec.name!r} (no Vidur model config has its shape)"
        elif like.vocab_size != spec.vocab_size:
            keys["vocab_size"] = like.vocab_size
            note = (f"filter keys from model spec {spec.name!r} in Vidur's convention: vocab_size {like.vocab_size} "
                    f"as Vidur's {like.name} config has it (the spec: {spec.vocab_size})")
        else:
            note = f"filter keys from model spec {spec.name!r} (as Vidur's {like.name} config)"
        if said:
            note += f" ({said})"
    if model_name is None:
        return keys, note
    model = vidur_model(model_name)
    theirs = model_keys(model)
    differ = [c for c in SHAPE_COLUMNS if keys[c] != theirs[c]]
    ours_said = [f"{c} {keys[c]}" for c in differ]
    theirs_said = [f"{c} {theirs[c]}" for c in differ]
    if spec.num_layers != model.num_layers:
        ours_said.append(f"{spec.num_layers} layers")
        theirs_said.append(f"{model.num_layers} layers")
    if ours_said:
        raise InputError(f"--vidur-model {model.name}: the tables' model ({spec.name}) has {', '.join(ours_said)} "
                         f"where Vidur's config has {', '.join(theirs_said)}: fit tables for that model")
    # Against the tables' own values (the profile's, or the spec's before Vidur's convention).
    overrode = [f"{c} {own[c]} -> {theirs[c]}" for c in MODEL_COLUMNS if own[c] != theirs[c]]
    return theirs, (f"filter keys of Vidur's {model.name} config"
                    + (f" (overrode {', '.join(overrode)}, which Vidur only filters on)" if overrode else ""))


def _profile_keys(meta: dict, spec: ModelSpec, tp: int) -> tuple[dict | None, str]:
    """The model keys of the Vidur mlp.csv the tables were fitted from (and its path); (None, "")
    when they were not, (None, a note) when that file cannot be read here."""
    provenance = meta.get("provenance")
    provenance = provenance if isinstance(provenance, dict) else {}
    if "vidur" not in (provenance.get("sources") or []):
        return None, ""
    found, unreadable = [], []
    for name in provenance.get("files") or []:
        path = Path(str(name))
        if path.suffix != ".csv":
            continue
        try:
            if not set(VIDUR_PROFILE_KEYS) <= set(pd.read_csv(path, nrows=0).columns):
                continue           # another of Vidur's files (all_reduce.csv)
            frame = pd.read_csv(path, usecols=[*MODEL_COLUMNS, "num_tensor_parallel_workers"])
        except (ValueError, OSError, pd.errors.ParserError):
            unreadable.append(str(path))
            continue
        frame = frame[pd.to_numeric(frame["num_tensor_parallel_workers"], errors="coerce") == tp]
        for row in frame[list(MODEL_COLUMNS)].drop_duplicates().to_dict("records"):
            found.append((path, _profile_row(row, path)))
    if not found:
        return None, (f"the Vidur profile {unreadable[0]} named in meta.json is not readable here" if unreadable else "")
    ours = spec_keys(spec)
    same = [(path, keys) for path, keys in found if all(keys[c] == ours[c] for c in SHAPE_COLUMNS)]
    if not same:
        path, keys = found[0]
        differ = [c for c in SHAPE_COLUMNS if keys[c] != ours[c]]
        raise InputError(f"{path}: the Vidur profile the tables were fitted from has "
                         f"{', '.join(f'{c} {keys[c]}' for c in differ)} where model spec {spec.name!r} has "
                         f"{', '.join(f'{c} {ours[c]}' for c in differ)}: its keys would not describe the times")
    if len({tuple(keys.items()) for _, keys in same}) > 1:
        raise InputError(f"{same[0][0]}: the Vidur profiles the tables were fitted from hold several models of "
                         f"{spec.name!r}'s shape ({[keys for _, keys in same]}); pass --vidur-model to choose")
    return same[0][1], str(same[0][0])


def _profile_row(row: dict, path: Path) -> dict:
    """One model's keys as read from an mlp.csv, as the types Vidur compares them with."""
    keys = {}
    for column, value in row.items():
        if column == "use_gated_mlp":
            keys[column] = str(value).strip().lower() in ("true", "1", "1.0")
            continue
        number = pd.to_numeric(value, errors="coerce")
        if not np.isfinite(number) or number != int(number):
            raise InputError(f"{path}: column {column!r} must hold whole numbers, got {shown(value)}")
        keys[column] = int(number)
    return keys


def _read_ops(table_dir: Path) -> pd.DataFrame | None:
    path = table_dir / "ops.parquet"
    if not path.exists():
        return None
    ops = read_parquet(path, OPS_WHAT, ("op", "num_tokens", "time_ms", "spread_ms"))
    require_finite_numbers(ops, path, labels=("op",))
    return ops


@dataclass(frozen=True)
class _Target:
    estimator: object


@dataclass(frozen=True)
class _Fitted:
    """What composition reads of a FitResult (costmodel.fitting): each target's fitted estimator,
    here loaded back from the table directory's models/."""
    targets: dict


def _regressor(table_dir: Path, meta: dict, target: str):
    """The fitted regressor of `target`; None where the tables have none (not fitted, or its file is
    gone). A damaged file is an error: falling back would hide it."""
    import joblib
    targets = meta.get("targets")
    entry = targets.get(target) if isinstance(targets, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
        return None
    path = table_dir / entry["model"]
    if not path.is_file():
        return None
    try:
        return joblib.load(path)
    except Exception as exc:   # unpickling a damaged file can raise almost anything; all mean "damaged"
        raise InputError(f"{path}: not a readable regressor of target {target!r} "
                         f"({type(exc).__name__}: {one_line(exc)})") from None


def _max_tokens(table_dir: Path, meta: dict, ops: pd.DataFrame | None) -> int:
    """The tables' num_tokens range: ops.parquet's, else the axis in meta.json."""
    if ops is not None and len(ops):
        top = float(ops["num_tokens"].max())
    else:
        axis = meta["axes"].get("num_tokens") if isinstance(meta.get("axes"), dict) else None
        try:
            top = max(float(t) for t in axis)
        except (TypeError, ValueError):
            raise InputError(f"{table_dir}: no ops.parquet and no num_tokens axis in meta.json: "
                             f"no per-layer operator times to export") from None
    if not top >= 1:
        raise InputError(f"{table_dir}: the tables' num_tokens reach {shown(top)}, not even one token")
    return int(top)


def _vidur_mlp(table_dir: Path, meta: dict, spec: ModelSpec, tp: int, keys: dict,
               ops: pd.DataFrame | None) -> tuple[pd.DataFrame, list[str]]:
    from costmodel.compose import Axes, op_grids  # composition: only this format needs it
    top = _max_tokens(table_dir, meta, ops)
    tokens = num_tokens_sweep(top)
    targets = {t: _Target(m) for t in ("gemm", *(f"elementwise:{op}" for op in VIDUR_OPS))
               if (m := _regressor(table_dir, meta, t)) is not None}
    axes = dataclasses.replace(Axes.default(), num_tokens=tokens.astype(np.float64))
    grids = op_grids(_Fitted(targets), spec, Parallelism(tp=tp), axes) if targets else None
    cols, made = {}, {"regressor": [], "interpolated": [], "zeros": []}
    for ours, theirs in VIDUR_OPS.items():
        rows = grids[grids["op"] == ours] if grids is not None else ()
        if len(rows):
            rows = rows.set_index("num_tokens").reindex(tokens.astype(np.float64))
            time_ms, spread_ms, how = rows["time_ms"].to_numpy(), rows["spread_ms"].to_numpy(), "regressor"
        elif ops is not None and ((ops["op"] == ours) & (ops["num_tokens"] > 0)).any():
            # No regressor for this operator: ops.parquet's grid, linear in log num_tokens.
            grid = ops[(ops["op"] == ours) & (ops["num_tokens"] > 0)].sort_values("num_tokens")
            x, at = np.log(grid["num_tokens"].to_numpy(dtype=np.float64)), np.log(tokens)
            time_ms = np.interp(at, x, grid["time_ms"].to_numpy(dtype=np.float64))
            spread_ms, how = np.interp(at, x, grid["spread_ms"].to_numpy(dtype=np.float64)), "interpolated"
        else:
            # Vidur expects every operator; one we have no data for costs nothing (and is named).
            time_ms, spread_ms, how = np.zeros(len(tokens)), np.zeros(len(tokens)), "zeros"
        made[how].append(theirs)
        cols.update(_stats(theirs, np.maximum(time_ms, 0.0), np.maximum(spread_ms, 0.0)))
    if not any(VIDUR_OPS[g] in made["regressor"] + made["interpolated"] for g in GEMM_OPS):
        raise InputError(f"{table_dir}: tables fitted without per-layer operator data (no GEMM regressor or "
                         f"ops.parquet): Vidur needs mlp.csv; fit with a Vidur mlp.csv or GEMM kernel tables too")
    frame = pd.DataFrame(cols)
    for key, value in keys.items():
        frame[key] = value
    frame["num_tokens"] = tokens
    frame["num_tensor_parallel_workers"] = tp
    notes = [f"mlp.csv: {len(tokens)} num_tokens at Vidur's sweep 1-{tokens[-1]}, "
             f"{', '.join(made['regressor']) or 'nothing'} from the regressors"]
    if made["interpolated"]:
        notes.append(f"{', '.join(made['interpolated'])} interpolated in ops.parquet (no regressor)")
    if made["zeros"]:
        notes.append(f"{', '.join(made['zeros'])} zero (no data)")
    return frame, notes


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


def _vidur_attention(table_dir: Path, meta: dict, spec: ModelSpec, tp: int, keys: dict,
                     hbm_gbps: float) -> tuple[pd.DataFrame, list[str]]:
    from costmodel.grid_predict import predict_grid
    points = attention_inputs(VIDUR_MAX_SEQ_LEN, VIDUR_MAX_BATCH_SIZE)
    p = Parallelism(tp=tp)
    heads, kv_heads = p.split(spec.num_heads), p.kv_heads(spec.num_kv_heads)
    dtype = spec.kv_dtype or spec.dtype
    cols, sources, missing = {}, [], []
    for kind, (target, term) in ATTENTION_SOURCES.items():
        part = points[points["is_prefill"] == (kind == "prefill")]
        features = attention_features(part)
        model = _regressor(table_dir, meta, target)
        if model is not None:
            n = len(part)
            time_ms, spread_ms = predict_grid(_Fitted({target: _Target(model)}), target, dict(
                row=np.arange(n), op=target, num_heads=np.full(n, float(heads)),
                num_kv_heads=np.full(n, float(kv_heads)), head_dim=np.full(n, float(spec.head_dim)),
                **features), dtype)
            sources.append(f"the {target} regressor")
        elif term in (meta.get("terms") or {}):
            # No regressor: the tables' grid of all layers, over the layers.
            grid = _term(table_dir, meta, term)
            f = StepFeatures.from_columns(features)
            time_ms = grid.evaluate(f) / spec.num_layers
            spread_ms = grid.evaluate(f, "spread_ms") / spec.num_layers
            sources.append(f"the {term} grid (no regressor)")
        else:
            missing.append(f"{kind} (no {target} regressor or {term} grid)")
            continue
        for name, values in _stats(f"attn_{kind}", np.maximum(time_ms, 0.0), np.maximum(spread_ms, 0.0)).items():
            cols[name] = pd.Series(values, index=part.index)
    if missing:
        raise InputError(f"{table_dir}: tables fitted without attention data for {' and '.join(missing)}: Vidur "
                         f"needs attention.csv for prefill and decode attention; fit with --profile .../attention "
                         f"tables too (e.g. AIConfigurator's attention/ directory), or Vidur cannot run")
    frame = pd.DataFrame(cols, index=points.index)
    # K and V of the new tokens (Vidur's num_tokens: the chunk, or one per decode) written at HBM speed.
    new_tokens = np.maximum(points["prefill_chunk_size"], points["batch_size"]).to_numpy(dtype=np.float64)
    kv_bytes = new_tokens * 2 * kv_heads * spec.head_dim * spec.kv_dtype_bytes
    save_ms = kv_bytes / (hbm_gbps * 1e9) * 1e3
    frame = frame.assign(**_stats("attn_kv_cache_save", save_ms, np.zeros(len(frame))))
    for name in ("attn_input_reshape", "attn_output_reshape"):
        frame = frame.assign(**_stats(name, np.zeros(len(frame)), np.zeros(len(frame))))
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
             f"{' and '.join(sources)}",
             f"attn_kv_cache_save estimated: K and V bytes of the new tokens at {hbm_gbps:g} GB/s (--hbm-gbps; "
             f"no input times it)"]
    return frame, notes


def _term(table_dir: Path, meta: dict, name: str):
    entry = term_entry(table_dir, meta, name)
    file = table_dir / entry["file"]
    frame = read_parquet(file, f"the grid of T_step term {name!r}, listed in meta.json", GRID_COLUMNS)
    return read_term(name, entry, frame, file)


# ---------------------------------------------------------------------------- csv, json

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
