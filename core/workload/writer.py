"""Write a trace in our format (docs/design.md contract 3), CSV or Parquet, atomically."""
from __future__ import annotations

from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.io import atomic_write_bytes
from stepcal.core.trace import Trace

TRACE_SUFFIXES = (".csv", ".parquet")


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write `trace` to `path` (.csv or .parquet); read_trace(path) gives the same trace back.

    In CSV, prefix_hash_ids is written as space-separated integers ("0 14 15"); in Parquet,
    as a list<int64> column.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TRACE_SUFFIXES:
        raise InputError(f"{path}: a trace is written as .csv or .parquet, not {suffix or 'no suffix'!r}")
    frame = trace.to_frame()
    if suffix == ".parquet":
        atomic_write_bytes(path, _parquet_bytes(frame))
    else:
        if trace.prefix_hash_ids is not None:
            frame["prefix_hash_ids"] = [" ".join(map(str, ids)) for ids in trace.prefix_hash_ids]
        # float_format None keeps repr precision, so arrival_s reads back bit for bit.
        atomic_write_bytes(path, frame.to_csv(index=False).encode())
    return path


def _parquet_bytes(frame) -> bytes:
    import pyarrow as pa  # lazy: loads pyarrow
    import pyarrow.parquet as pq  # lazy: loads pyarrow
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if "prefix_hash_ids" in frame.columns:
        # Typed explicitly: if every list were empty, Arrow would infer list<null>.
        column = pa.array(list(frame["prefix_hash_ids"]), type=pa.list_(pa.int64()))
        table = table.set_column(table.schema.get_field_index("prefix_hash_ids"),
                                 "prefix_hash_ids", column)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()
