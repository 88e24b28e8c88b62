"""Exports of a T_step table directory, by format: Vidur's profile layout (mlp.csv, attention.csv:
costmodel.export_vidur, with its attention.csv in costmodel.export_vidur_attention and its filter keys
in costmodel.vidur_keys), an AIConfigurator system (costmodel.export_aiconfigurator), plain CSV and
JSON (costmodel.export_plain). This module picks the format;
the names callers import stay importable from here."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.costmodel.export_aiconfigurator import DEFAULT_VERSION, export_aiconfigurator
from stepcal.costmodel.export_plain import OPS_WHAT, export_csv, export_json
from stepcal.costmodel.export_vidur import GEMM_OPS, VIDUR_OPS, export_vidur
from stepcal.costmodel.export_vidur_attention import (
    ATTENTION_BACKEND,
    ATTENTION_SOURCES,
    DEFAULT_HBM_GBPS,
    attention_features,
)
from stepcal.costmodel.table_meta import TableMeta
from stepcal.costmodel.vidur_models import STATS

EXPORT_FORMATS = ("vidur", "aiconfigurator", "csv", "json")
__all__ = ["ATTENTION_BACKEND", "ATTENTION_SOURCES", "DEFAULT_HBM_GBPS", "EXPORT_FORMATS", "GEMM_OPS", "OPS_WHAT",
           "STATS", "VIDUR_OPS", "Export", "attention_features", "export_tables"]


@dataclass(frozen=True)
class Export:
    """The files an export wrote, and what a person should know of how they were made."""
    files: list[Path]
    notes: tuple[str, ...] = ()


def export_tables(table_dir: str | Path, fmt: str, out: Path, *, vidur_model: str | None = None,
                  hbm_gbps: float = DEFAULT_HBM_GBPS, aic_system: str | None = None,
                  aic_version: str = DEFAULT_VERSION, aic_predict_all: bool = False) -> Export:
    """Write the export files into `out` (a staging directory)."""
    table_dir = Path(table_dir)
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"--format: unknown export format {fmt!r}; known: {', '.join(EXPORT_FORMATS)}")
    if fmt != "vidur" and vidur_model is not None:
        raise InputError(f"--vidur-model applies to --format vidur only, not {fmt}")
    if fmt != "aiconfigurator" and (aic_system is not None or aic_predict_all):
        flag = "--aic-system" if aic_system is not None else "--aic-predict-all"
        raise InputError(f"{flag} applies to --format aiconfigurator only, not {fmt}")
    meta = TableMeta.read(table_dir)
    if fmt == "aiconfigurator":
        return Export(*export_aiconfigurator(table_dir, meta, out, aic_system, aic_version,
                                                   predict_all=aic_predict_all))
    if fmt == "vidur":
        return Export(*export_vidur(table_dir, meta, out, vidur_model, hbm_gbps))
    return Export(export_csv(table_dir, meta, out) if fmt == "csv" else export_json(table_dir, meta, out))
