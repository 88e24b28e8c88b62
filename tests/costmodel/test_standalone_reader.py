"""readers/stepcal_tables.py, the reader of T_step table directories that needs only pyarrow and the
standard library: run in an isolated interpreter where stepcal cannot be imported, it gives the same
step times as stepcal's own step model for the same batches."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepcal.core.batch import StepBatch
from stepcal.costmodel.table_meta import TableMeta
from stepcal.experiments.cli import main
from stepcal.experiments.step_models import resolve_step_model
from tests.costmodel.conftest import PROFILES, make_step_log, require_shared

READERS = Path(__file__).resolve().parents[2] / "readers"
READER = READERS / "stepcal_tables.py"

# Prefill, decode, mixed and chunked batches, inside the grids and beyond their edges on every axis.
BATCHES = [
    ([1], [0]), ([7], [0]), ([512], [0]), ([4096], [0]), ([100_000], [0]), ([300], [2000]),
    ([1], [1]), ([1] * 8, [100] * 8), ([1] * 64, list(range(10, 650, 10))), ([1] * 3, [200_000, 5, 70]),
    ([1] * 5000, [300] * 5000), ([256, 1, 1, 1], [0, 40, 900, 3000]), ([2048, 1], [8192, 17]),
    ([3, 5, 1], [0, 12, 0]), ([1, 1], [0, 0]), ([64] * 40, [1000] * 40), ([9000, 1, 1], [150_000, 1, 2]),
    ([17, 1, 1, 1, 1], [33, 64, 65, 66, 67]), ([1] * 300, [131_072] * 300), ([123], [456]),
]

# Runs in `python -I`: stepcal is made unimportable, then the reader answers each batch of stdin.
CHILD = """
import importlib.abc, json, sys

class NoStepcal(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "stepcal":
            raise ModuleNotFoundError(f"{name} is not importable here")
        return None

sys.meta_path.insert(0, NoStepcal())
sys.path.insert(0, sys.argv[1])
import stepcal_tables
request = json.load(sys.stdin)
tables = stepcal_tables.load(request["directory"])
print(json.dumps({"step_ms": [tables.step_ms(q, kv) for q, kv in request["batches"]],
                  "stepcal_loaded": [m for m in sys.modules if m.split(".")[0] == "stepcal"]}))
"""


def standalone_step_ms(directory: Path, cwd: Path) -> list[float]:
    """The reader's answers for BATCHES, from an isolated interpreter run outside the repository."""
    request = json.dumps({"directory": str(directory), "batches": BATCHES})
    done = subprocess.run([sys.executable, "-I", "-c", CHILD, str(READERS)], input=request, cwd=cwd,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["stepcal_loaded"] == []
    return answer["step_ms"]


def stepcal_step_ms(directory: Path) -> list[float]:
    model = resolve_step_model(str(directory))
    return [model.step_ms(StepBatch.of(range(len(q)), q, kv)) for q, kv in BATCHES]


def assert_same(directory: Path, cwd: Path) -> None:
    ours, theirs = standalone_step_ms(directory, cwd), stepcal_step_ms(directory)
    assert len(ours) == len(BATCHES)
    for (q, kv), a, b in zip(BATCHES, ours, theirs):
        assert a == pytest.approx(b, rel=1e-9, abs=0.0), f"batch q={q[:4]} kv={kv[:4]}"


def test_composed_tables_read_alike(fitted_tables, tmp_path):
    meta = TableMeta.read(fitted_tables)
    assert meta.mode == "composed" and {"decode_attn", "prefill_attn", "linear"} <= set(meta.t_step_terms)
    assert_same(fitted_tables, tmp_path)


def test_calibrated_host_terms_are_applied_alike(fitted_tables, tmp_path):
    directory = tmp_path / "calibrated"
    directory.mkdir()
    for path in fitted_tables.glob("*.parquet"):
        (directory / path.name).write_bytes(path.read_bytes())
    meta = TableMeta.read(fitted_tables).to_dict()
    meta["host_terms"] = {"per_step_ms": 0.7, "per_seq_ms": 0.013, "per_token_ms": 0.0011,
                          "per_request_ms": 3.0, "base_scale": 1.07}
    TableMeta.from_dict(meta).write(directory)
    assert_same(directory, tmp_path)
    plain = standalone_step_ms(fitted_tables, tmp_path)
    assert standalone_step_ms(directory, tmp_path)[0] > plain[0] * 1.07


def test_whole_step_tables_read_alike(tmp_path):
    log = tmp_path / "steps.parquet"
    make_step_log().to_parquet(log, index=False)
    out = tmp_path / "step_tables"
    assert main(["fit", "--profile", str(log), "--model-spec", "tiny", "--no-mlflow", "--out", str(out)]) == 0
    assert TableMeta.read(out).mode == "step"
    assert_same(out, tmp_path)


def test_mixed_attention_tables_read_alike(tmp_path):
    """An LLMServingSim-style bundle with mixed prefill+decode calls: the mixed_decode_attn term counts
    only in batches with prefill tokens, in both readers."""
    from tests.costmodel.test_importer_llmservingsim import _bundle, _fit
    out = tmp_path / "mixed"
    assert _fit(tmp_path, _bundle(tmp_path), out) == 0
    assert "mixed_decode_attn" in TableMeta.read(out).t_step_terms
    assert_same(out, tmp_path)


@pytest.mark.slow
def test_tables_of_measured_h100_kernels_read_alike(tmp_path):
    """AIConfigurator's H100 GEMM and attention kernels composed for Llama-3-8B (about 30 s): the data's
    axes of hundreds of knots, and element-wise and sampling terms from the H100's memory roofline."""
    h100 = require_shared(PROFILES / "aiconfigurator" / "h100_sxm")
    out = tmp_path / "h100"
    assert main(["fit", "--profile", str(h100 / "gemm"), str(h100 / "attention"), "--model-spec", "llama-3-8b",
                 "--regressor", "rf", "--no-mlflow", "--out", str(out)]) == 0
    meta = TableMeta.read(out)
    assert {"linear", "elementwise", "sampling", "decode_attn", "prefill_attn"} <= set(meta.t_step_terms)
    assert meta.term_sources["elementwise"]["source"] == "roofline"
    assert_same(out, tmp_path)


def test_terms_extrapolating_below_zero_are_floored_alike(tmp_path):
    """A hand-written directory whose linear term falls with num_tokens and whose decode term falls with
    the KV length: beyond their last knots both extrapolate below zero, where T_step floors each term."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    directory = tmp_path / "falling"
    directory.mkdir()
    pq.write_table(pa.table({"num_tokens": [1.0, 64.0, 512.0], "time_ms": [2.0, 1.5, 0.25],
                             "spread_ms": [0.0, 0.0, 0.0]}), directory / "linear.parquet")
    cells = [(n, kv, 1.0 + 0.1 * n - 0.002 * kv) for n in (1.0, 8.0, 32.0) for kv in (1.0, 100.0, 400.0)]
    pq.write_table(pa.table({"num_decode": [c[0] for c in cells], "kv_mean": [c[1] for c in cells],
                             "time_ms": [c[2] for c in cells], "spread_ms": [0.0] * len(cells)}),
                   directory / "decode_attn.parquet")
    terms = {"linear": {"file": "linear.parquet", "axes": ["num_tokens"], "unit": "ms"},
             "decode_attn": {"file": "decode_attn.parquet", "axes": ["num_decode", "kv_mean"], "unit": "ms"}}
    TableMeta(mode="composed", t_step_terms=["linear", "decode_attn"], terms=terms).write(directory)
    ours, theirs = standalone_step_ms(directory, tmp_path), stepcal_step_ms(directory)
    assert ours == pytest.approx(theirs, rel=1e-9, abs=0.0)
    assert min(ours) == 0.0     # ([100_000], [0]): the linear term far below zero, no decode


def test_skew_term_reads_alike(tmp_path):
    """A hand-written decode_attn and its decode_attn_skew (alpha 0.05 of the same grid): batches whose
    KV lengths differ pay alpha x the gap between the longest KV's time and the mean KV's, in both readers."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    directory = tmp_path / "skew"
    directory.mkdir()
    cells = [(n, kv, 0.01 + 0.002 * n + 0.00001 * n * kv) for n in (1.0, 8.0, 64.0) for kv in (1.0, 512.0, 8192.0)]
    terms = {}
    for name, scale in (("decode_attn", 1.0), ("decode_attn_skew", 0.05)):
        pq.write_table(pa.table({"num_decode": [c[0] for c in cells], "kv_mean": [c[1] for c in cells],
                                 "time_ms": [scale * c[2] for c in cells], "spread_ms": [0.0] * len(cells)}),
                       directory / f"{name}.parquet")
        terms[name] = {"file": f"{name}.parquet", "axes": ["num_decode", "kv_mean"], "unit": "ms"}
    terms["decode_attn_skew"]["alpha"] = 0.05
    TableMeta(mode="composed", t_step_terms=list(terms), terms=terms).write(directory)
    ours, theirs = standalone_step_ms(directory, tmp_path), stepcal_step_ms(directory)
    assert ours == pytest.approx(theirs, rel=1e-9, abs=0.0)
    skewed = BATCHES.index(([1] * 3, [200_000, 5, 70]))
    uniform = resolve_step_model(str(directory)).step_ms(StepBatch.of(range(3), [1] * 3, [66_691] * 3))  # same mean
    assert ours[skewed] > uniform


def run_reader(directory: Path, cwd: Path) -> subprocess.CompletedProcess:
    code = f"import sys; sys.path.insert(0, {str(READERS)!r}); import stepcal_tables; stepcal_tables.load(sys.argv[1])"
    return subprocess.run([sys.executable, "-I", "-c", code, str(directory)], cwd=cwd,
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("change, message", [
    ({"schema_version": 99}, "schema_version 99 is newer than this reader supports"),
    ({"kind": "stepcal.profile"}, "expected 'stepcal.t_step_tables'"),
    ({"mode": "operators"}, "mode 'operators' holds no T_step grids"),
])
def test_unsupported_directories_are_refused_in_one_line(fitted_tables, tmp_path, change, message):
    directory = tmp_path / "changed"
    directory.mkdir()
    meta = json.loads((fitted_tables / "meta.json").read_text())
    (directory / "meta.json").write_text(json.dumps({**meta, **change}))
    done = run_reader(directory, tmp_path)
    assert done.returncode != 0
    assert "TableFormatError" in done.stderr and message in done.stderr


def test_the_reader_imports_only_pyarrow_and_the_standard_library():
    tree = ast.parse(READER.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            imported.add(node.module.split(".")[0])
    outside = {name for name in imported if name not in sys.stdlib_module_names} - {"pyarrow"}
    assert not outside, f"the reader imports {sorted(outside)}"
    assert "pyarrow" in imported
