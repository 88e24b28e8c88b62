"""What importing each of stepcal's modules costs, read from the source: the costly third-party
packages it loads at import time, directly or through our modules it imports at module level.

Used by tests/test_lazy_imports.py to hold every import inside a function to a reason: a lazy
import of something cheap is an import that should be at the top of the module.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("core", "simulator", "costmodel", "profiler", "experiments")   # installed as stepcal.<stage>

# Costly wherever they are imported (each takes from a few hundred ms to seconds to load).
COSTLY = frozenset({"torch", "pandas", "pyarrow", "sklearn", "scipy", "mlflow", "optuna", "ray", "matplotlib",
                    "joblib", "threadpoolctl"})
# Costly only in the modules `stepcal --help` loads: help must not wait for them.
COSTLY_AT_START = COSTLY | {"numpy", "tqdm", "multiprocessing", "concurrent"}
CLI = "stepcal.experiments.cli"


@dataclass(frozen=True)
class LazyImport:
    path: Path
    line: int
    end_line: int
    module: str             # the importing module
    targets: tuple[str, ...]   # modules the statement loads (ours: full names; others: the top-level name)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts[0] == "stepcal" else ".".join(["stepcal", *parts])


@cache
def modules() -> dict[str, Path]:
    found = {}
    for folder in ("stepcal", *STAGES):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def targets_of(node: ast.Import | ast.ImportFrom) -> tuple[str, ...]:
    """The modules a statement loads: ours by full name with their parent packages (importing a
    module runs its packages' __init__), anything else by its top-level name."""
    names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stepcal"):
        names += [f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in modules()]
    found = []
    for name in names:
        if not name.startswith("stepcal"):
            found.append(name.split(".")[0])
            continue
        parts = name.split(".")
        found += [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules()]
    return tuple(dict.fromkeys(found))


def _walk(body: list, in_function: bool, out: list) -> None:
    """(statement, inside a function) for every import statement, skipping TYPE_CHECKING blocks."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "level", 0) == 0:
            out.append((node, in_function))
        elif isinstance(node, ast.If) and _is_type_checking(node):
            _walk(node.orelse, in_function, out)
        else:
            inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for field in ("body", "orelse", "finalbody", "handlers"):
                _walk(getattr(node, field, []) or [], inner, out)


@cache
def imports_of(module: str) -> tuple[tuple[ast.AST, bool], ...]:
    out: list = []
    _walk(ast.parse(modules()[module].read_text()).body, False, out)
    return tuple(out)


@cache
def top_level_targets(module: str) -> frozenset[str]:
    found = set()
    for node, in_function in imports_of(module):
        if not in_function:
            found.update(targets_of(node))
    parts = module.split(".")
    found.update(".".join(parts[:i]) for i in range(1, len(parts)))   # its packages' __init__
    return frozenset(found - {module})


@cache
def loaded_by(module: str) -> frozenset[str]:
    """Every module (ours by full name, others by top-level name) that importing `module` loads."""
    seen, todo = {module}, [module]
    while todo:
        for target in top_level_targets(todo.pop()):
            if target not in seen:
                seen.add(target)
                if target in modules():
                    todo.append(target)
    return frozenset(seen)


@cache
def loaded_at_start() -> frozenset[str]:
    """What `stepcal --help` loads: the CLI and every command module (each registers its parser)."""
    found = set(loaded_by(CLI))
    for name in modules():
        if name.startswith("stepcal.experiments.commands."):
            found |= loaded_by(name)
    return frozenset(found)


def lazy_imports() -> list[LazyImport]:
    found = []
    for module, path in modules().items():
        for node, in_function in imports_of(module):
            if in_function:
                found.append(LazyImport(path, node.lineno, node.end_lineno, module, targets_of(node)))
    return found


def cost_of(lazy: LazyImport) -> set[str]:
    """The costly packages that hoisting this import would add to its module's import."""
    costly = COSTLY_AT_START if lazy.module in loaded_at_start() else COSTLY
    paid = loaded_by(lazy.module)
    adds = set()
    for target in lazy.targets:
        adds |= set(loaded_by(target)) if target in modules() else {target}
    return {name for name in adds - paid if name in costly}


def is_stdlib(name: str) -> bool:
    return name in sys.stdlib_module_names
