"""Column checks for imported traces, with errors that name the file, the row and the column.

Rows are located by the 0-based index label of the frame the reader built (blank lines and
skipped records keep their place), and printed the way a person counts them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepcal.core.bounds import MAX_ARRIVAL_S, MAX_TOKENS_PER_REQUEST
from stepcal.core.errors import InputError, shown


@dataclass(frozen=True)
class Where:
    """A trace file being read: its path and kind ("csv", "parquet" or "jsonl")."""
    path: str
    kind: str

    def row(self, label: int) -> str:
        """A 0-based row label as a person finds it in the file."""
        if self.kind == "csv":        # line 1 is the header
            return f"line {label + 2} (data row {label + 1})"
        if self.kind == "jsonl":      # the label is the 0-based line number
            return f"line {label + 1}"
        return f"data row {label + 1} (1-based)"

    def reject(self, series, column: str, bad: np.ndarray, problem: str, *, show_value: bool = True) -> None:
        """Raise for the first row where `bad` holds, naming its value unless it has none to show."""
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise self.error(series.index[i], column, problem, series.iloc[i] if show_value else None)

    def error(self, label: int, column: str, problem: str, value=None) -> InputError:
        got = "" if value is None else f", got {shown(value)}"   # -3, not np.int64(-3); lists whole
        return InputError(f"{self.path}: {self.row(label)}: column {column!r} {problem}{got}")


def require_columns(where: Where, columns, required: tuple[str, ...], fmt: str) -> None:
    missing = [c for c in required if c not in columns]
    if missing:
        raise InputError(f"{where.path}: missing column {missing[0]!r} for the {fmt} trace format "
                         f"(needs {', '.join(required)}; found {', '.join(map(str, columns)) or 'none'})")


def numbers(where: Where, series, column: str, *, allow_missing: bool = False) -> np.ndarray:
    """The column as float64; non-numeric (and, unless allowed, missing) values are errors."""
    import pandas as pd  # lazy: loads pandas
    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    missing = series.isna().to_numpy()
    not_numeric = np.isnan(values) & ~missing
    where.reject(series, column, not_numeric, "is not a number")
    if not allow_missing:
        where.reject(series, column, missing, "is missing (empty or NaN)", show_value=False)
    where.reject(series, column, np.isinf(values), "is not finite")
    return values


def positive_or_missing(where: Where, series, column: str) -> np.ndarray:
    """The column as float64 > 0 where given; empty stays NaN (an SLO a request does not have)."""
    values = numbers(where, series, column, allow_missing=True)
    where.reject(series, column, values <= 0, "must be positive (or empty for none)")
    return values


def positive_ints(where: Where, series, column: str) -> np.ndarray:
    """The column as int64 > 0 (token counts), at most MAX_TOKENS_PER_REQUEST."""
    too_large = numbers(where, series, column) > MAX_TOKENS_PER_REQUEST
    where.reject(series, column, too_large, f"must be at most {MAX_TOKENS_PER_REQUEST:,} tokens (core.bounds)")
    values = ints(where, series, column)
    where.reject(series, column, values <= 0, "must be positive")
    return values


def ints(where: Where, series, column: str) -> np.ndarray:
    """The column as int64 (ids, priorities). An integer column (Parquet, or CSV that pandas read as
    int64) is taken as it is: through float64 an id past 2^53 would lose its last digits."""
    import pandas as pd  # lazy: loads pandas
    if pd.api.types.is_integer_dtype(series.dtype) and not series.isna().any():
        values = series.to_numpy()
        if values.dtype.kind == "u":    # uint64 past 2^63 - 1 would wrap in int64
            where.reject(series, column, values > np.iinfo(np.int64).max, "is too large for a 64-bit id")
        return values.astype(np.int64)
    values = numbers(where, series, column)
    where.reject(series, column, values != np.round(values), "must be a whole number")
    # Past 2^53 a float no longer holds every integer, and past 2^63 int64 wraps around.
    where.reject(series, column, np.abs(values) > 2.0**53, "is too large to be a count or id")
    return values.astype(np.int64)


def non_negative(where: Where, series, column: str) -> np.ndarray:
    """The column as float64 >= 0 (arrival times)."""
    values = numbers(where, series, column)
    where.reject(series, column, values < 0, "must not be negative")
    where.reject(series, column, values > MAX_ARRIVAL_S, f"must be at most {MAX_ARRIVAL_S:g} s (a year; "
                 f"core.bounds): seconds expected, not milliseconds or an epoch")
    return values


def span_s(where: Where, series, column: str, clock: np.ndarray, per_second: float = 1.0) -> np.ndarray:
    """A clock column (`per_second` ticks a second) as seconds since its first row; a row more than
    MAX_ARRIVAL_S after the first is refused (a unit mistake, or a stray epoch)."""
    with np.errstate(over="ignore"):   # a span past float range is refused just below
        shifted = (clock - clock.min()) / per_second
    where.reject(series, column, shifted > MAX_ARRIVAL_S, f"is more than a year ({MAX_ARRIVAL_S:g} s, "
                 f"MAX_ARRIVAL_S, core.bounds) after the trace's first request")
    return shifted


def seconds_since_first(where: Where, series, column: str) -> np.ndarray:
    """Date-time strings (ISO 8601, up to nanoseconds) as float seconds since the earliest one."""
    import pandas as pd  # lazy: loads pandas
    where.reject(series, column, series.isna().to_numpy(), "is empty", show_value=False)
    # As text: pandas is to read bare numbers as epochs one day, which would accept them silently.
    stamps = pd.to_datetime(series.astype(str), format="ISO8601", errors="coerce")
    where.reject(series, column, stamps.isna().to_numpy(), "is not a date-time like 2023-11-16 18:15:46.6805900")
    # Differences in integer nanoseconds first, so the 7th fractional digit survives.
    offsets = stamps - stamps.min()
    return (offsets.to_numpy().astype("timedelta64[ns]").astype(np.int64) / 1e9).astype(np.float64)
