"""The fitted regressors a T_step table directory keeps in models/ (written by costmodel.build), loaded
back for the exports that evaluate them at other points than the tables' knots."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.readers import one_line
from stepcal.costmodel.pickled import load_pickled
from stepcal.costmodel.table_meta import TableMeta


@dataclass(frozen=True)
class Target:
    estimator: object


@dataclass(frozen=True)
class Fitted:
    """What composition reads of a FitResult (costmodel.fitting): each target's fitted estimator,
    here loaded back from the table directory's models/."""
    targets: dict


def load_regressor(table_dir: Path, meta: TableMeta, target: str):
    """The fitted regressor of `target`; None where the tables have none (not fitted, or its file is
    gone). A damaged file is an error: falling back would hide it."""
    targets = meta.targets
    entry = targets.get(target) if isinstance(targets, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
        return None
    path = table_dir / entry["model"]
    if not path.is_file():
        return None
    try:
        return load_pickled(path)
    except Exception as exc:   # unpickling a damaged file can raise almost anything; all mean "damaged"
        raise InputError(f"{path}: not a readable regressor of target {target!r} "
                         f"({type(exc).__name__}: {one_line(exc)})") from None


def fitted(targets: dict[str, object]) -> Fitted:
    """Loaded regressors by target, in the shape composition reads."""
    return Fitted({name: Target(model) for name, model in targets.items()})
