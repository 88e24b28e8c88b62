"""Step log accumulator: compact columns while simulating, one Arrow table at the end."""
from __future__ import annotations

from array import array
from itertools import chain

import numpy as np

from stepcal.core.batch import FEATURE_NAMES, StepFeatures


class StepLogBuilder:
    """Scalar columns live in typed arrays (8 bytes a value), so millions of steps stay small.

    A decode run is stored as one entry (its first KV lengths and its length) and expanded only
    when the log is written.
    """

    def __init__(self, replica: int, record_batches: bool = True) -> None:
        self.replica = replica
        self.record_batches = record_batches
        self.start_s = array("d")
        self.duration_ms = array("d")
        self.features = {name: array("d") for name in FEATURE_NAMES}
        self._feature_columns = [self.features[name] for name in FEATURE_NAMES]
        self.batches: list[tuple[tuple[int, ...], np.ndarray, np.ndarray, int]] = []  # ids, q, kv0, steps

    def __len__(self) -> int:
        return len(self.start_s)

    def add_step(self, start_s: float, duration_ms: float, feature_row: tuple, request_ids, q_lens, kv_lens) -> None:
        """One step; feature_row holds the FEATURE_NAMES values in order."""
        self.start_s.append(start_s)
        self.duration_ms.append(duration_ms)
        for column, value in zip(self._feature_columns, feature_row):
            column.append(value)
        if self.record_batches:
            self.batches.append((request_ids, q_lens, kv_lens, 1))

    def add_steps(self, start_s: np.ndarray, duration_ms: np.ndarray, features: StepFeatures,
                  request_ids: tuple[int, ...], q_lens: np.ndarray, kv_lens: np.ndarray) -> None:
        """One step, or a decode run of len(start_s) steps whose KV lengths grow by one per step."""
        self.start_s.frombytes(np.ascontiguousarray(start_s, dtype=np.float64).tobytes())
        self.duration_ms.frombytes(np.ascontiguousarray(duration_ms, dtype=np.float64).tobytes())
        for name in FEATURE_NAMES:
            self.features[name].frombytes(np.ascontiguousarray(getattr(features, name), dtype=np.float64).tobytes())
        if self.record_batches:
            self.batches.append((request_ids, q_lens, kv_lens, len(start_s)))

    def to_table(self):
        """The log as an Arrow table: the scalar columns, then (when recorded) each step's request_ids,
        q_lens and kv_lens as list columns. Arrow lists are built from flat values and offsets, which
        writes to Parquet several times faster than a DataFrame column of per-step arrays."""
        import pyarrow as pa  # lazy: loads pyarrow
        n = len(self)
        columns = {"replica": np.full(n, self.replica, dtype=np.int64), "step": np.arange(n, dtype=np.int64),
                   "start_s": _floats(self.start_s), "duration_ms": _floats(self.duration_ms)}
        for name in FEATURE_NAMES:
            values = _floats(self.features[name])
            columns[name] = values if name == "prefill_attn_work" else values.astype(np.int64)
        table = pa.table(columns)
        if self.record_batches:
            offsets, flat = self._expand_batches(n)
            offsets = pa.array(offsets)
            for name, values in flat.items():
                table = table.append_column(name, pa.ListArray.from_arrays(offsets, pa.array(values)))
        return table

    def to_frame(self):
        """The log as a DataFrame; list columns hold one int64 array per step (as read back from Parquet)."""
        return self.to_table().to_pandas()

    def _expand_batches(self, num_rows: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Row offsets and the flat request_ids / q_lens / kv_lens of every step, decode runs expanded
        (step j of a run sees each KV length grown by j)."""
        batches = self.batches
        num_entries = len(batches)
        num_steps = np.fromiter((b[3] for b in batches), np.int64, num_entries)
        width = np.fromiter((len(b[0]) for b in batches), np.int64, num_entries)
        ids = np.fromiter(chain.from_iterable(b[0] for b in batches), np.int64, int(width.sum()))
        q_lens = np.concatenate([b[1] for b in batches]) if batches else np.zeros(0, np.int64)
        kv_lens = np.concatenate([b[2] for b in batches]) if batches else np.zeros(0, np.int64)
        entry_start = np.cumsum(width) - width
        row_entry = np.repeat(np.arange(num_entries), num_steps)
        step_in_run = np.arange(num_rows) - np.repeat(np.cumsum(num_steps) - num_steps, num_steps)
        row_width = width[row_entry]
        offsets = np.zeros(num_rows + 1, dtype=np.int64)
        np.cumsum(row_width, out=offsets[1:])
        # each flat slot's index into the entry's arrays: its entry's start plus its place in the row
        source = np.repeat(entry_start[row_entry] - offsets[:-1], row_width) + np.arange(offsets[-1])
        flat = {"request_ids": ids[source], "q_lens": q_lens[source].astype(np.int64),
                "kv_lens": kv_lens[source].astype(np.int64) + np.repeat(step_in_run, row_width)}
        return offsets, flat


def _floats(values: array) -> np.ndarray:
    return np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0)
