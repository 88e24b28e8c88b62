"""The profile directory: rows appended in small atomic part files, joined into profile.parquet.

    DIR/meta.json          sweep configuration, hardware fingerprint, progress (core.profile_meta.ProfileMeta)
    DIR/parts/part-*.parquet   rows not yet joined (each file written whole, then renamed in)
    DIR/profile.parquet    every point once, in grid order (rewritten at the end of each run)

A run killed at any moment (SIGKILL included) loses at most the rows it had not yet flushed;
rows are keyed by `point_key`, and the last row of a key wins, so joining is idempotent.
"""
from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.io import atomic_write_parquet
from stepcal.core.profile_meta import ProfileMeta
from stepcal.core.readers import read_parquet
from stepcal.core.schemas import PROFILE_COLUMNS

# Columns the profiler adds to the profile table (docs/design.md, data contracts).
EXTRA_COLUMNS = ("inner_repeats",   # calls per timed sample (tiny kernels repeat inside a sample)
                 "rel_precision",   # estimated standard error of the median / median
                 "rounds",          # passes over the grid whose samples are pooled in this row
                 "samples_ms",      # the pooled samples, ms per call (for pooling and re-analysis)
                 "fingerprint_id")  # short hash of the hardware fingerprint in meta.json
COLUMNS = PROFILE_COLUMNS + EXTRA_COLUMNS
INT_COLUMNS = ("m", "n", "k", "num_seqs", "num_tokens", "num_decode", "decode_kv_sum", "decode_kv_max",
               "prefill_tokens", "kv_sum", "num_heads", "num_kv_heads", "head_dim", "width", "expert_ffn_size",
               "num_experts", "experts_per_token", "tp", "ep", "repeats",
               "num_threads", "schema_version", "inner_repeats", "rounds")
FLOAT_COLUMNS = ("prefill_attn_work", "time_ms", "time_ms_p10", "time_ms_p90", "rel_precision")
LIST_COLUMNS = ("q_lens", "kv_lens", "samples_ms")
PROFILE_FILE = "profile.parquet"
META_FILE = "meta.json"
PARTS_DIR = "parts"


def rows_to_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows in the profile table's columns and dtypes (stable across part files)."""
    frame = pd.DataFrame([{c: r.get(c) for c in COLUMNS} for r in rows], columns=list(COLUMNS))
    for col in COLUMNS:
        if col in INT_COLUMNS:
            frame[col] = frame[col].astype("Int64")
        elif col in FLOAT_COLUMNS:
            frame[col] = frame[col].astype("float64")
        elif col in LIST_COLUMNS:
            frame[col] = frame[col].astype(object)
        else:
            frame[col] = frame[col].astype(pd.StringDtype())
    return frame


def normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame read back from Parquet, in the same dtypes as rows_to_frame (lists as lists)."""
    frame = frame.copy()
    for col in COLUMNS:
        if col not in frame:
            frame[col] = None
    for col in LIST_COLUMNS:
        cast = float if col == "samples_ms" else int
        frame[col] = [None if v is None or (not hasattr(v, "__len__") and pd.isna(v))
                      else [cast(x) for x in v] for v in frame[col]]
    return rows_to_frame(frame.to_dict("records"))


@dataclass
class ProfileDir:
    """One sweep's output directory. Use as a context manager: it holds an exclusive lock."""
    path: Path
    _lock_fd: int | None = field(default=None, repr=False)
    _seq: int = 0

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    @property
    def profile_path(self) -> Path:
        return self.path / PROFILE_FILE

    @property
    def meta_path(self) -> Path:
        return self.path / META_FILE

    @property
    def parts_path(self) -> Path:
        return self.path / PARTS_DIR

    def __enter__(self) -> ProfileDir:
        self.parts_path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(f"{self.path}: another `stepcal profile` is writing here") from None
        self._lock_fd = fd
        # Our lock, so any temp file left here is from a killed run: it was never renamed in.
        for tmp in self.parts_path.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def read_meta(self) -> ProfileMeta | None:
        return read_meta(self.path)

    def write_meta(self, meta: ProfileMeta) -> None:
        meta.write(self.path)

    def part_files(self) -> list[Path]:
        return sorted(self.parts_path.glob("part-*.parquet")) if self.parts_path.is_dir() else []

    def append(self, rows: list[dict]) -> Path | None:
        """Write rows as one new part file, atomically."""
        if not rows:
            return None
        self._seq += 1
        name = f"part-{time.time_ns():020d}-{os.getpid()}-{self._seq:06d}.parquet"
        path = self.parts_path / name
        atomic_write_parquet(rows_to_frame(rows), path)
        return path

    def read_rows(self) -> tuple[pd.DataFrame, list[Path]]:
        """Every row so far (last row of a key wins) and the part files it came from."""
        return read_rows(self.path)

    def compact(self, order: list[str]) -> pd.DataFrame:
        """Join profile.parquet and the parts into profile.parquet (in `order`), drop the parts."""
        frame, parts = self.read_rows()
        frame = sort_by_keys(frame, order)
        atomic_write_parquet(frame, self.profile_path)
        for part in parts:
            part.unlink(missing_ok=True)
        return frame


def read_meta(path: Path) -> ProfileMeta | None:
    """DIR/meta.json (kind and schema version checked); None where there is none yet."""
    if not (Path(path) / META_FILE).exists():
        return None
    return ProfileMeta.read(path)


def read_rows(path: Path) -> tuple[pd.DataFrame, list[Path]]:
    path = Path(path)
    frames, parts = [], []
    if (path / PROFILE_FILE).exists():
        frames.append(_read(path / PROFILE_FILE))
    parts_dir = path / PARTS_DIR
    for part in sorted(parts_dir.glob("part-*.parquet")) if parts_dir.is_dir() else []:
        frames.append(_read(part))
        parts.append(part)
    if not frames:
        return rows_to_frame([]), parts
    frame = pd.concat([normalise(f) for f in frames], ignore_index=True)
    return frame.drop_duplicates("point_key", keep="last").reset_index(drop=True), parts


def _read(path: Path) -> pd.DataFrame:
    return read_parquet(path, "profile rows written by `stepcal profile`", ("point_key",))


def sort_by_keys(frame: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Rows in the order of `order`; keys not in it go last, in their current order."""
    rank = {key: i for i, key in enumerate(order)}
    position = frame["point_key"].map(lambda k: rank.get(k, len(rank))).astype("int64")
    return frame.assign(_rank=position).sort_values("_rank", kind="stable").drop(columns="_rank") \
        .reset_index(drop=True)
