"""Size limits of the installed package folders: no module over MAX_FILE_LINES lines and no function
over MAX_FUNCTION_LINES, counted from its def line to its last line."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("core", "simulator", "costmodel", "profiler", "experiments", "stepcal")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def modules() -> list[Path]:
    return sorted(path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py"))


def function_lengths(path: Path) -> list[tuple[str, int]]:
    """(name, lines) of every function and method in the file, nested ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_module_is_over_the_line_limit():
    long = [f"{path.relative_to(ROOT).as_posix()}: {count} lines" for path in modules()
            if (count := len(path.read_text().splitlines())) > MAX_FILE_LINES]
    assert long == [], f"modules over {MAX_FILE_LINES} lines: {long}"


def test_no_function_is_over_the_line_limit():
    long = []
    for path in modules():
        where = path.relative_to(ROOT).as_posix()
        long += [f"{where}:{name}: {count} lines" for name, count in function_lengths(path)
                 if count > MAX_FUNCTION_LINES]
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: {long}"
