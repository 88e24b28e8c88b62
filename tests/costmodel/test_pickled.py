"""costmodel.pickled: regressors pickled under the stages' old top-level names still load."""
import sys
from pathlib import Path

import joblib
import pytest

import stepcal.costmodel as costmodel_package
import stepcal.costmodel.regressors as regressors
from stepcal.costmodel.pickled import load_pickled

ROOT = Path(__file__).resolve().parents[2]


def outside_the_checkout(monkeypatch):
    """sys.path without the repository root, as for an installed user: the tests put the root on it,
    where `costmodel` would import the checkout's folder a second time instead of failing."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != ROOT])


def test_a_regressor_pickled_under_the_old_module_name_loads_as_stepcals(tmp_path, monkeypatch):
    outside_the_checkout(monkeypatch)
    # write the pickle as tables fitted before the rename have it: the class at costmodel.regressors
    with monkeypatch.context() as patch:
        patch.setattr(regressors.TreeRegressor, "__module__", "costmodel.regressors")
        patch.setitem(sys.modules, "costmodel", costmodel_package)
        patch.setitem(sys.modules, "costmodel.regressors", regressors)
        joblib.dump(regressors.TreeRegressor(), tmp_path / "old.joblib")
    assert b"costmodel.regressors" in (tmp_path / "old.joblib").read_bytes()
    assert "costmodel" not in sys.modules

    loaded = load_pickled(tmp_path / "old.joblib")

    assert type(loaded) is regressors.TreeRegressor
    assert "costmodel" not in sys.modules and "costmodel.regressors" not in sys.modules   # aliases undone


def test_a_pickle_naming_an_unknown_module_still_fails(tmp_path, monkeypatch):
    outside_the_checkout(monkeypatch)
    class Orphan:
        pass
    Orphan.__module__, Orphan.__qualname__ = "no_such_module_here", "Orphan"
    monkeypatch.setitem(sys.modules, "no_such_module_here", type(sys)("no_such_module_here"))
    sys.modules["no_such_module_here"].Orphan = Orphan
    joblib.dump(Orphan(), tmp_path / "orphan.joblib")
    monkeypatch.delitem(sys.modules, "no_such_module_here")
    with pytest.raises(ModuleNotFoundError):
        load_pickled(tmp_path / "orphan.joblib")
