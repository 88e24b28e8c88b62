"""The meta.json of a step-model directory: a T_step table directory's (costmodel.table_meta.TableMeta),
or a built-in model's calibrated by `stepcal calibrate` (BuiltinMeta, kind "builtin")."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stepcal.core.artifact import META_FILE
from stepcal.core.errors import InputError
from stepcal.core.io import atomic_write_json
from stepcal.core.readers import read_json
from stepcal.costmodel.table_meta import TableMeta

BUILTIN_KIND = "builtin"
STEP_MODEL_WHAT = "the meta.json of a step-model directory, written by `stepcal fit` or `stepcal calibrate`"


@dataclass(frozen=True)
class BuiltinMeta:
    """The meta.json of a built-in model calibrated by `stepcal calibrate` (kind "builtin"): the
    model it names (const:MS or linear:A,B,C) and what calibration added; other keys in `extra`,
    written back unchanged."""
    step_model: str = ""
    host_terms: dict | None = None
    calibration: dict | None = None
    scatter: dict | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, meta: dict) -> BuiltinMeta:
        known = ("step_model", "host_terms", "calibration", "scatter")
        return cls(**{key: meta[key] for key in known if key in meta},
                   extra={key: value for key, value in meta.items() if key not in known and key != "kind"})

    def to_dict(self) -> dict:
        """meta.json's content; host_terms, calibration and scatter only where set."""
        body = {"kind": BUILTIN_KIND, "step_model": self.step_model}
        for key in ("host_terms", "calibration", "scatter"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
        return {**body, **self.extra}

    def write(self, directory: str | Path) -> BuiltinMeta:
        """Write DIR/meta.json atomically; returns the meta as written."""
        atomic_write_json(Path(directory) / META_FILE, self.to_dict())
        return self


def read_step_model_meta(path: str | Path) -> TableMeta | BuiltinMeta:
    """The meta.json of a step-model directory: a calibrated built-in model's (kind "builtin"), else a
    T_step table directory's (TableMeta.read checks its kind and schema version)."""
    path = Path(path)
    if not (path / META_FILE).exists():
        raise InputError(f"--step-model {path}: no meta.json (expected a directory written by `stepcal fit` "
                         f"or `stepcal calibrate`)")
    meta = read_json(path / META_FILE, STEP_MODEL_WHAT)
    if meta.get("kind") == BUILTIN_KIND:
        return BuiltinMeta.from_dict(meta)
    return TableMeta.read(path)
