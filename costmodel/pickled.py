"""Reading fitted regressors back from a table directory's models/ (joblib pickles).

A pickle names each class by its module. Tables fitted before the project installed under the one
import name `stepcal` name `costmodel.regressors.TreeRegressor` where the class now lives at
`stepcal.costmodel.regressors`. While a pickle loads, an import hook answers such old names with
stepcal's own modules (the same objects, so isinstance holds), and it is gone afterwards.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

OLD_STAGE_NAMES = ("costmodel", "simulator", "profiler", "experiments")


def load_pickled(path: Path):
    """joblib.load(path), reading pickles written under the stages' old top-level names too."""
    import joblib  # lazy: joblib comes with scikit-learn, which `import stepcal.costmodel` does not load
    hook = _OldStageNames()
    sys.meta_path.insert(0, hook)
    try:
        return joblib.load(path)
    finally:
        sys.meta_path.remove(hook)
        for name in hook.aliased:
            sys.modules.pop(name, None)


class _OldStageNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `costmodel.x` as the module `stepcal.costmodel.x`, and remembers what it aliased."""

    def __init__(self):
        self.aliased: list[str] = []
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in OLD_STAGE_NAMES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(f"stepcal.{spec.name}")
        self._specs[module.__name__] = module.__spec__   # the import system sets __spec__ to the alias's
        self.aliased.append(spec.name)
        return module

    def exec_module(self, module):
        module.__spec__ = self._specs.pop(module.__name__)
