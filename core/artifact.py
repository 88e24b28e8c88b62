"""The meta.json that heads each of stepcal's artifact directories (T_step tables, measured runs,
profiles, validations): what every kind shares, and the one check of its schema version.

Each artifact kind has one data class that owns its meta.json (costmodel.tables.TableMeta,
core.measured_run.RunMeta, core.profile_meta.ProfileMeta, experiments.validation's record): it
reads the file through `read_artifact_meta`, fills defaults for files written by older versions,
and writes through `artifact_header`, so that every file says what it is and which schema it
follows. Keys a class does not know are kept as they were (`extra`) and written back unchanged.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from stepcal import __version__
from stepcal.core.errors import InputError
from stepcal.core.readers import read_json

META_FILE = "meta.json"
# Files written before meta.json carried a version are read as version 1 (the first schema).
FIRST_SCHEMA_VERSION = 1
HEADER_KEYS = ("kind", "schema_version", "tool_version")


@dataclass(frozen=True)
class ArtifactKind:
    """One kind of artifact directory: the `kind` its meta.json names, the newest schema this
    version of stepcal writes and reads, and words for messages."""
    kind: str               # meta.json's "kind"
    schema_version: int     # the newest version this stepcal understands (and writes)
    what: str               # e.g. "a T_step table directory"
    written_by: str         # e.g. "`stepcal fit`"
    file: str = META_FILE   # the file that heads the directory (a validation's is validation.json)
    # `kind` values older versions wrote for the same artifact; None among them: files with no kind
    aliases: tuple[str | None, ...] = ()

    def describe(self) -> str:
        return f"the {self.file} of {self.what}, written by {self.written_by}"


def artifact_header(kind: ArtifactKind) -> dict:
    """The keys that head every meta.json this version writes."""
    return {"kind": kind.kind, "schema_version": kind.schema_version, "tool_version": __version__}


def schema_version_of(path: Path, meta: dict, kind: ArtifactKind) -> int:
    """meta.json's schema version, checked: absent is the first version; a newer one than this
    stepcal knows is refused in one line (reading it as an older layout could silently misread it)."""
    version = meta.get("schema_version", FIRST_SCHEMA_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InputError(f"{path}: schema_version must be a positive integer, got {version!r} "
                         f"(expected {kind.describe()})")
    if version > kind.schema_version:
        raise InputError(f"{path}: schema_version {version} is newer than this stepcal ({__version__}) reads "
                         f"for {kind.what} (up to {kind.schema_version}); upgrade stepcal to read it")
    return version


def read_artifact_meta(directory: str | Path, kind: ArtifactKind, required_keys: tuple[str, ...] = ()) -> dict:
    """DIR/meta.json (or the kind's file) as a dict whose kind and schema version were checked;
    InputError naming the file otherwise. The data class of the kind turns the dict into fields;
    no other module should read the file."""
    directory = Path(directory)
    path = directory / kind.file
    if not path.exists():
        raise InputError(f"{directory}: not {kind.what} (no {kind.file}; expected the output of {kind.written_by})")
    meta = read_json(path, kind.describe())
    found = meta.get("kind")
    if found != kind.kind and found not in kind.aliases:
        raise InputError(f"{path}: kind is {found!r}, expected {kind.kind!r} ({kind.describe()})")
    schema_version_of(path, meta, kind)
    missing = [key for key in required_keys if key not in meta]
    if missing:
        raise InputError(f"{path}: missing key {missing[0]!r} ({kind.describe()})")
    return meta


def names_kind(directory: str | Path, kind: ArtifactKind) -> bool:
    """Whether DIR's file names itself this kind (or an alias): a probe for a search through
    directories, which passes over anything else, unreadable files included. Reading the artifact
    (read_artifact_meta) is what checks its schema version."""
    try:
        found = json.loads((Path(directory) / kind.file).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and (found.get("kind") == kind.kind or found.get("kind") in kind.aliases)


def split_known(meta: dict, known: tuple[str, ...]) -> tuple[dict, dict]:
    """meta's keys that a data class has fields for, and the rest (kept unchanged as `extra`)."""
    fields = {key: meta[key] for key in known if key in meta}
    extra = {key: value for key, value in meta.items() if key not in known and key not in HEADER_KEYS}
    return fields, extra


__all__ = ["FIRST_SCHEMA_VERSION", "HEADER_KEYS", "META_FILE", "ArtifactKind", "artifact_header",
           "names_kind", "read_artifact_meta", "schema_version_of", "split_known"]
