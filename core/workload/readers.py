"""Read a trace file (ours, Azure LLM 2023, Mooncake, Vidur) into a `Trace`.

Every reader is vectorised over rows (pandas), except Mooncake's JSONL, which is parsed
line by line so that a broken line can be named. Imported traces (all but ours) are shifted
so that the first request arrives at 0 s; their clocks start at arbitrary epochs.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from stepcal.core.errors import InputError, shown
from stepcal.core.readers import check_text, one_line, read_parquet
from stepcal.core.trace import PREFIX_BLOCK_TOKENS, REQUIRED_COLUMNS, Trace
from stepcal.core.workload import session_checks, validate
from stepcal.core.workload.validate import Where

TRACE_FORMATS = ("stepcal", "azure", "mooncake", "vidur")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_COLUMNS = ("timestamp", "input_length", "output_length")
VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
MOONCAKE_BLOCK_TOKENS = 512   # Mooncake's hash_ids are 512-token blocks (FAST'25 trace README)
MAX_HASH_ID = 2**63 - 1       # ids are int64 in Parquet and in the simulator


def read_trace(path: str | Path, fmt: str | None = None, prefix_block_tokens: int | None = None) -> Trace:
    """Read a trace; `fmt` (one of TRACE_FORMATS) forces the format, else it is detected.

    `prefix_block_tokens` is the block size of the file's prefix hash ids (None: the format's
    own, 512 for Mooncake, else PREFIX_BLOCK_TOKENS).
    """
    if fmt is not None and fmt not in TRACE_FORMATS:
        raise InputError(f"unknown trace format {fmt!r}; choose from {', '.join(TRACE_FORMATS)}")
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a trace file")
    kind = _file_kind(path, fmt)
    if kind != "parquet":
        _check_text_head(path)
    table = {"csv": _read_csv, "parquet": _read_parquet, "jsonl": _read_jsonl}[kind](path)
    where = Where(str(path), kind)
    fmt = fmt or _detect_format(where, table.columns)
    if table.empty:     # a header alone: the readers shift arrivals by their minimum, which has none
        raise InputError(f"{path}: the trace has no requests")
    if prefix_block_tokens is not None and (isinstance(prefix_block_tokens, bool) or
                                            not isinstance(prefix_block_tokens, int) or prefix_block_tokens < 1):
        raise InputError(f"--prefix-block-tokens must be a positive integer, got {prefix_block_tokens!r}")
    if fmt == "stepcal" and "prefix_block_tokens" in table.columns:
        prefix_block_tokens = _file_block_tokens(where, table["prefix_block_tokens"], prefix_block_tokens)
    if prefix_block_tokens is None:
        prefix_block_tokens = MOONCAKE_BLOCK_TOKENS if fmt == "mooncake" else PREFIX_BLOCK_TOKENS
    return _READERS[fmt](where, table, prefix_block_tokens)


def _file_block_tokens(where: Where, column, flag_value: int | None) -> int:
    """The block size a stepcal trace states in its prefix_block_tokens column (one value on every
    row); a different --prefix-block-tokens is refused rather than silently mis-sizing the ids."""
    values = validate.positive_ints(where, column, "prefix_block_tokens")
    if (values != values[0]).any():
        row = int(np.flatnonzero(values != values[0])[0])
        raise where.error(column.index[row], "prefix_block_tokens",
                          f"differs from the first row's {int(values[0])}: one block size per trace", values[row])
    stated = int(values[0])
    if flag_value is not None and flag_value != stated:
        raise InputError(f"{where.path}: --prefix-block-tokens {flag_value} contradicts the trace's own "
                         f"prefix_block_tokens {stated}")
    return stated


def _file_kind(path: Path, fmt: str | None) -> str:
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if fmt == "mooncake" or suffix in JSONL_SUFFIXES:
        return "jsonl"
    with path.open("rb") as f:
        head = f.read(64).lstrip()
    return "jsonl" if head.startswith(b"{") else "csv"


def _detect_format(where: Where, columns) -> str:
    # One telling column per format; the format's reader then checks the rest by name.
    for fmt, column in (("stepcal", "arrival_s"), ("azure", "TIMESTAMP"),
                        ("mooncake", "timestamp"), ("vidur", "arrived_at")):
        if column in columns:
            return fmt
    raise InputError(f"{where.path}: cannot tell the trace format from its columns "
                     f"({', '.join(map(str, columns)) or 'none'}); force one with --trace-format "
                     f"({', '.join(TRACE_FORMATS)})")


def _check_text_head(path: Path) -> None:
    """A binary file given as a CSV or JSONL trace is refused as such: pandas would report it as a
    tokenising error at some line, JSONL as a broken line. The head is enough: traces are large."""
    with path.open("rb") as f:
        check_text(path, f.read(1 << 16), "a trace: CSV, JSONL or Parquet")


# ---- file kinds -> a DataFrame whose index is the 0-based row (or line) label ----

def _read_csv(path: Path):
    import pandas as pd  # lazy: loads pandas
    try:
        # Blank lines are kept (then dropped) so that index labels stay line numbers - 2.
        frame = pd.read_csv(path, skip_blank_lines=False)
    except pd.errors.EmptyDataError:
        raise InputError(f"{path}: the file is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: not a readable CSV file ({one_line(exc)})") from None
    _check_header(path)
    return frame.dropna(how="all")


def _check_header(path: Path) -> None:
    """pandas renames a repeated column to `name.1`: which of the two holds the data is a guess."""
    with open(path, newline="", encoding="utf-8") as f:
        header = [c.strip() for c in next(csv.reader(f), [])]
    repeated = [c for c in dict.fromkeys(header) if header.count(c) > 1]
    if repeated:
        raise InputError(f"{path}: column {repeated[0]!r} appears {header.count(repeated[0])} times in the header")


def _read_parquet(path: Path):
    return read_parquet(path, "a trace")


def _read_jsonl(path: Path):
    import pandas as pd  # lazy: loads pandas
    records, labels = [], []
    with path.open("r", encoding="utf-8", errors="replace") as f:
        for label, line in enumerate(f):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}: line {label + 1}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise InputError(f"{path}: line {label + 1}: expected a JSON object, "
                                 f"got {type(record).__name__}")
            records.append(record)
            labels.append(label)
    if not records:
        raise InputError(f"{path}: the file has no records")
    return pd.DataFrame.from_records(records, index=labels)


# ---- formats -> Trace ----

def _read_stepcal(where: Where, table, block_tokens: int) -> Trace:
    validate.require_columns(where, table.columns, REQUIRED_COLUMNS, "stepcal")
    arrival = validate.non_negative(where, table["arrival_s"], "arrival_s")
    prompt = validate.positive_ints(where, table["num_prompt_tokens"], "num_prompt_tokens")
    output = validate.positive_ints(where, table["num_output_tokens"], "num_output_tokens")
    optional = {}
    request_id = None
    if "request_id" in table.columns:
        request_id = validate.ints(where, table["request_id"], "request_id")
        _check_unique(where, table["request_id"], request_id)
    if "priority" in table.columns:
        optional["priority"] = validate.ints(where, table["priority"], "priority")
    for name in ("slo_ttft_ms", "slo_tpot_ms", "timeout_s"):
        if name in table.columns:   # empty means "none for this request": NaN
            optional[name] = validate.positive_or_missing(where, table[name], name)
    for name in ("session_id", "turn"):
        if name in table.columns:
            optional[name] = validate.ints(where, table[name], name)
    if "think_time_s" in table.columns:   # empty: an open-loop request, sent at its arrival_s
        think = validate.numbers(where, table["think_time_s"], "think_time_s", allow_missing=True)
        optional["think_time_s"] = session_checks.think_times(where, table["think_time_s"], think)
    session_checks.check_sessions(where, table.index, arrival, optional.get("session_id"), optional.get("turn"),
                                  optional.get("think_time_s"))
    hashes = None
    if "prefix_hash_ids" in table.columns:
        hashes = _hash_lists(where, table["prefix_hash_ids"], "prefix_hash_ids", prompt, block_tokens)
    return _build(where, arrival, prompt, output, request_id=request_id, hashes=hashes,
                  block_tokens=block_tokens, **optional)


def _read_azure(where: Where, table, block_tokens: int) -> Trace:
    validate.require_columns(where, table.columns, AZURE_COLUMNS, "azure")
    arrival = validate.seconds_since_first(where, table["TIMESTAMP"], "TIMESTAMP")
    arrival = validate.span_s(where, table["TIMESTAMP"], "TIMESTAMP", arrival)
    prompt = validate.positive_ints(where, table["ContextTokens"], "ContextTokens")
    output = validate.positive_ints(where, table["GeneratedTokens"], "GeneratedTokens")
    return _build(where, arrival, prompt, output, block_tokens=block_tokens)


def _read_mooncake(where: Where, table, block_tokens: int) -> Trace:
    validate.require_columns(where, table.columns, MOONCAKE_COLUMNS, "mooncake")
    timestamp_ms = validate.numbers(where, table["timestamp"], "timestamp")
    prompt = validate.positive_ints(where, table["input_length"], "input_length")
    output = validate.positive_ints(where, table["output_length"], "output_length")
    hashes = None
    if "hash_ids" in table.columns:
        hashes = _hash_lists(where, table["hash_ids"], "hash_ids", prompt, block_tokens)
    arrival = validate.span_s(where, table["timestamp"], "timestamp", timestamp_ms, per_second=1000.0)
    return _build(where, arrival, prompt, output, hashes=hashes, block_tokens=block_tokens)


def _read_vidur(where: Where, table, block_tokens: int) -> Trace:
    validate.require_columns(where, table.columns, VIDUR_COLUMNS, "vidur")
    arrived = validate.numbers(where, table["arrived_at"], "arrived_at")
    prompt = validate.positive_ints(where, table["num_prefill_tokens"], "num_prefill_tokens")
    output = validate.positive_ints(where, table["num_decode_tokens"], "num_decode_tokens")
    arrival = validate.span_s(where, table["arrived_at"], "arrived_at", arrived)
    return _build(where, arrival, prompt, output, block_tokens=block_tokens)


_READERS = {"stepcal": _read_stepcal, "azure": _read_azure, "mooncake": _read_mooncake,
            "vidur": _read_vidur}


def _check_unique(where: Where, series, ids: np.ndarray) -> None:
    import pandas as pd  # lazy: loads pandas
    duplicated = pd.Series(ids).duplicated().to_numpy()
    if duplicated.any():
        i = int(np.flatnonzero(duplicated)[0])
        raise where.error(series.index[i], "request_id", "repeats an earlier request_id", ids[i])


def _hash_lists(where: Where, series, column: str, prompt: np.ndarray, block_tokens: int) -> list[list[int]]:
    """Per-row prefix block ids: a list (JSON, Parquet), text "1 2 3" / "[1, 2, 3]" or one number (CSV).

    A missing value is an empty list: that request shares no prefix blocks. Ids are integers in
    [0, 2^63); a row has at most ceil(prompt / block_tokens) of them, one per block of its prompt.
    """
    import pandas as pd  # lazy: loads pandas
    lists = []
    for (label, cell), num_prompt_tokens in zip(series.items(), prompt.tolist()):
        value = cell
        if isinstance(value, str):
            value = value.strip().strip("[]").replace(",", " ").split()
        elif np.ndim(value) == 0 and pd.isna(value):    # None, NaN, pd.NA
            value = []
        elif np.ndim(value) == 0 and isinstance(value, (int, float, np.number)):
            value = [value]     # a CSV column whose cells each hold one id is read as numbers
        try:
            ids = [_whole(v) for v in value]
        except (TypeError, ValueError, OverflowError):
            raise where.error(label, column, f"must be a list of integers, got {_short(cell)}") from None
        if any(i < 0 or i > MAX_HASH_ID for i in ids):
            raise where.error(label, column, f"must hold ids in [0, 2^63), got {_short(cell)}")
        if len(set(ids)) != len(ids):
            # An id stands for a block and every block before it, so one chain cannot hold an id twice
            # (Mooncake's hash_ids are chained the same way; its conversation trace repeats none).
            repeated = next(i for i in ids if ids.count(i) > 1)
            raise where.error(label, column, f"repeats id {repeated}: an id stands for its block and all "
                              f"before it, so a prompt's chain holds each id once; got {_short(cell)}")
        num_blocks = -(-num_prompt_tokens // block_tokens)
        if len(ids) > num_blocks:
            raise where.error(label, column, f"has {len(ids)} ids, more than the {num_blocks} blocks of "
                              f"{block_tokens} tokens (--prefix-block-tokens) in its "
                              f"{num_prompt_tokens}-token prompt")
        lists.append(ids)
    return lists


def _whole(value) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("bool")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)           # exact, however many digits
        except ValueError:
            pass
    number = float(value)
    if number != int(number) or abs(number) > 2.0**53:   # past 2^53 a float no longer holds every integer
        raise ValueError("fractional or imprecise")
    return int(number)


def _short(cell) -> str:
    """A cell as the file has it ('3 -4' in CSV, [3, -4] in Parquet or JSON), cut at 80 characters."""
    text = shown(cell)
    return text if len(text) <= 80 else text[:77] + "..."


def _build(where: Where, arrival, prompt, output, *, request_id=None, hashes=None,
           block_tokens: int = PREFIX_BLOCK_TOKENS, **optional) -> Trace:
    trace = Trace.from_arrays(arrival, prompt, output, request_id=request_id, source=where.path,
                              prefix_block_tokens=block_tokens, **optional)
    if hashes is not None:
        # from_arrays may reorder rows by arrival; attach the hash lists by request id.
        ids = np.arange(len(arrival)) if request_id is None else request_id
        by_id = dict(zip(ids.tolist(), hashes))
        trace.prefix_hash_ids = [by_id[i] for i in trace.request_id.tolist()]
    return trace
