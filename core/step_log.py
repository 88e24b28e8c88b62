"""Step log accumulator: compact columns while simulating, one DataFrame at the end."""
from __future__ import annotations

from array import array

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

    def to_frame(self):
        import pandas as pd  # lazy: loads pandas
        n = len(self)
        data = {"replica": np.full(n, self.replica, dtype=np.int64), "step": np.arange(n, dtype=np.int64),
                "start_s": np.frombuffer(self.start_s, dtype=np.float64) if n else np.zeros(0),
                "duration_ms": np.frombuffer(self.duration_ms, dtype=np.float64) if n else np.zeros(0)}
        for name in FEATURE_NAMES:
            col = np.frombuffer(self.features[name], dtype=np.float64) if n else np.zeros(0)
            data[name] = col if name == "prefill_attn_work" else col.astype(np.int64)
        frame = pd.DataFrame(data)
        if self.record_batches:
            ids, qs, kvs = self._expand_batches()
            frame["request_ids"], frame["q_lens"], frame["kv_lens"] = ids, qs, kvs
        return frame

    def _expand_batches(self):
        ids, qs, kvs = [], [], []
        for request_ids, q, kv0, num_steps in self.batches:
            id_list = list(request_ids)
            for j in range(num_steps):
                ids.append(id_list)
                qs.append(q)
                kvs.append(kv0 + j if j else kv0)
        return ids, qs, kvs
