"""Imports inside functions only where an import is costly: each lazy import would, at the top of its
module, load a costly package (torch, pandas, scikit-learn, MLflow, ... or, in what `stepcal --help`
loads, numpy) that the module does not load already, and it says which on its line.
Circles cannot hide behind lazy imports: tests/test_layering.py counts them in the import graph."""
import re
import subprocess
import sys

from tests.import_costs import COSTLY_AT_START, ROOT, LazyImport, cost_of, lazy_imports, loaded_at_start

REASON = re.compile(r"#\s*lazy:\s*(.+)$")


def _reason(lazy) -> str | None:
    lines = lazy.path.read_text().splitlines()[lazy.line - 1:lazy.end_line]
    for line in lines:
        found = REASON.search(line)
        if found:
            return found.group(1)
    return None


def test_every_lazy_import_is_costly():
    cheap = [f"{lazy.path.relative_to(ROOT)}:{lazy.line}" for lazy in lazy_imports() if not cost_of(lazy)]
    assert cheap == [], "cheap imports inside functions: move them to the top of the module"


def test_every_lazy_import_names_what_it_spares():
    missing = []
    for lazy in lazy_imports():
        reason = _reason(lazy)
        if reason is None or not any(name in reason for name in cost_of(lazy)):
            missing.append(f"{lazy.path.relative_to(ROOT)}:{lazy.line} (costs {sorted(cost_of(lazy))})")
    assert missing == [], "lazy imports without '# lazy: <the costly package>' on their line"


def test_help_loads_nothing_costly():
    assert sorted(name for name in loaded_at_start() if name in COSTLY_AT_START) == []
    code = ("import sys\nfrom stepcal.experiments.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n"
            f"    pass\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(COSTLY_AT_START)!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_the_check_tells_cheap_from_costly():
    where = ROOT / "simulator" / "events.py"      # a simulator module: loads no torch, not loaded by --help
    assert cost_of(LazyImport(where, 1, 1, "stepcal.simulator.events", ("json",))) == set()
    assert cost_of(LazyImport(where, 1, 1, "stepcal.simulator.events", ("torch",))) == {"torch"}
    assert cost_of(LazyImport(where, 1, 1, "stepcal.simulator.events", ("stepcal.core.errors",))) == set()
