"""Where a model spec comes from: a preset name, a JSON or TOML file of ModelSpec fields, or a
Hugging Face config.json (or the model directory that holds one)."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.hf_config import is_hf_config, spec_from_hf_config
from stepcal.core.model_spec import PRESETS, REQUIRED_FIELDS, ModelSpec
from stepcal.core.readers import read_document


def load_model_spec(name_or_path: str) -> ModelSpec:
    """A preset name; a JSON / TOML file with the ModelSpec fields; or a Hugging Face
    `config.json` (or a directory holding one)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError(f"--model-spec: {name_or_path!r} is neither a preset "
                         f"({', '.join(PRESETS)}) nor an existing file or model directory")
    data = read_document(path, "a model spec")
    if not isinstance(data, dict):
        raise InputError(f"{path}: a model spec is a JSON object of ModelSpec fields or a "
                         f"Hugging Face config.json, got a {type(data).__name__}")
    if is_hf_config(data):
        return spec_from_hf_config(data, path)
    known = {f.name for f in fields(ModelSpec)}
    unknown = set(data) - known
    missing = set(REQUIRED_FIELDS) - set(data)
    if unknown or missing:
        problems = ([f"unknown keys {sorted(unknown)}"] if unknown else []) + \
                   ([f"missing keys {sorted(missing)}"] if missing else [])
        raise InputError(f"{path}: model spec has {' and '.join(problems)}")
    data.setdefault("name", path.stem)
    try:
        return ModelSpec(**data)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
