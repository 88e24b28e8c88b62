"""LLMServingSim's per-layer profile bundle: `<variant>/meta.yaml` and one `tp<N>/` folder per
tensor-parallel degree holding dense.csv, per_sequence.csv and attention.csv (times in µs).

The profiler runs a one-layer copy of the model shrunk to one GPU's shard (meta.yaml's
hf_overrides), so every time is one decoder layer's on one GPU of tp<N>; the composition
multiplies the per-layer terms by the model's layer count. The linear layers become GEMM
records whose (n, k) follow from the model spec's shard at that degree; norms, RoPE and the
activation become element-wise records; lm_head and the sampler are timed per sequence.
attention.csv's pure-prefill and pure-decode rows become attention records; its mixed rows (a
prefill chunk beside decodes in one kernel call) become attn_decode_mixed records, the call less
the pure prefill of the same chunk: the composition prices what the prefill adds to the decodes
(costmodel.terms.MixedDecodeAttention) beside the two pure terms.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from stepcal.core.errors import InputError, shown
from stepcal.core.model_spec import ModelSpec, Parallelism
from stepcal.core.readers import one_line
from stepcal.costmodel.records import check_positive, make_records, require_columns

SOURCE = "llmservingsim"
FILES = ("dense.csv", "per_sequence.csv", "attention.csv")
SKEW_FILE = "skew.csv"   # skewed decode batches timed against their uniform mean and maximum controls
# LLMServingSim's dense layer -> our GEMM name (ModelSpec.gemm_shapes).
GEMM_LAYERS = {"qkv_proj": "qkv_proj", "o_proj": "o_proj", "gate_up_proj": "gate_up_proj",
               "down_proj": "down_proj"}
# Its element-wise layers -> our operators. vLLM's RMSNorm fuses the residual add, and a layer
# runs two of them: `layernorm` times one call, so it stands for both norms and no add is kept.
ELEMENTWISE_LAYERS = {"embedding": ("emb",), "layernorm": ("input_layernorm", "post_attention_layernorm"),
                      "rotary_emb": ("attn_rope",), "act_fn": ("mlp_act",)}
# Priced elsewhere: the per-head norms are split into q_norm and k_norm by width; the final norm
# runs on the emitting rows, so it joins the sampler per sequence.
OTHER_DENSE = ("qk_norm", "final_layernorm")
SEQ_LAYERS = ("lm_head", "sampler")


def bundle_dir(path: Path, tp: int | None) -> tuple[Path, dict]:
    """The tp<N> folder to read and the bundle's meta.yaml: `path` is the variant folder (tp<N>
    from `tp`, default 1) or a tp<N> folder inside it."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: not an LLMServingSim bundle directory (the folder holding meta.yaml)")
    variant = path if (path / "meta.yaml").exists() else path.parent
    meta = read_meta(variant / "meta.yaml")
    if variant != path:
        return path, meta
    tp_dir = variant / f"tp{tp or 1}"
    if not tp_dir.is_dir():
        have = ", ".join(sorted(p.name for p in variant.glob("tp*") if p.is_dir())) or "none"
        raise InputError(f"{tp_dir}: no such tp folder in the bundle (--tp; the bundle has {have})")
    return tp_dir, meta


def read_meta(path: Path) -> dict:
    if not path.exists():
        raise InputError(f"{path}: no such file (an LLMServingSim bundle holds meta.yaml)")
    try:
        meta = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read as YAML: {one_line(exc)}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: not an LLMServingSim meta.yaml (expected a mapping)")
    return meta


def tp_of(tp_dir: Path) -> int:
    name = tp_dir.name
    if not (name.startswith("tp") and name[2:].isdigit() and int(name[2:]) >= 1):
        raise InputError(f"{tp_dir}: an LLMServingSim tp folder is named tp<N>, got {name!r}")
    return int(name[2:])


def import_bundle(path, spec: ModelSpec | None, tp: int | None = None) -> pd.DataFrame:
    """Every record of one bundle's tp<N> folder; the model spec gives the shard's shapes."""
    if spec is None:
        raise InputError("--format llmservingsim needs --model-spec: the bundle's layers are "
                         "shaped by the model's dimensions")
    tp_dir, meta = bundle_dir(path, tp)
    degree = tp_of(tp_dir)
    if tp is not None and degree != tp:
        raise InputError(f"{tp_dir}: holds tp {degree} times but --tp is {tp}")
    frames = {name: _read_csv(tp_dir / name) for name in FILES}
    common = dict(tp=degree, device=meta.get("gpu") or meta.get("hardware"), dtype=meta.get("variant"))
    p = Parallelism(tp=degree)
    parts = [_dense(frames["dense.csv"], str(tp_dir / "dense.csv"), spec, p, common),
             _per_sequence(frames["per_sequence.csv"], str(tp_dir / "per_sequence.csv"), frames["dense.csv"],
                           spec, p, common),
             _attention(frames["attention.csv"], str(tp_dir / "attention.csv"), spec, p, common)]
    return pd.concat([part for part in parts if len(part)], ignore_index=True)


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise InputError(f"{path}: no such file (an LLMServingSim tp folder holds {', '.join(FILES)})")
    try:
        return pd.read_csv(path)
    except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise InputError(f"{path}: cannot read as CSV: {one_line(exc)}") from None


def _checked(frame: pd.DataFrame, path: str, axis: str, what: str, known) -> pd.DataFrame:
    """The rows with their times in ms; a missing column, an unknown layer, a non-positive count
    or time fails naming the file (and row)."""
    require_columns(frame, ("layer", axis, "time_us"), path=path, what=what)
    unknown = sorted(set(frame["layer"].astype(str)) - set(known))
    if unknown:
        raise InputError(f"{path}: unknown layer(s) {', '.join(unknown)}; known: {', '.join(known)}")
    check_positive(frame, (axis,), path=path)
    return frame.assign(time_ms=_times_ms(frame, path))


def _times_ms(frame: pd.DataFrame, path: str) -> np.ndarray:
    """time_us in ms; a time that is not a finite positive number fails naming the file and row."""
    values = pd.to_numeric(frame["time_us"], errors="coerce").to_numpy(np.float64)
    bad = ~np.isfinite(values) | (values <= 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{path}: row {i}: column 'time_us' must be a finite positive time in µs, "
                         f"got {shown(frame['time_us'].iloc[i])}")
    return values / 1000.0


def _dense(frame, path, spec: ModelSpec, p: Parallelism, common: dict) -> pd.DataFrame:
    frame = _checked(frame, path, "tokens", "LLMServingSim dense.csv",
                     (*GEMM_LAYERS, *ELEMENTWISE_LAYERS, *OTHER_DENSE))
    shapes, widths = spec.gemm_shapes(p), spec.elementwise_widths(p)
    parts = []
    for layer, rows in frame.groupby("layer", sort=True):
        tokens, time_ms = rows["tokens"].to_numpy(np.float64), rows["time_ms"].to_numpy(np.float64)
        base = dict(row=rows.index.to_numpy(), num_tokens=tokens, **common)
        if layer in GEMM_LAYERS:
            n, k = shapes[GEMM_LAYERS[layer]]
            parts.append(make_records(dict(base, op="gemm", name=GEMM_LAYERS[layer], m=tokens, n=n, k=k,
                                           time_ms=time_ms), source=SOURCE, file=path))
        elif layer == "qk_norm":
            # One call normalises the query and the key heads: its time is split by their widths.
            q, k = widths["q_norm"], widths["k_norm"]
            for name, width in (("q_norm", q), ("k_norm", k)):
                parts.append(make_records(dict(base, op="elementwise", name=name, width=width,
                                               time_ms=time_ms * width / (q + k)), source=SOURCE, file=path))
        for name in ELEMENTWISE_LAYERS.get(layer, ()):
            parts.append(make_records(dict(base, op="elementwise", name=name, width=widths[name], time_ms=time_ms),
                                      source=SOURCE, file=path))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _per_sequence(frame, path, dense, spec: ModelSpec, p: Parallelism, common: dict) -> pd.DataFrame:
    """lm_head: a GEMM of one row per sequence; sampler plus the final norm at as many rows: our
    `sample` operator (final norm and sampling of the emitting rows)."""
    frame = _checked(frame, path, "sequences", "LLMServingSim per_sequence.csv", SEQ_LAYERS)
    parts = []
    lm = frame[frame["layer"] == "lm_head"]
    if len(lm):
        n, k = spec.gemm_shapes(p)["lm_head"]
        seqs = lm["sequences"].to_numpy(np.float64)
        parts.append(make_records(dict(row=lm.index.to_numpy(), op="gemm", name="lm_head", m=seqs, n=n, k=k,
                                       num_tokens=seqs, time_ms=lm["time_ms"].to_numpy(np.float64), **common),
                                  source=SOURCE, file=path))
    sampler = frame[frame["layer"] == "sampler"]
    if len(sampler):
        seqs = sampler["sequences"].to_numpy(np.float64)
        norm = dense[dense["layer"].astype(str) == "final_layernorm"]
        # dense.csv was checked before: its final norm's times are valid µs.
        norm_ms = (np.interp(seqs, norm["tokens"].to_numpy(np.float64), norm["time_us"].to_numpy(np.float64))
                   / 1000.0 if len(norm) else np.zeros(len(seqs)))
        parts.append(make_records(dict(row=sampler.index.to_numpy(), op="elementwise", name="sample",
                                       num_tokens=seqs, width=spec.elementwise_widths(p)["sample"],
                                       time_ms=sampler["time_ms"].to_numpy(np.float64) + norm_ms, **common),
                                  source=SOURCE, file=path))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _attention(frame, path, spec: ModelSpec, p: Parallelism, common: dict) -> pd.DataFrame:
    """Pure-decode and pure-prefill rows as attention records. The prefill's history: the legacy
    `kv_prefill` (cached tokens before the chunk) or `prefill_key` (the chunk's mean causal key
    length, kv + chunk/2)."""
    key = "prefill_key" if "prefill_key" in frame.columns else "kv_prefill"
    require_columns(frame, ("prefill_chunk", key, "n_decode", "kv_decode", "time_us"), path=path,
                    what="LLMServingSim attention.csv")
    for col in ("prefill_chunk", key, "n_decode", "kv_decode"):
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(np.float64)
        bad = ~np.isfinite(values) | (values < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{path}: row {i}: column {col!r} must be a count >= 0, got {frame[col].iloc[i]!r}")
    frame = frame.assign(time_ms=_times_ms(frame, path))
    c, b = frame["prefill_chunk"].to_numpy(np.float64), frame["n_decode"].to_numpy(np.float64)
    heads = dict(num_heads=float(p.split(spec.num_heads)), num_kv_heads=float(p.kv_heads(spec.num_kv_heads)),
                 head_dim=float(spec.head_dim), **common)
    parts = []
    # Speculative verification's decodes (several query tokens each) are not one-token decodes.
    one_token = (pd.to_numeric(frame["decode_q_len"], errors="coerce").fillna(1).to_numpy() <= 1
                 if "decode_q_len" in frame.columns else np.ones(len(frame), dtype=bool))
    dec = frame[(c == 0) & (b > 0) & one_token]
    if len(dec):
        n, s = dec["n_decode"].to_numpy(np.float64), dec["kv_decode"].to_numpy(np.float64)
        zeros = np.zeros(len(dec))
        parts.append(make_records(dict(row=dec.index.to_numpy(), op="attn_decode", num_seqs=n, num_tokens=n,
                                       num_decode=n, decode_kv_sum=n * s, decode_kv_max=s, prefill_tokens=zeros,
                                       prefill_attn_work=zeros, kv_sum=n * s,
                                       time_ms=dec["time_ms"].to_numpy(np.float64), **heads),
                                  source=SOURCE, file=path))
    pre = frame[(c > 0) & (b == 0)]
    mixed = _mixed_decodes(frame[(c > 0) & (b > 0) & one_token], pre, key)
    if len(mixed):
        n, s = mixed["n_decode"].to_numpy(np.float64), mixed["kv_decode"].to_numpy(np.float64)
        zeros = np.zeros(len(mixed))
        parts.append(make_records(dict(row=mixed.index.to_numpy(), op="attn_decode_mixed", num_seqs=n,
                                       num_tokens=n, num_decode=n, decode_kv_sum=n * s, decode_kv_max=s,
                                       prefill_tokens=zeros, prefill_attn_work=zeros, kv_sum=n * s,
                                       time_ms=mixed["time_ms"].to_numpy(np.float64), **heads),
                                  source=SOURCE, file=path))
    if len(pre):
        q = pre["prefill_chunk"].to_numpy(np.float64)
        kv = pre[key].to_numpy(np.float64) - (q / 2 if key == "prefill_key" else 0.0)
        zeros = np.zeros(len(pre))
        parts.append(make_records(dict(row=pre.index.to_numpy(), op="attn_prefill", num_seqs=np.ones(len(pre)),
                                       num_tokens=q, num_decode=zeros, decode_kv_sum=zeros, decode_kv_max=zeros,
                                       prefill_tokens=q, prefill_attn_work=q * (kv + (q + 1) / 2), kv_sum=kv,
                                       time_ms=pre["time_ms"].to_numpy(np.float64), **heads),
                                  source=SOURCE, file=path))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


# The least share of a mixed call its decodes are given (ms): a few decodes beside a prefill cost the
# call almost nothing (one launch instead of two: the share comes out at -13 to +5 µs in the RTX PRO
# 6000 bundle), and the regressors take positive times. 1 µs a layer is under 0.1 ms a step.
MIN_MIXED_SHARE_MS = 0.001


def _mixed_decodes(mixed: pd.DataFrame, pre: pd.DataFrame, key: str) -> pd.DataFrame:
    """Mixed rows with time_ms the decodes' share of the one kernel call: the call less the pure
    prefill of the same chunk and history, at least MIN_MIXED_SHARE_MS (rows without that prefill
    measured are left out)."""
    prefill_ms = pre.groupby(["prefill_chunk", key])["time_ms"].median()
    index = pd.MultiIndex.from_arrays([mixed["prefill_chunk"], mixed[key]])
    own = prefill_ms.reindex(index).to_numpy(np.float64)
    keep = np.isfinite(own)
    share = mixed["time_ms"].to_numpy(np.float64)[keep] - own[keep]
    return mixed[keep].assign(time_ms=np.maximum(share, MIN_MIXED_SHARE_MS))


# The T_step term each record feeds (costmodel.compose), by (op, name); None: any name.
_TERMS = (("gemm", "lm_head", "lm_head"), ("gemm", None, "linear"), ("elementwise", "sample", "sampling"),
          ("elementwise", None, "elementwise"), ("attn_decode", None, "decode_attn"),
          ("attn_decode_mixed", None, "mixed_decode_attn"), ("attn_prefill", None, "prefill_attn"))


def bundle_meta(records: pd.DataFrame, alpha: float | None) -> dict:
    """meta.json's account of the import: the files each composed term came from (sampling also
    holds dense.csv's final norm) and the notes on the skew term (`alpha`: skew_alpha's, None when
    the composition has no decode_attn_skew)."""
    files: dict[str, set] = {}
    for op, name, term in _TERMS:
        # Named rows are taken first (lm_head before the other GEMMs), then dropped.
        rows = records[(records["op"] == op) & ((records["name"] == name) if name else True)]
        if len(rows):
            files.setdefault(term, set()).update(rows["file"])
            records = records.drop(rows.index)
    for term, sources in files.items():
        if term == "sampling":
            sources.update(f.replace("per_sequence.csv", "dense.csv") for f in list(sources))
    notes = [] if alpha is None else [
        f"LLMServingSim skew.csv: decode_attn_skew adds {alpha:.4f} x (decode attention at the batch's longest KV "
        "- at its mean KV), the median alpha of its pure-decode batches; its bucketed skew_fit.csv and its "
        "mixed-batch rows are not used"]
    return {"term_files": {t: sorted(f) for t, f in files.items()}, "notes": notes}


def skew_alpha(paths, tp: int | None) -> float | None:
    """The median alpha of skew.csv's pure-decode batches (time = uniform-mean time + alpha x (uniform-
    maximum time - uniform-mean time)) over the bundles that have one; None where none has."""
    alphas = []
    for path in paths:
        file = bundle_dir(Path(path), tp)[0] / SKEW_FILE
        if not file.exists():
            continue
        frame = _read_csv(file)
        require_columns(frame, ("regime", "alpha"), path=str(file), what="LLMServingSim skew.csv")
        pure = pd.to_numeric(frame.loc[frame["regime"] == "pure", "alpha"], errors="coerce").to_numpy(np.float64)
        if not np.isfinite(pure).all():
            i = int(np.flatnonzero(~np.isfinite(pure))[0])
            raise InputError(f"{file}: pure-decode row {i}: alpha must be a number")
        alphas.append(pure)
    values = np.concatenate(alphas) if alphas else np.empty(0)
    return float(np.median(values)) if len(values) else None
