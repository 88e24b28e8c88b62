"""Reading files back: stepcal's own directories (T_step tables, measured runs, profiles,
validations) and the config files a person hands it (JSON, TOML).

Whatever is wrong with such a file (missing, a directory, unreadable, binary, truncated, not the
format, not an object, a key or a column missing) becomes one InputError naming the file, and the
key or columns, so that the CLI prints one line and exits 2 instead of a traceback from deep in
json, tomllib, pandas or pyarrow. `what` says what the file should have been (e.g. "a measured
run's meta.json"): the person reading the message may not know which file is which.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import tomllib

from stepcal.core.errors import InputError


def read_bytes(path: str | Path, what: str) -> bytes:
    path = _existing_file(path, what)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc} (expected {what})") from None


def read_text(path: str | Path, what: str) -> str:
    """The file as UTF-8 text; a binary file (NUL bytes, or not UTF-8) is refused by name."""
    path = Path(path)
    data = read_bytes(path, what)
    check_text(path, data, what)
    return data.decode("utf-8")


def check_text(path: Path, data: bytes, what: str) -> None:
    """InputError unless `data` (a file's content, or its first bytes) looks like text. NUL never
    occurs in the text formats we read, and catching it here names the problem ("binary") where a
    parser would report a confusing error at some later line."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise InputError(f"{path}: not a text file (a NUL byte at offset {nul}; expected {what})")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data" and exc.end == len(data):
            return     # only the head of a file was given, cut inside a multi-byte character
        raise InputError(f"{path}: not a text file (byte 0x{data[exc.start]:02x} at offset {exc.start} "
                         f"is not UTF-8; expected {what})") from None


def read_json(path: str | Path, what: str, required_keys: Iterable[str] = ()) -> dict:
    """A JSON object; InputError naming the file (and the first missing key) for anything else."""
    path = Path(path)
    data = _parse_json(path, read_text(path, what), what)
    require_object(path, data, what, "JSON")
    require_keys(path, data, required_keys, what)
    return data


def read_document(path: str | Path, what: str):
    """A JSON or TOML file (by suffix) parsed, whatever its top-level type (the caller checks it)."""
    path = Path(path)
    if path.suffix.lower() == ".toml":
        return read_toml(path, what)
    return _parse_json(path, read_text(path, what), what)


def read_toml(path: str | Path, what: str) -> dict:
    path = Path(path)
    try:
        return tomllib.loads(read_text(path, what))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc}; expected {what})") from None


def read_config_file(path: str | Path, what: str) -> dict:
    """A JSON or TOML file (by suffix) that must hold an object (a table of keys)."""
    path = Path(path)
    data = read_document(path, what)
    require_object(path, data, what, "TOML" if path.suffix.lower() == ".toml" else "JSON")
    return data


def read_parquet(path: str | Path, what: str, columns: Iterable[str] = ()):
    """A Parquet file as a DataFrame, with at least `columns`; a missing, truncated, damaged or
    foreign file is an InputError naming it."""
    import pandas as pd  # lazy: loads pandas
    path = _existing_file(path, what)
    try:
        frame = pd.read_parquet(path)
    except MemoryError:
        raise
    except Exception as exc:
        # pd.read_parquet runs none of our code, so whatever it raises is about the file: pyarrow's
        # ArrowInvalid or OSError for a truncated or foreign file, and KeyError or TypeError from pandas
        # for damaged pandas metadata (seen with a few bytes flipped). pyarrow repeats the path
        # ("Could not open Parquet input source '<path>': ..."), which leads the message already.
        detail = re.sub(r"^Could not open Parquet input source '.*?': ", "", one_line(exc))
        if not isinstance(exc, (OSError, ValueError)):     # KeyError: 'name' says nothing without its type
            detail = f"{type(exc).__name__}: {detail}"
        raise InputError(f"{path}: not a readable Parquet file ({detail}; expected {what})") from None
    require_columns(path, frame.columns, columns, what)
    return frame


def require_object(path: Path, data, what: str, fmt: str = "JSON") -> None:
    if not isinstance(data, dict):
        raise InputError(f"{path}: {what} must be a {fmt} object, got {_kind(data)}")


def require_keys(path: Path, data: dict, keys: Iterable[str], what: str) -> None:
    """Every key present; the message names the first one missing (a person fixes one at a time)."""
    missing = [key for key in keys if key not in data]
    if missing:
        raise InputError(f"{path}: missing key {missing[0]!r} ({what})")


def require_columns(path: Path, present, columns: Iterable[str], what: str) -> None:
    present = set(present)
    missing = [c for c in columns if c not in present]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)} ({what})")


def one_line(exc: BaseException) -> str:
    """An exception's text on one line, at most 200 characters (pyarrow's run over several)."""
    return " ".join(str(exc).split())[:200].rstrip(".")   # it goes inside a sentence of ours


def _existing_file(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file (expected {what})")
    if path.is_dir():
        raise InputError(f"{path}: is a directory (expected {what})")
    return path


def _parse_json(path: Path, text: str, what: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno}; "
                         f"expected {what})") from None
    except RecursionError:      # "[[[[...": nested deeper than Python's stack
        raise InputError(f"{path}: not valid JSON (nested too deeply; expected {what})") from None


def _kind(value) -> str:
    names = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
             type(None): "null"}
    return names.get(type(value), type(value).__name__)


__all__ = ["check_text", "one_line", "read_bytes", "read_config_file", "read_document", "read_json",
           "read_parquet", "read_text", "read_toml", "require_columns", "require_keys", "require_object"]
