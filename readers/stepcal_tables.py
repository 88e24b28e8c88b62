"""Read a stepcal T_step table directory without stepcal: pyarrow and the standard library only.

    import stepcal_tables
    tables = stepcal_tables.load("path/to/tables")
    tables.step_ms(q_lens=[512, 1, 1], kv_lens=[0, 900, 40])    # one engine iteration, in ms

Request i of a batch brings q_lens[i] new tokens over kv_lens[i] tokens already in its KV cache.
The format is described in docs/tables.md of the stepcal repository; this file implements its
lookup rules step by step, with the same float operations in the same order as stepcal, so the
answers are the same numbers. Directories of mode "operators" (per-operator regressors, no T_step
grids) are refused: their regressors are pickles only stepcal can read.
"""
from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import pyarrow.parquet as pq

KIND = "stepcal.t_step_tables"
SUPPORTED_SCHEMA_VERSIONS = (1,)
SUPPORTED_MODES = ("composed", "step")
FEATURE_NAMES = ("num_seqs", "num_tokens", "num_decode", "decode_kv_sum", "decode_kv_max",
                 "prefill_tokens", "prefill_attn_work", "kv_sum")
# The terms looked up on one batch feature (a 1-D curve), by term name.
CURVE_TERMS = ("linear", "elementwise", "sampling", "kv_store", "lm_head", "all_reduce", "moe",
               "all_to_all", "overhead")
# The 2-D terms: (count feature, total feature) of the batch, and the grid's two axis columns.
MEAN_GRID_TERMS = {"decode_attn": (("num_decode", "decode_kv_sum"), ("num_decode", "kv_mean")),
                   "mixed_decode_attn": (("num_decode", "decode_kv_sum"), ("num_decode", "kv_mean")),
                   "decode_attn_skew": (("num_decode", "decode_kv_sum"), ("num_decode", "kv_mean")),
                   "prefill_attn": (("prefill_tokens", "prefill_attn_work"), ("prefill_tokens", "prefill_ctx"))}
# The 2-D terms that count only in a batch where this feature is above zero.
GATED_TERMS = {"mixed_decode_attn": "prefill_tokens"}
ADDITIVE_TERMS = ("step", "host")
HOST_TERM_KEYS = ("per_step_ms", "per_seq_ms", "per_token_ms", "per_request_ms", "per_request_sigma",
                  "per_prompt_token_ms", "per_stream_ms", "base_scale")


class TableFormatError(ValueError):
    """The directory is not a T_step table directory this reader can read; the message names the file."""


def features(q_lens, kv_lens) -> dict:
    """The batch features (FEATURE_NAMES) of one batch: a decode is q == 1 over a non-empty cache."""
    num_decode = decode_kv_sum = decode_kv_max = prefill_tokens = pair_sum = tri_sum = 0
    q_list, s_list = [int(q) for q in q_lens], [int(s) for s in kv_lens]
    if len(q_list) != len(s_list):
        raise ValueError(f"q_lens and kv_lens differ in length ({len(q_list)} and {len(s_list)})")
    for q, s in zip(q_list, s_list):
        if q == 1 and s > 0:
            num_decode += 1
            decode_kv_sum += s
            decode_kv_max = max(decode_kv_max, s)
        else:
            prefill_tokens += q
            pair_sum += q * s
            tri_sum += q * (q + 1)
    values = (len(q_list), sum(q_list), num_decode, decode_kv_sum, decode_kv_max, prefill_tokens,
              pair_sum + tri_sum / 2.0, sum(s_list))
    return dict(zip(FEATURE_NAMES, values))


def _segment(x: float, knots: list) -> tuple[int, float]:
    """The segment i (knots[i]..knots[i+1]) that holds x, the end segment beyond either end, and
    the fraction t of x along it (below 0 or above 1 outside the knots)."""
    if len(knots) == 1:
        return 0, 0.0
    i = min(max(bisect_right(knots, x) - 1, 0), len(knots) - 2)
    return i, (x - knots[i]) / (knots[i + 1] - knots[i])


def interp1(x: float, knots: list, values: list) -> float:
    """Linear between knots, extended along the end segments beyond them (no clamping)."""
    if len(knots) == 1:
        return values[0]
    i, t = _segment(x, knots)
    return values[i] + t * (values[i + 1] - values[i])


def interp2(x: float, y: float, xknots: list, yknots: list, values: list) -> float:
    """Bilinear on values[i][j] at (xknots[i], yknots[j]), extended linearly beyond both axes."""
    i, u = _segment(x, xknots)
    j, v = _segment(y, yknots)
    i1, j1 = min(i + 1, len(xknots) - 1), min(j + 1, len(yknots) - 1)
    low = values[i][j] + v * (values[i][j1] - values[i][j])
    high = values[i1][j] + v * (values[i1][j1] - values[i1][j])
    return low + u * (high - low)


@dataclass
class Curve:
    """A term on one batch feature."""
    name: str
    feature: str
    knots: list
    values: list

    def ms(self, f: dict) -> float:
        return interp1(float(f[self.feature]), self.knots, self.values)


@dataclass
class MeanGrid:
    """A term on a count of items and their mean size (total / count); zero without any item."""
    name: str
    count: str
    total: str
    knots: tuple
    values: list
    gate: str | None = None   # a batch feature that must be above zero for the term to count

    def ms(self, f: dict) -> float:
        count = float(f[self.count])
        if not count > 0 or (self.gate is not None and not float(f[self.gate]) > 0):
            return 0.0
        mean = float(f[self.total]) / max(count, 1.0)
        return interp2(count, mean, *self.knots, self.values)


@dataclass
class SkewGrid(MeanGrid):
    """decode_attn_skew: its grid at the batch's longest KV less at its mean KV, past one decode."""

    def ms(self, f: dict) -> float:
        count = float(f[self.count])
        if not count > 1:
            return 0.0
        longest, mean = float(f["decode_kv_max"]), float(f[self.total]) / count
        return interp2(count, longest, *self.knots, self.values) - interp2(count, mean, *self.knots, self.values)


@dataclass
class Additive:
    """An intercept plus one curve per batch feature."""
    name: str
    intercept_ms: float
    parts: list = field(default_factory=list)   # (feature, knots, values)

    def ms(self, f: dict) -> float:
        total = self.intercept_ms
        for feature, knots, values in self.parts:
            total = total + interp1(float(f[feature]), knots, values)
        return total


@dataclass
class Tables:
    """A loaded table directory: its terms, in meta.json's t_step_terms order, and its host terms."""
    directory: Path
    schema_version: int
    mode: str
    terms: list
    host_terms: dict
    meta: dict

    def terms_ms(self, q_lens, kv_lens) -> dict:
        """Each term's time for one batch, in ms, before it is floored at zero."""
        f = features(q_lens, kv_lens)
        return {term.name: term.ms(f) for term in self.terms}

    def step_ms(self, q_lens, kv_lens) -> float:
        """T_step of one batch in ms: the terms floored at zero each and summed, times base_scale,
        plus per_step_ms + per_seq_ms x num_seqs + per_token_ms x num_tokens."""
        f = features(q_lens, kv_lens)
        total = 0.0
        for term in self.terms:
            total = total + max(term.ms(f), 0.0)
        if not self.host_terms:
            return total
        h = dict.fromkeys(HOST_TERM_KEYS, 0.0) | {"base_scale": 1.0} | self.host_terms
        extra = h["per_step_ms"] + h["per_seq_ms"] * float(f["num_seqs"]) + h["per_token_ms"] * float(f["num_tokens"])
        return total * h["base_scale"] + extra


def load(directory) -> Tables:
    """The T_step table directory DIR (its meta.json and the grids of its t_step_terms)."""
    directory = Path(directory)
    path = directory / "meta.json"
    if not path.is_file():
        raise TableFormatError(f"{directory}: no meta.json: not a stepcal T_step table directory")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TableFormatError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("kind") != KIND:
        found = meta.get("kind") if isinstance(meta, dict) else None
        raise TableFormatError(f"{path}: kind is {found!r}, expected {KIND!r}")
    version = meta.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TableFormatError(f"{path}: schema_version must be a positive integer, got {version!r}")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise TableFormatError(f"{path}: schema_version {version} is newer than this reader supports "
                               f"({', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}); use a newer stepcal_tables.py")
    mode = meta.get("mode")
    if mode not in SUPPORTED_MODES:
        raise TableFormatError(f"{path}: mode {mode!r} holds no T_step grids; this reader supports modes "
                               f"{', '.join(SUPPORTED_MODES)} (fit again with --model-spec)")
    names, entries = meta.get("t_step_terms"), meta.get("terms")
    if not isinstance(names, list) or not names or not isinstance(entries, dict):
        raise TableFormatError(f"{path}: t_step_terms must be a non-empty list and terms an object")
    terms = [_term(directory, name, entries.get(name)) for name in names]
    return Tables(directory, version, mode, terms, _host_terms(path, meta.get("host_terms")), meta)


def _host_terms(path: Path, terms) -> dict:
    if terms is None:
        return {}
    if not isinstance(terms, dict) or set(terms) - set(HOST_TERM_KEYS) or not all(
            _number(v) and v >= 0 for v in terms.values()):
        raise TableFormatError(f"{path}: host_terms must be an object of finite numbers >= 0 "
                               f"with keys among {', '.join(HOST_TERM_KEYS)}, got {terms!r}")
    return {key: float(value) for key, value in terms.items()}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _term(directory: Path, name, entry):
    """One term from its meta.json entry and its Parquet grid."""
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not isinstance(entry.get("axes"), list):
        raise TableFormatError(f"{directory / 'meta.json'}: term {name!r} needs an entry under 'terms' "
                               f"with file and axes")
    axes, file = entry["axes"], directory / entry["file"]
    if name in CURVE_TERMS:
        if len(axes) != 1 or axes[0] not in FEATURE_NAMES:
            raise TableFormatError(f"{file}: term {name!r} takes one batch feature as its axis, got {axes}")
        rows = _ascending(file, axes[0], sorted(zip(*_columns(file, (axes[0], "time_ms")).values())))
        return Curve(name, axes[0], [x for x, _ in rows], [v for _, v in rows])
    if name in MEAN_GRID_TERMS:
        (count, total), labels = MEAN_GRID_TERMS[name]
        if tuple(axes) != labels:
            raise TableFormatError(f"{file}: term {name!r} has axes {list(labels)}, meta.json lists {axes}")
        columns = _columns(file, (*labels, "time_ms"))
        cells = {(x, y): v for x, y, v in zip(*columns.values())}
        xs, ys = sorted(set(columns[labels[0]])), sorted(set(columns[labels[1]]))
        if len(cells) != len(columns["time_ms"]) or len(cells) != len(xs) * len(ys):
            raise TableFormatError(f"{file}: grid is not complete ({len(columns['time_ms'])} rows for "
                                   f"{len(xs)} x {len(ys)} axis values)")
        kind = SkewGrid if name == "decode_attn_skew" else MeanGrid
        return kind(name, count, total, (xs, ys), [[cells[(x, y)] for y in ys] for x in xs], GATED_TERMS.get(name))
    if name in ADDITIVE_TERMS:
        return _additive(directory, name, entry, file)
    raise TableFormatError(f"{file}: unknown term {name!r}")


def _additive(directory: Path, name: str, entry: dict, file: Path) -> Additive:
    intercept = entry.get("intercept_ms", 0.0)
    if not _number(intercept) or not all(axis in FEATURE_NAMES for axis in entry["axes"]):
        raise TableFormatError(f"{directory / 'meta.json'}: term {name!r}: intercept_ms must be a number "
                               f"and axes batch features")
    columns = _columns(file, ("feature", "x", "time_ms"), labels=("feature",))
    term = Additive(name, float(intercept))
    for feature in entry["axes"]:
        rows = _ascending(file, feature, sorted(
            (x, v) for f, x, v in zip(columns["feature"], columns["x"], columns["time_ms"]) if f == feature))
        term.parts.append((feature, [x for x, _ in rows], [v for _, v in rows]))
    return term


def _ascending(file: Path, axis: str, rows: list) -> list:
    """(knot, value) rows sorted by knot, checked: at least one, no knot twice."""
    if not rows:
        raise TableFormatError(f"{file}: no grid points for {axis!r}")
    if any(a[0] == b[0] for a, b in pairwise(rows)):
        raise TableFormatError(f"{file}: {axis!r} lists a knot twice")
    return rows


def _columns(file: Path, names: tuple, labels: tuple = ()) -> dict:
    """The named columns of a Parquet file as lists; numbers as finite floats."""
    try:
        table = pq.read_table(file)
    except (OSError, ValueError) as exc:
        raise TableFormatError(f"{file}: not a readable Parquet file ({exc})") from None
    missing = [n for n in names if n not in table.column_names]
    if missing:
        raise TableFormatError(f"{file}: missing column(s) {', '.join(missing)}")
    out = {}
    for name in names:
        values = table.column(name).to_pylist()
        if name not in labels:
            if not all(_number(v) for v in values):
                raise TableFormatError(f"{file}: column {name!r} must hold finite numbers")
            values = [float(v) for v in values]
        out[name] = values
    return out
