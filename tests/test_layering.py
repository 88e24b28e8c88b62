"""DESIGN.md's layering table, enforced: every import in every module of a package, including those
inside functions (the lazy ones), names only what that package may import."""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("simulator", "costmodel", "profiler", "experiments")

# What each package may import besides the standard library and itself (DESIGN.md, "Packages and
# layering"). tqdm draws progress bars; pyarrow and joblib are the file formats of pandas and sklearn,
# threadpoolctl is how sklearn's thread count is pinned.
ALLOWED = {
    "simulator": {"numpy", "pandas", "pyarrow", "tqdm"},
    "costmodel": {"simulator", "numpy", "pandas", "pyarrow", "tqdm", "sklearn", "scipy", "optuna", "mlflow",
                  "joblib", "threadpoolctl", "matplotlib"},
    "profiler": {"simulator", "numpy", "pandas", "pyarrow", "tqdm", "torch"},
    "experiments": None,   # everything
}


def imported_roots(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every absolute import in a file, at any depth of the tree."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def violations(package: str) -> list[str]:
    allowed = ALLOWED[package]
    if allowed is None:
        return []
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, root in imported_roots(path):
            if root == package or root in sys.stdlib_module_names or root == "__future__":
                continue
            if root not in allowed:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {root}")
    return bad


@pytest.mark.parametrize("package", [p for p in FIRST_PARTY if ALLOWED[p] is not None])
def test_package_imports_follow_the_layering(package):
    assert violations(package) == []


def test_the_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import numpy\n\ndef f():\n    from costmodel.tables import x\n    import torch.nn\n")
    assert imported_roots(module) == [(1, "numpy"), (4, "costmodel"), (5, "torch")]


def test_every_package_has_a_rule():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(FIRST_PARTY)
