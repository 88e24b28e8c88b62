"""The layering, enforced (docs/design.md, "Packages and layering"): every import in every module of a
package, including those inside functions (the lazy ones) and those only for type checking, names only
what that package may import; nothing imports upward; the ground floor (core) imports nothing of ours;
and no module imports, directly or around a circle, a module that imports it."""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("core", "simulator", "costmodel", "profiler", "experiments")   # installed as stepcal.<name>

# What each package may import besides the standard library and itself, lowest floor first. tqdm
# draws progress bars; pyarrow and joblib are the file formats of pandas and sklearn, threadpoolctl
# is how sklearn's thread count is pinned; yaml reads LLMServingSim's meta.yaml.
DATA = {"numpy", "pandas", "pyarrow", "tqdm"}
ALLOWED = {
    "core": DATA,
    "simulator": {"core", *DATA},
    "costmodel": {"core", "simulator", *DATA, "sklearn", "scipy", "optuna", "mlflow", "joblib", "threadpoolctl",
                  "matplotlib", "yaml"},
    "profiler": {"core", "simulator", *DATA, "torch"},
    "experiments": None,   # everything
}


def root_of(module: str) -> str:
    """The layer a module name belongs to: the stage for `stepcal.<stage>...`, else its top-level name."""
    parts = module.split(".")
    if parts[0] == "stepcal" and len(parts) > 1:
        return parts[1]
    return parts[0]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, at any depth of the tree."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def imported_roots(path: Path) -> list[tuple[int, str]]:
    """(line, layer) of every absolute import in a file (see root_of)."""
    return [(line, root_of(module)) for line, module in imported_modules(path)]


def violations(package: str) -> list[str]:
    allowed = ALLOWED[package]
    if allowed is None:
        return []
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, root in imported_roots(path):
            # `stepcal` alone is the package root, which holds only the version and imports nothing
            if root in (package, "stepcal", "__future__") or root in sys.stdlib_module_names:
                continue
            if root not in allowed:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {root}")
    return bad


@pytest.mark.parametrize("package", [p for p in FIRST_PARTY if ALLOWED[p] is not None])
def test_package_imports_follow_the_layering(package):
    assert violations(package) == []


def test_the_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import numpy\n\ndef f():\n    from stepcal.costmodel.tables import x\n    import torch.nn\n")
    assert imported_roots(module) == [(1, "numpy"), (4, "costmodel"), (5, "torch")]


def test_every_package_has_a_rule():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == {*FIRST_PARTY, "stepcal"}


SCRIPT_FOLDERS = ("tests", "bench", "studies", "gpu")


@pytest.mark.parametrize("folder", [*FIRST_PARTY, *SCRIPT_FOLDERS], ids=lambda folder: f"{folder}/")   # "gpu" is a marker
def test_our_modules_are_imported_by_their_installed_name(folder):
    # `import simulator` would load a second copy of a module beside `stepcal.simulator`'s (the tests
    # put the repository root on sys.path), or fail outside a checkout: every import says `stepcal.`.
    bare = [f"{path.relative_to(ROOT)}:{line} imports {module}"
            for path in sorted((ROOT / folder).rglob("*.py"))
            for line, module in imported_modules(path) if module.split(".")[0] in FIRST_PARTY]
    assert bare == []


def module_files() -> dict[str, Path]:
    """Every module of the installed packages by its dotted name without `stepcal.` (a package by its
    own name, for its __init__.py)."""
    modules = {}
    for package in FIRST_PARTY:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of ours it imports, anywhere in the file. `from package import name`
    points at package.name where that is a module, else at the package."""
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                wanted = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}"[8:] in modules
                          else node.module for alias in node.names]
            else:
                continue
            targets |= {w[len("stepcal."):] for w in wanted if w.startswith("stepcal.") and w[8:] in modules}
        graph[name] = targets - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm, without recursion)."""
    index, low, stack, found = {}, {}, [], []

    def enter(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        return node, iter(sorted(graph[node]))

    for root in sorted(graph):
        if root in index:
            continue
        work = [enter(root)]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    work.append(enter(child))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = stack[stack.index(node):]
                del stack[stack.index(node):]
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def test_no_module_imports_around_a_circle():
    # lazy and type-checking imports count: they hide a circle, they do not remove it
    assert circles(import_graph(module_files())) == []


def test_the_circle_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}}
    assert circles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_imports_and_submodules_named_through_their_package(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "FIRST_PARTY", ("pkg",))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from stepcal.pkg.b import x\n")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from stepcal.pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("import stepcal.pkg.a\nx = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = import_graph(module_files())
    assert graph == {"pkg": {"pkg.b"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert circles(graph) == [["pkg.a", "pkg.b"]]


CLI_MODULES = ("experiments/commands/", "experiments/cli.py")   # where flags are parsed


def is_command_line(module: str) -> bool:
    commands = "stepcal.experiments.commands"
    return module.split(".")[0] == "argparse" or module == commands or module.startswith(commands + ".")


def command_line_imports(path: Path) -> list[str]:
    """The imports of argparse or of the command modules in a file, at any depth of the tree;
    `from stepcal.experiments import commands` too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if is_command_line(node.module) else [
                f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}" for name in names if is_command_line(name)]
    return found


def test_the_library_takes_settings_not_parsed_flags():
    # Commands turn flags into the library's dataclasses; below them nothing parses or reads flags, so the
    # campaign, scripts and tests call the library as the commands do.
    below_cli = [path for folder in FIRST_PARTY for path in sorted((ROOT / folder).rglob("*.py"))
                 if not any(path.relative_to(ROOT).as_posix().startswith(cli) for cli in CLI_MODULES)]
    assert len(below_cli) > 100     # the walk found the packages
    assert [found for path in below_cli for found in command_line_imports(path)] == []
