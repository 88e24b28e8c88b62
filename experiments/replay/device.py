"""The replay device: a measured profile answering new measurements.

`replay:PROFILE` names a profile in any format the cost model imports (costmodel.importers: our
profile directory or table, Vidur's mlp.csv, an AIConfigurator system directory or Parquet table,
an LLMServingSim bundle). A query is one profile row's shape; it is answered from the records of
the same op and dtype whose fixed geometry (heads, widths, parallel degrees, sub-operation) is the
query's, by log-space interpolation over the op's size axes (replay.interpolate), and refused
outside the measured hull. Each answer carries the profile's own repeat scatter: the p10-p90 spread
of its rows where it has one, else DEFAULT_REL_SCATTER (an assumption, said so in meta.json).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError
from stepcal.costmodel.importers import load_profiles
from stepcal.experiments.replay.interpolate import Estimate, LogInterpolator

PREFIX = "replay:"
# Relative scatter (sigma of log time) of a kernel's repeats where the profile keeps only medians
# (AIConfigurator, LLMServingSim): CUDA-event timings of one kernel typically spread 1-3%.
DEFAULT_REL_SCATTER = 0.02
P10_P90_SIGMAS = 2.5631          # width of the 10-90 percentile range of a normal, in sigmas
# The size axes each op is interpolated over; every other shape column must match exactly.
SIZE_AXES = {"gemm": ("m", "n", "k"),
             "attn_prefill": ("num_seqs", "prefill_tokens", "kv_sum"),
             "attn_decode": ("num_seqs", "decode_kv_sum"),
             "mla_prefill": ("num_seqs", "prefill_tokens", "kv_sum"),
             "mla_decode": ("num_seqs", "decode_kv_sum")}
DEFAULT_AXES = ("num_tokens",)
FIXED_COLUMNS = ("num_heads", "num_kv_heads", "head_dim", "width", "tp", "ep", "expert_ffn_size",
                 "num_experts", "experts_per_token")
NAMED_OPS = ("elementwise", "moe", "all_reduce")   # ops whose `name` is a different kernel


def replay_path(device: str) -> str | None:
    """PROFILE of a `replay:PROFILE` device; None for any other device."""
    return device[len(PREFIX):] if str(device).startswith(PREFIX) else None


@dataclass
class ReplayDevice:
    """The records of one measured profile, answering shapes (see the module's docstring)."""
    records: pd.DataFrame
    source: str
    _slices: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: str, spec=None) -> ReplayDevice:
        """The profile at `path`; an LLMServingSim bundle (a directory with meta.yaml) is shaped by
        the ModelSpec `spec`, at tensor-parallel degree 1."""
        where = Path(path)
        if not where.exists():
            raise InputError(f"--device replay:{path}: no such file or directory")
        if (where / "meta.yaml").exists():
            records = load_profiles([where], "llmservingsim", spec=spec, tp=1)
        else:
            records = load_profiles([where])
        return cls(records, str(path))

    @property
    def device_name(self) -> str:
        names = sorted({str(d) for d in self.records["device"].dropna()})
        return ", ".join(names) if names else "unknown"

    @property
    def has_scatter(self) -> bool:
        return bool(self.records[["time_ms_p10", "time_ms_p90"]].notna().all(axis=1).any())

    def check_ops(self, ops, dtype: str) -> None:
        """Every op in `ops` has records at `dtype`, else the InputError says what the profile holds."""
        have = self.records.groupby("op")["dtype"].agg(lambda d: sorted({str(x) for x in d.dropna()}))
        for op in ops:
            if op not in have.index:
                raise InputError(f"--device replay:{self.source}: the profile has no {op!r} records "
                                 f"(it has: {', '.join(sorted(have.index))})")
            if have[op] and dtype not in have[op]:
                raise InputError(f"--device replay:{self.source}: no {op!r} records at dtype {dtype} "
                                 f"(it has: {', '.join(have[op])})")

    def estimate(self, shape: dict, dtype: str) -> Estimate | str:
        """The replayed time of one profile row's shape (op, name, size and geometry columns), or
        why there is none (a string: the shape lies outside what the profile measured)."""
        op = shape["op"]
        rows = self._rows(op, dtype)
        if op in NAMED_OPS:
            rows = rows[rows["name"] == shape.get("name")]
        fixed = {}
        for col in FIXED_COLUMNS:
            value = shape.get(col)
            if value is None or pd.isna(value) or rows[col].isna().all():
                continue
            fixed[col] = float(value)
            rows = rows[rows[col] == float(value)]
        if rows.empty:
            what = ", ".join(f"{k}={v:g}" for k, v in fixed.items())
            return f"replay: the profile has no {op} {shape.get('name') or ''} records at {what or 'this shape'}"
        axes = [c for c in SIZE_AXES.get(op, DEFAULT_AXES) if rows[c].notna().any()]
        query = [shape.get(c) for c in axes]
        if any(v is None or pd.isna(v) for v in query):
            return f"replay: the shape lacks {', '.join(axes)}"
        key = (op, dtype, shape.get("name") if op in NAMED_OPS else None, tuple(sorted(fixed.items())))
        if key not in self._slices:
            self._slices[key] = LogInterpolator(rows[axes].to_numpy(), rows["time_ms"].to_numpy(),
                                                rel_scatter(rows))
        found = self._slices[key].estimate(np.asarray(query, dtype=np.float64))
        if found is None:
            where = ", ".join(f"{a}={float(v):g}" for a, v in zip(axes, query))
            return f"replay: outside the measured hull of {op} ({where})"
        return found

    def _rows(self, op: str, dtype: str) -> pd.DataFrame:
        rows = self.records[(self.records["op"] == op) & self.records["time_ms"].gt(0)]
        return rows[rows["dtype"].isna() | (rows["dtype"] == dtype)]


def rel_scatter(rows: pd.DataFrame) -> np.ndarray:
    """Sigma of log time per row: from its p10-p90 spread where it has one, else the default."""
    p10, p90 = rows["time_ms_p10"].to_numpy(float), rows["time_ms_p90"].to_numpy(float)
    ok = np.isfinite(p10) & np.isfinite(p90) & (p10 > 0) & (p90 >= p10)
    out = np.full(len(rows), DEFAULT_REL_SCATTER)
    out[ok] = np.log(p90[ok] / p10[ok]) / P10_P90_SIGMAS
    return out


def scatter_note(device: ReplayDevice) -> str:
    """What the replayed scatter comes from, for meta.json."""
    if device.has_scatter:
        return "the profile's p10-p90 spread per row"
    return f"assumed: {DEFAULT_REL_SCATTER:g} (sigma of log time; the profile keeps medians only)"
