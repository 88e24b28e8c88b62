"""The Vidur export (`stepcal tables export --format vidur`): mlp.csv and attention.csv in the layout
of Vidur's profiling data, per layer, in ms (costmodel.vidur_models holds what Vidur reads and where
the facts come from).

mlp.csv: per-layer operator times at Vidur's own num_tokens sweep (every 8 tokens to 1024, ...) up to
the tables' range, evaluated from the fitted regressors in models/ with the same record columns
ops.parquet was built from (costmodel.compose.op_grids), not interpolated in ops.parquet's grid. An
operator without a regressor is interpolated in ops.parquet (linear in log num_tokens); the
element-wise operators of tables whose element-wise term is a memory roofline (no profile timed them)
get the roofline's time of one call; the printed line says which. attention.csv:
costmodel.export_vidur_attention. The filter keys: costmodel.vidur_keys.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError, shown
from stepcal.core.model_spec import HEAD_NORMS, ModelSpec, Parallelism
from stepcal.core.readers import one_line, read_parquet
from stepcal.costmodel.devices import find_device
from stepcal.costmodel.export_plain import OPS_WHAT, write_csv
from stepcal.costmodel.export_vidur_attention import vidur_attention
from stepcal.costmodel.roofline import op_constants
from stepcal.costmodel.saved_regressors import fitted, load_regressor
from stepcal.costmodel.table_meta import TableMeta
from stepcal.costmodel.terms import require_finite_numbers
from stepcal.costmodel.vidur_keys import filter_keys
from stepcal.costmodel.vidur_models import num_tokens_sweep, stat_columns
from stepcal.simulator.step_model import HostTerms

# Our operator names -> Vidur's (mlp.csv columns time_stats.<op>.<stat>).
VIDUR_OPS = {"qkv_proj": "attn_pre_proj", "o_proj": "attn_post_proj", "gate_up_proj": "mlp_up_proj",
             "down_proj": "mlp_down_proj", "emb": "emb", "input_layernorm": "input_layernorm",
             "attn_rope": "attn_rope", "post_attention_layernorm": "post_attention_layernorm",
             "mlp_act": "mlp_act", "add": "add"}
GEMM_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
SOURCES = ("regressor", "interpolated", "roofline", "zeros")


def export_vidur(table_dir: Path, meta: TableMeta, out: Path, model_name: str | None,
                 hbm_gbps: float) -> tuple[list[Path], tuple[str, ...]]:
    """Write mlp.csv and attention.csv into `out`; the files and the notes on how they were made."""
    spec, tp = vidur_spec(table_dir, meta)
    keys, key_note = filter_keys(meta, table_dir / "meta.json", spec, tp, model_name)
    mlp, mlp_notes = vidur_mlp(table_dir, meta, spec, tp, keys, read_ops(table_dir))
    attention, attention_notes = vidur_attention(table_dir, meta, spec, tp, keys, hbm_gbps)
    scale, host_notes = calibrated_scale(meta, table_dir)
    mlp, attention = scaled_times(mlp, scale), scaled_times(attention, scale)
    files = [write_csv(mlp, out / "mlp.csv"), write_csv(attention, out / "attention.csv")]
    return files, (key_note, *mlp_notes, *attention_notes, *host_notes)


def calibrated_scale(meta: TableMeta, table_dir: Path) -> tuple[float, list[str]]:
    """What a `stepcal calibrate` directory's host terms give Vidur's files: the base's scale, which
    prices every operator (a calibration that found the tables too slow scales them down); the
    other terms (per step, sequence and token, the request path) are not operator times, and Vidur
    models the CPU's share itself, so they stay out and the notes say so. (1.0, []) for plain tables."""
    terms = meta.host_terms
    if not terms:
        return 1.0, []
    if not isinstance(terms, dict):
        raise InputError(f"{table_dir / 'meta.json'}: host_terms must be an object, got {shown(terms)}")
    host = HostTerms.from_dict(terms)
    added = [name for name in HostTerms.engine_names() if getattr(host, name)]
    notes = [f"every time times the calibration's base_scale {host.base_scale:.4g}"] if host.base_scale != 1.0 else []
    if added:
        notes.append(f"calibrated host terms left out ({', '.join(sorted(added))}): Vidur's files time operators only")
    return host.base_scale, notes


def scaled_times(frame: pd.DataFrame, scale: float) -> pd.DataFrame:
    """Every time_stats column (min, max, mean, median, std: each scales with the times) times `scale`."""
    if scale == 1.0:
        return frame
    columns = [c for c in frame.columns if c.startswith("time_stats.")]
    return frame.assign(**{c: frame[c] * scale for c in columns})


def vidur_spec(table_dir: Path, meta: TableMeta) -> tuple[ModelSpec, int]:
    """The tables' model and TP degree, refused where Vidur cannot express the model."""
    data = meta.model_spec
    if not data:
        raise InputError(f"{table_dir}: vidur export needs tables fitted with --model-spec (model dimensions)")
    if not isinstance(data, dict):
        raise InputError(f"{table_dir / 'meta.json'}: model_spec must be an object of ModelSpec fields, "
                         f"got {shown(data)}")
    try:
        spec = ModelSpec(**data)
    except TypeError as exc:
        raise InputError(f"{table_dir / 'meta.json'}: model_spec is not a model spec ({one_line(exc)})") from None
    tp = meta.tp or 1
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


def read_ops(table_dir: Path) -> pd.DataFrame | None:
    path = table_dir / "ops.parquet"
    if not path.exists():
        return None
    ops = read_parquet(path, OPS_WHAT, ("op", "num_tokens", "time_ms", "spread_ms"))
    require_finite_numbers(ops, path, labels=("op",))
    return ops


def max_tokens(table_dir: Path, meta: TableMeta, ops: pd.DataFrame | None) -> int:
    """The tables' num_tokens range: ops.parquet's, else the axis in meta.json."""
    if ops is not None and len(ops):
        top = float(ops["num_tokens"].max())
    else:
        axis = meta.axes.get("num_tokens") if isinstance(meta.axes, dict) else None
        try:
            top = max(float(t) for t in axis)
        except (TypeError, ValueError):
            raise InputError(f"{table_dir}: no ops.parquet and no num_tokens axis in meta.json: "
                             f"no per-layer operator times to export") from None
    if not top >= 1:
        raise InputError(f"{table_dir}: the tables' num_tokens reach {shown(top)}, not even one token")
    return int(top)


def vidur_mlp(table_dir: Path, meta: TableMeta, spec: ModelSpec, tp: int, keys: dict,
              ops: pd.DataFrame | None) -> tuple[pd.DataFrame, list[str]]:
    tokens = num_tokens_sweep(max_tokens(table_dir, meta, ops))
    grids = _regressor_grids(table_dir, meta, spec, tp, tokens)
    roofline, roofline_note = _roofline_calls(meta, spec, tp, tokens)
    cols, made = {}, {how: [] for how in SOURCES}
    head_ms, head_spread_ms, folded = _head_norm_times(spec, tokens, grids, ops, roofline)
    for ours, theirs in VIDUR_OPS.items():
        time_ms, spread_ms, how = _op_times(ours, tokens, grids, ops, roofline)
        made[how].append(theirs)
        if ours == "input_layernorm":   # Vidur sums a layer's operators: the step keeps their time
            time_ms, spread_ms = time_ms + head_ms, spread_ms + head_spread_ms
        cols.update(stat_columns(theirs, np.maximum(time_ms, 0.0), np.maximum(spread_ms, 0.0)))
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
    if made["roofline"]:
        notes.append(f"{', '.join(made['roofline'])} {roofline_note}")
    if made["zeros"]:
        notes.append(f"{', '.join(made['zeros'])} zero (no data)" + (f": {roofline_note}" if roofline_note else ""))
    if spec.qk_norm:
        notes.append(f"{' and '.join(folded)} (this model's per-head query and key norms) added into input_layernorm: "
                     "Vidur's mlp.csv has no column for them" if folded else
                     "q_norm, k_norm (this model's per-head query and key norms) left out: no estimate of them")
    return frame, notes


def _head_norm_times(spec: ModelSpec, tokens: np.ndarray, grids: pd.DataFrame | None, ops: pd.DataFrame | None,
                     roofline: dict) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A qk_norm model's per-head query and key norms, which Vidur's mlp.csv has no column for: their
    time and spread per layer at `tokens`, summed (zeros for a model without them), and each one that
    had an estimate, with its source."""
    time_ms, spread_ms, found = np.zeros(len(tokens)), np.zeros(len(tokens)), []
    for name in HEAD_NORMS if spec.qk_norm else ():
        one_ms, one_spread_ms, how = _op_times(name, tokens, grids, ops, roofline)
        if how != "zeros":
            time_ms, spread_ms = time_ms + one_ms, spread_ms + one_spread_ms
            found.append(f"{name} ({how})")
    return time_ms, spread_ms, found


def _regressor_grids(table_dir: Path, meta: TableMeta, spec: ModelSpec, tp: int, tokens: np.ndarray) -> pd.DataFrame | None:
    """op_grids() of the tables' regressors at Vidur's num_tokens; None without any regressor."""
    from stepcal.costmodel.compose import Axes, op_grids  # lazy: loads sklearn; composition: only this format needs it
    targets = {t: m for t in ("gemm", *(f"elementwise:{op}" for op in (*VIDUR_OPS, *HEAD_NORMS)))
               if (m := load_regressor(table_dir, meta, t)) is not None}
    if not targets:
        return None
    axes = dataclasses.replace(Axes.default(), num_tokens=tokens.astype(np.float64))
    return op_grids(fitted(targets), spec, Parallelism(tp=tp), axes)


def _op_times(ours: str, tokens: np.ndarray, grids: pd.DataFrame | None, ops: pd.DataFrame | None,
              roofline: dict) -> tuple[np.ndarray, np.ndarray, str]:
    """One operator's time and spread per layer at `tokens`, and which source gave them."""
    rows = grids[grids["op"] == ours] if grids is not None else ()
    if len(rows):
        rows = rows.set_index("num_tokens").reindex(tokens.astype(np.float64))
        return rows["time_ms"].to_numpy(), rows["spread_ms"].to_numpy(), "regressor"
    if ops is not None and ((ops["op"] == ours) & (ops["num_tokens"] > 0)).any():
        # No regressor for this operator: ops.parquet's grid, linear in log num_tokens.
        grid = ops[(ops["op"] == ours) & (ops["num_tokens"] > 0)].sort_values("num_tokens")
        x, at = np.log(grid["num_tokens"].to_numpy(dtype=np.float64)), np.log(tokens)
        return (np.interp(at, x, grid["time_ms"].to_numpy(dtype=np.float64)),
                np.interp(at, x, grid["spread_ms"].to_numpy(dtype=np.float64)), "interpolated")
    if ours in roofline:
        return (*roofline[ours], "roofline")
    # Vidur expects every operator; one we have no estimate of costs nothing (and is named).
    return np.zeros(len(tokens)), np.zeros(len(tokens)), "zeros"


def _roofline_calls(meta: TableMeta, spec: ModelSpec, tp: int, tokens: np.ndarray) -> tuple[dict, str]:
    """Where the tables' element-wise term is the memory roofline (meta.json term_sources): each
    element-wise operator's roofline time and spread for one call (one layer's, as Vidur's profiler
    times it: one residual add per layer) at `tokens`, by our operator name; and the note that says
    so, or why there is no such estimate. ({}, "") where the term came from data."""
    from stepcal.costmodel.compose_elementwise import roofline_call_ms, roofline_ops  # lazy: loads sklearn
    sources = meta.term_sources
    source = sources.get("elementwise") if isinstance(sources, dict) else None
    if not isinstance(source, dict) or source.get("source") != "roofline":
        return {}, ("no element-wise term: fit with --device-spec NAME for a roofline estimate"
                    if "elementwise" in (meta.missing_terms or []) else "")
    device = find_device(source.get("device"))
    if device is None:
        return {}, (f"the element-wise term is a roofline on device {shown(source.get('device'))}, "
                    f"which this stepcal's devices.json does not hold")
    calls = {}
    for op in roofline_ops(spec, Parallelism(tp=tp)):
        if (op.name in VIDUR_OPS or op.name in HEAD_NORMS) and op.name not in calls:
            one = roofline_call_ms(spec, device, op, tokens)
            calls[op.name] = (one, one * op_constants(op.name).relative_sd)
    return calls, (f"roofline estimates on {device.title} (the tables' element-wise term is a memory roofline, "
                   f"no profile times them: one call's time per layer)")
