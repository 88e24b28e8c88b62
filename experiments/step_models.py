"""Resolve a --step-model argument: a built-in what-if model or a T_step table directory."""
from __future__ import annotations

from pathlib import Path

from simulator.errors import InputError
from simulator.step_model import parse_builtin_step_model


def resolve_step_model(spec: str):
    model = parse_builtin_step_model(spec)
    if model is not None:
        return model
    path = Path(spec)
    if path.is_dir():
        from costmodel.tables import load_step_model  # sklearn-free, but only needed here
        return load_step_model(path)
    raise InputError(f"--step-model {spec!r}: expected const:MS, linear:A,B,C or a T_step table directory")


def describe_step_model(spec: str, model) -> str:
    describe = getattr(model, "describe", None)
    return describe() if callable(describe) else str(spec)
