"""The filter keys of a Vidur export: the model columns of mlp.csv (n_head, n_kv_head, n_embd,
n_expanded_embd, use_gated_mlp, vocab_size), which Vidur compares with its model config's before it
trains on a row (costmodel.vidur_models).

Where they come from, first found first:
1. the keys of the Vidur mlp.csv the tables were fitted from, stored in meta.json at fit time
   ("vidur_profile_keys", written by costmodel.build from profile_keys_at_fit());
2. for tables fitted before those were stored: the same file read back from the path meta.json's
   provenance names (a relative path resolves only from the directory the fit ran in);
3. the model spec in Vidur's convention: Vidur's config of the same shape, whose vocabulary it pads
   (Llama-2: 32000 -> 32768).
--vidur-model NAME replaces any of them by a named Vidur config's keys, refused on another shape.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError, shown
from stepcal.core.model_spec import ModelSpec
from stepcal.core.readers import one_line
from stepcal.costmodel.importers.vidur import KEY_COLUMNS as VIDUR_PROFILE_KEYS
from stepcal.costmodel.table_meta import TableMeta
from stepcal.costmodel.vidur_models import MODEL_COLUMNS, SHAPE_COLUMNS, like_spec, model_keys, spec_keys, vidur_model

STORED_KEYS = "vidur_profile_keys"      # meta.json's list of {file, num_tensor_parallel_workers, keys}
TP_COLUMN = "num_tensor_parallel_workers"


# ---------------------------------------------------------------------------- at fit time

def profile_keys_at_fit(records: pd.DataFrame) -> list[dict]:
    """meta.json's "vidur_profile_keys": the model keys of every Vidur mlp.csv among the fitted records,
    at the TP degrees fitted, one entry per model and degree. Read while the paths the fit was given
    still resolve: the export may run from another directory."""
    if not {"source", "file", "tp"} <= set(records.columns):
        return []
    vidur = records[records["source"] == "vidur"]
    entries = []
    for name, part in vidur.groupby("file", sort=True):
        path = Path(str(name))
        try:
            rows = _model_rows(path)
        except (ValueError, OSError, pd.errors.ParserError) as exc:
            raise InputError(f"{path}: cannot read its Vidur model keys back ({one_line(exc)})") from None
        fitted_tp = set(pd.to_numeric(part["tp"], errors="coerce").dropna().astype(int))
        entries += [{"file": str(path), TP_COLUMN: tp, "keys": keys} for tp, keys in rows or () if tp in fitted_tp]
    return entries


def _model_rows(path: Path) -> list[tuple[int, dict]] | None:
    """(TP degree, model keys) of every model an mlp.csv holds; None for another of Vidur's files
    (all_reduce.csv has none of the key columns)."""
    if path.suffix != ".csv" or not set(VIDUR_PROFILE_KEYS) <= set(pd.read_csv(path, nrows=0).columns):
        return None
    frame = pd.read_csv(path, usecols=[*MODEL_COLUMNS, TP_COLUMN]).drop_duplicates()
    return [(int(row.pop(TP_COLUMN)), profile_row(row, path)) for row in frame.to_dict("records")]


def profile_row(row: dict, where) -> dict:
    """One model's keys as an mlp.csv holds them, as the types Vidur compares them with."""
    keys = {}
    for column in MODEL_COLUMNS:
        if column not in row:
            raise InputError(f"{where}: Vidur model keys lack {column!r}")
        value = row[column]
        if column == "use_gated_mlp":
            keys[column] = str(value).strip().lower() in ("true", "1", "1.0")
            continue
        number = pd.to_numeric(value, errors="coerce")
        if isinstance(value, bool) or not np.isfinite(number) or number != int(number):
            raise InputError(f"{where}: column {column!r} must hold whole numbers, got {shown(value)}")
        keys[column] = int(number)
    return keys


# ---------------------------------------------------------------------------- at export time

def filter_keys(meta: TableMeta, meta_path: Path, spec: ModelSpec, tp: int,
                model_name: str | None) -> tuple[dict, str]:
    """mlp.csv's model keys (Vidur column -> value) and a note on where they came from."""
    own, note = _profile_keys(meta, meta_path, spec, tp)
    if own is not None:
        keys = own
    else:
        own = spec_keys(spec)
        keys, convention = _convention_keys(spec, own)
        note = convention + (f" ({note})" if note else "")
    if model_name is None:
        return keys, note
    return _named_model_keys(model_name, own, spec)


def _convention_keys(spec: ModelSpec, own: dict) -> tuple[dict, str]:
    """The spec's keys as Vidur's config of the same shape has them (its padded vocabulary)."""
    like = like_spec(spec)
    if like is None:
        return dict(own), f"filter keys from model spec {spec.name!r} (no Vidur model config has its shape)"
    if like.vocab_size == spec.vocab_size:
        return dict(own), f"filter keys from model spec {spec.name!r} (as Vidur's {like.name} config)"
    return {**own, "vocab_size": like.vocab_size}, (
        f"filter keys from model spec {spec.name!r} in Vidur's convention: vocab_size {like.vocab_size} "
        f"as Vidur's {like.name} config has it (the spec: {spec.vocab_size})")


def _named_model_keys(model_name: str, own: dict, spec: ModelSpec) -> tuple[dict, str]:
    """--vidur-model: that config's keys, refused where its shape is not the tables' model's. `own`:
    the tables' keys (the profile's, or the spec's before Vidur's convention pads its vocabulary)."""
    model = vidur_model(model_name)
    theirs = model_keys(model)
    differ = [c for c in SHAPE_COLUMNS if own[c] != theirs[c]]
    ours_said = [f"{c} {own[c]}" for c in differ]
    theirs_said = [f"{c} {theirs[c]}" for c in differ]
    if spec.num_layers != model.num_layers:
        ours_said.append(f"{spec.num_layers} layers")
        theirs_said.append(f"{model.num_layers} layers")
    if ours_said:
        raise InputError(f"--vidur-model {model.name}: the tables' model ({spec.name}) has {', '.join(ours_said)} "
                         f"where Vidur's config has {', '.join(theirs_said)}: fit tables for that model")
    overrode = [f"{c} {own[c]} -> {theirs[c]}" for c in MODEL_COLUMNS if own[c] != theirs[c]]
    return theirs, (f"filter keys of Vidur's {model.name} config"
                    + (f" (overrode {', '.join(overrode)}, which Vidur only filters on)" if overrode else ""))


def _profile_keys(meta: TableMeta, meta_path: Path, spec: ModelSpec, tp: int) -> tuple[dict | None, str]:
    """The model keys of the Vidur mlp.csv the tables were fitted from and a note saying how they were
    found: stored at fit time, else read back from its path. (None, "") when the tables were not
    fitted from one, (None, a note) when its path does not resolve here."""
    stored = _stored_keys(meta, meta_path, tp)
    if stored:
        path, keys = _choose(stored, spec)
        return keys, f"filter keys from the Vidur profile {path} (stored in meta.json at fit time)"
    found, unreadable = _read_back(meta, tp)
    if found:
        path, keys = _choose(found, spec)
        return keys, (f"filter keys from the Vidur profile {path} (read back from the path meta.json names: "
                      f"tables fitted before the keys were stored)")
    if unreadable:
        return None, f"the Vidur profile {unreadable[0]} named in meta.json is not readable here"
    return None, ""


def _stored_keys(meta: TableMeta, meta_path: Path, tp: int) -> list[tuple[str, dict]]:
    entries = meta.vidur_profile_keys
    if entries is None:
        return []
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("keys"), dict)
                                                for e in entries):
        raise InputError(f"{meta_path}: {STORED_KEYS} must be a list of objects with file, {TP_COLUMN} and keys, "
                         f"got {shown(entries)}")
    return [(str(e.get("file")), profile_row(e["keys"], f"{meta_path}: {STORED_KEYS}"))
            for e in entries if e.get(TP_COLUMN) == tp]


def _read_back(meta: TableMeta, tp: int) -> tuple[list[tuple[str, dict]], list[str]]:
    """The model keys at TP `tp` of the Vidur mlp.csv files meta.json's provenance names, and the
    files among them that cannot be read here."""
    provenance = meta.provenance
    provenance = provenance if isinstance(provenance, dict) else {}
    if "vidur" not in (provenance.get("sources") or []):
        return [], []
    found, unreadable = [], []
    for name in provenance.get("files") or []:
        path = Path(str(name))
        try:
            rows = _model_rows(path)
        except (ValueError, OSError, pd.errors.ParserError):
            unreadable.append(str(path))
            continue
        found += [(str(path), keys) for row_tp, keys in rows or () if row_tp == tp]
    return found, unreadable


def _choose(found: list[tuple[str, dict]], spec: ModelSpec) -> tuple[str, dict]:
    """The one profile model of the spec's shape among `found` (a fit may read several models' files)."""
    ours = spec_keys(spec)
    same = [(path, keys) for path, keys in found if all(keys[c] == ours[c] for c in SHAPE_COLUMNS)]
    if not same:
        path, keys = found[0]
        differ = [c for c in SHAPE_COLUMNS if keys[c] != ours[c]]
        raise InputError(f"{path}: the Vidur profile the tables were fitted from has "
                         f"{', '.join(f'{c} {keys[c]}' for c in differ)} where model spec {spec.name!r} has "
                         f"{', '.join(f'{c} {ours[c]}' for c in differ)}: its keys would not describe the times")
    if len({tuple(keys.items()) for _, keys in same}) > 1:
        raise InputError(f"{same[0][0]}: the Vidur profiles the tables were fitted from hold several models of "
                         f"{spec.name!r}'s shape ({[keys for _, keys in same]}); pass --vidur-model to choose")
    return same[0]
