"""The AIConfigurator export (`stepcal tables export --format aiconfigurator`): a systems directory
AIConfigurator (and AISimulate) loads unchanged, `<system>.yaml` plus
`data/<system>/<family>/vllm/<version>/<table>.parquet` for every kernel table the fit has a
regressor for (GEMM, attention prefill and decode, all-reduce, MoE, MLA).

Each table holds AIConfigurator's lookup grid (costmodel.export_aiconfigurator_shapes) with the
profile's own time where it measured that shape and the fitted regressor's prediction elsewhere
(costmodel.export_aiconfigurator_values); the column `stepcal_source` says which. The yaml:
costmodel.export_aiconfigurator_system. What AIConfigurator cannot express is refused in one line:
tables fitted to whole steps, calibrated host terms, a device without a datasheet, a dtype its
tables do not have, a model without the kernels its estimate needs.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from stepcal.core.errors import InputError, shown
from stepcal.core.io import atomic_write_bytes, atomic_write_table
from stepcal.core.model_spec import ModelSpec
from stepcal.core.readers import one_line
from stepcal.costmodel import export_aiconfigurator_shapes as shapes
from stepcal.costmodel.aiconfigurator_contract import TABLES, table_path, table_problems
from stepcal.costmodel.devices import DeviceSpec, find_device, known_devices
from stepcal.costmodel.export_aiconfigurator_system import system_yaml
from stepcal.costmodel.export_aiconfigurator_values import MEASURED, profile_records, table_values
from stepcal.costmodel.saved_regressors import load_regressor
from stepcal.costmodel.table_meta import TableMeta

BACKEND = "vllm"
DEFAULT_VERSION = "0.14.0"
KERNEL_SOURCE = "stepcal"
# Our dtype -> AIConfigurator's name of it, for the dtypes its vLLM tables hold.
AIC_DTYPES = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "int4": "int4_wo"}
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
KV_DTYPES = {"bfloat16": "bfloat16", "fp8": "fp8"}
_PA_TYPES = {"int64": pa.int64(), "double": pa.float64(), "string": pa.string()}


def export_aiconfigurator(table_dir: Path, meta: TableMeta, out: Path, system: str | None, version: str,
                          predict_all: bool = False) -> tuple[list[Path], tuple[str, ...]]:
    """Write the systems directory into `out`; the files and the notes on how they were made. With
    `predict_all`, every time is the fit's prediction, measured shapes too."""
    for flag, value in (("--aic-system", system), ("--aic-version", version)):
        if value is not None and not NAME.fullmatch(value):
            raise InputError(f"{flag}: {value!r} is not a file name (letters, digits, '.', '_', '-')")
    spec = _spec(table_dir, meta)
    device = _device(table_dir, meta)
    system = system or f"stepcal_{device.name}"
    # Each regressor is unpickled once: a forest of GEMMs takes seconds to load.
    models = {t: m for t in sorted(meta.targets) if (m := load_regressor(table_dir, meta, t)) is not None}
    _refuse_inexpressible(table_dir, meta, spec, set(models))
    profile, profile_note = (None, "") if predict_all else profile_records(
        meta.extra.get("inputs"), meta.provenance.get("devices"), spec, meta.tp or 1)
    data_dir = f"data/{system}"
    notes, counts, by_table = [note for note in (profile_note,) if note], Counter(), {}
    for table, target, frame in plan(table_dir, meta, spec, list(models)):
        values = table_values(frame, table, target, models[target], profile)
        by_table.setdefault(table, []).append(_finish(frame, device, version, values))
        counts["measured"] += int(np.sum(values.source == MEASURED))
        counts["floored"] += values.floored
    # Several targets may fill one table (two all-reduce implementations, two MoE routings).
    files = [_write_table(table, pd.concat(frames, ignore_index=True),
                          out / table_path(data_dir, table, BACKEND, version))
             for table, frames in by_table.items()]
    rows = sum(len(frame) for frames in by_table.values() for frame in frames)
    yaml_path = out / f"{system}.yaml"
    atomic_write_bytes(yaml_path, system_yaml(device, data_dir).encode())
    notes.append(f"AIConfigurator system {system!r} ({BACKEND} {version}): {rows} rows in {len(files)} tables, "
                 f"{counts['measured']} measured by the profile, {rows - counts['measured']} predicted by the fit")
    if counts["floored"]:
        notes.append(f"{counts['floored']} predictions below {1e-3:g} ms raised to it")
    notes.append("element-wise operators are left to AIConfigurator's memory roofline on the yaml's mem_bw")
    return [yaml_path, *files], tuple(notes)


def plan(table_dir: Path, meta: TableMeta, spec: ModelSpec,
         targets: list[str]) -> list[tuple[str, str, pd.DataFrame]]:
    """(table, target, shapes) for every kernel table of `targets` (the fitted regressors)."""
    weights = _aic_dtype(table_dir, spec.dtype, "the model's dtype")
    kv = _aic_dtype(table_dir, spec.kv_dtype or spec.dtype, "the KV cache's dtype", KV_DTYPES)
    compute = _aic_dtype(table_dir, spec.compute_dtype, "the activations' dtype")
    out = []
    for target in targets:
        kind, _, name = target.partition(":")
        if kind == "gemm":
            gemm_dtype = _aic_dtype(table_dir, name, "a GEMM dtype") if name else _gemm_dtype(table_dir, meta, weights)
            out.append(("gemm_perf", target, shapes.gemm_shapes(gemm_dtype)))
        elif kind == "attn_prefill":
            out.append(("context_attention_perf", target, shapes.prefill_shapes(kv, spec.head_dim)))
        elif kind == "attn_decode":
            out.append(("generation_attention_perf", target, shapes.decode_shapes(kv, spec.head_dim)))
        elif kind == "all_reduce":
            out.append(("custom_allreduce_perf", target, shapes.allreduce_shapes(name or KERNEL_SOURCE, compute)))
        elif kind == "moe" and spec.is_moe:
            out.append(("moe_perf", target, shapes.moe_shapes(spec, name or "balanced", weights)))
        elif kind == "mla_prefill":
            out.append(("context_mla_perf", target, shapes.mla_prefill_shapes(kv)))
        elif kind == "mla_decode":
            out.append(("generation_mla_perf", target, shapes.mla_decode_shapes(kv)))
    return out


def _spec(table_dir: Path, meta: TableMeta) -> ModelSpec:
    data = meta.model_spec
    if not isinstance(data, dict):
        raise InputError(f"{table_dir}: the aiconfigurator export needs tables fitted with --model-spec "
                         f"(the model's head_dim and experts shape its tables)")
    try:
        return ModelSpec(**data)
    except (TypeError, InputError) as exc:
        raise InputError(f"{table_dir / 'meta.json'}: model_spec is not a model spec ({one_line(exc)})") from None


def _device(table_dir: Path, meta: TableMeta) -> DeviceSpec:
    names = list(meta.provenance.get("devices") or [])
    found = [find_device(str(name)) for name in names]
    known = [spec for spec in found if spec is not None]
    if not known:
        raise InputError(f"{table_dir}: no datasheet for the device the tables were fitted on "
                         f"({', '.join(map(str, names)) or 'none recorded'}); the AIConfigurator system yaml "
                         f"needs one of: {', '.join(known_devices())}")
    if len({spec.name for spec in known}) > 1:
        raise InputError(f"{table_dir}: tables fitted on several devices ({', '.join(map(str, names))}); "
                         f"an AIConfigurator system is one device")
    return known[0]


def _refuse_inexpressible(table_dir: Path, meta: TableMeta, spec: ModelSpec, targets: set[str]) -> None:
    if meta.mode != "composed":
        raise InputError(f"{table_dir}: tables of mode {meta.mode!r} time whole steps; AIConfigurator "
                         f"composes steps from kernel tables, so it cannot express them")
    if meta.host_terms:
        raise InputError(f"{table_dir}: calibrated host terms have no place in AIConfigurator's kernel "
                         f"tables; export the tables `stepcal fit` wrote, before calibration")
    have = {t.partition(":")[0] for t in targets}
    # AIConfigurator's loader stops without GQA attention rows, for an MLA model too.
    needed = ("gemm", "attn_prefill", "attn_decode", *(("mla_prefill", "mla_decode") if spec.is_mla else ()),
              *(("moe",) if spec.is_moe else ()))
    missing = [t for t in needed if t not in have]
    if missing:
        why = " (its loader needs GQA attention tables for an MLA model too)" if spec.is_mla else ""
        raise InputError(f"{table_dir}: no fitted {', '.join(missing)} regressor: AIConfigurator cannot "
                         f"estimate {spec.name!r} without those kernels' tables{why}")


def _aic_dtype(table_dir: Path, dtype, what: str, known=None) -> str:
    known = known or AIC_DTYPES
    name = {"bf16": "bfloat16"}.get(str(dtype), str(dtype))
    if name not in known:
        raise InputError(f"{table_dir}: {what} {shown(dtype)} has no AIConfigurator vLLM table "
                         f"(it holds {', '.join(known)})")
    return known[name]


def _gemm_dtype(table_dir: Path, meta: TableMeta, model_dtype: str) -> str:
    """The one GEMM target's dtype: the dtype its linear term was fitted on, else the model's."""
    linear = meta.term_sources.get("linear") if isinstance(meta.term_sources, dict) else None
    dtypes = set((linear or {}).get("gemm_dtypes", {}).values()) if isinstance(linear, dict) else set()
    return _aic_dtype(table_dir, dtypes.pop(), "the GEMM dtype") if len(dtypes) == 1 else model_dtype


def _finish(frame: pd.DataFrame, device: DeviceSpec, version: str, values) -> pd.DataFrame:
    """The shapes with AIConfigurator's provenance columns, the times and where each came from."""
    front = pd.DataFrame({"framework": "VLLM", "version": version, "device": device.title,
                          "kernel_source": KERNEL_SOURCE}, index=frame.index)
    return pd.concat([front, frame], axis=1).assign(latency=values.latency_ms,
                                                    stepcal_source=values.source.astype(str))


def _write_table(table: str, frame: pd.DataFrame, path: Path) -> Path:
    """Write with the contract's Parquet types; a table that breaks the contract is stepcal's fault."""
    kinds = {name: TABLES[table].columns.get(name, "double" if name == "latency" else
                                             ("int64" if frame[name].dtype.kind == "i" else "string"))
             for name in frame.columns}
    key = TABLES[table].key
    problems = table_problems(table, kinds, list(frame[list(key)].itertuples(index=False, name=None)))
    if problems:
        raise RuntimeError("; ".join(problems))
    schema = pa.schema([(name, _PA_TYPES[kinds[name]]) for name in frame.columns])
    atomic_write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False), path)
    return path
