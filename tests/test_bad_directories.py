"""Our own directories (T_step tables, measured runs, validations, profiles) and the files a person
hands over (sweep configs, traces, model specs), broken every way a disk, a copy or an editor can
break them: each command that reads one keeps the CLI's promise: exit 2, one stderr line
`stepcal: <path>: ...` naming the broken file (and key), no traceback, nothing written.

Each case copies an intact directory built once per module, breaks one file, and runs one command.
A property test then feeds random malformed trace files to the trace readers.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepcal.core.errors import InputError
from stepcal.core.workload import read_trace
from stepcal.experiments.cli import main
from stepcal.experiments.validation.compare import RECORD_KEYS
from stepcal.experiments.validation.measured import REPLAY
from tests.costmodel.conftest import make_profile

DATA = Path(__file__).resolve().parent / "data"
TRACE = str(DATA / "stepcal_tiny.csv")
LINEAR = "linear:2,0.05,0.001"
GARBAGE = bytes(range(256)) * 8     # a NUL first, then every byte value: no text format, no Parquet
TERM_FILES = ("linear.parquet", "lm_head.parquet", "decode_attn.parquet", "prefill_attn.parquet")


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> Path:
    """One intact directory of each kind: profile/, tables/ (fitted on it), run/ (an imported vLLM
    bench with a second repeat) holding run/validation/ (validated against the linear model)."""
    root = tmp_path_factory.mktemp("intact")
    (root / "profile").mkdir()
    make_profile().to_parquet(root / "profile" / "profile.parquet", index=False)
    (root / "profile" / "meta.json").write_text(json.dumps({"grid": "quick", "points_done": 96}))
    assert main(["fit", "--profile", str(root / "profile"), "--model-spec", "tiny", "--regressor", "rf",
                 "--no-mlflow", "--out", str(root / "tables")]) == 0
    assert main(["import", "vllm-bench", str(DATA / "vllm_bench_tiny.json"), "--model-spec", "tiny",
                 "--scheduler", "continuous", "--quiet", "--out", str(root / "run")]) == 0
    shutil.copytree(root / "run" / "repeat_0", root / "run" / "repeat_1")
    assert main(["validate", "--measured", str(root / "run"), "--step-model", LINEAR, "--quiet",
                 "--out", str(root / "run" / "validation")]) == 0
    # As if the run had moved: the report finds it beside the validation, in each case's broken copy
    # (validation.json names the run by the path it was given, here the intact one).
    record = root / "run" / "validation" / "validation.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "measured_run": "moved/away"}))
    return root


# ---- how a file is broken ----

def _truncate(path: Path, _arg) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _drop(path: Path, key: str) -> None:
    """Remove a key (dotted for a nested one, e.g. terms.linear.file) from a JSON file."""
    data = json.loads(path.read_text())
    *parents, last = key.split(".")
    node = data
    for parent in parents:
        node = node[parent]
    del node[last]
    path.write_text(json.dumps(data))


def _set(path: Path, assignment: str) -> None:
    """Set a key of a JSON file to a JSON value ("block_size=\\"16\\"")."""
    key, value = assignment.split("=", 1)
    data = json.loads(path.read_text())
    data[key] = json.loads(value)
    path.write_text(json.dumps(data))


def _set_column(path: Path, assignment: str) -> None:
    """Replace a Parquet column: as text ("time_ms=text") or with a NaN in its first row ("time_ms=nan")."""
    column, how = assignment.split("=")
    frame = pd.read_parquet(path)
    if how == "text":
        frame[column] = frame[column].astype(str) + " ms"
    else:
        frame.loc[0, column] = float(how)
    frame.to_parquet(path)


BREAK = {
    "truncate": _truncate,
    "delete": lambda path, _arg: path.unlink(),
    "garbage": lambda path, _arg: path.write_bytes(GARBAGE),
    "list": lambda path, _arg: path.write_text("[1, 2]"),
    "columns": lambda path, _arg: pd.DataFrame({"unrelated": [1.0, 2.0]}).to_parquet(path),
    "drop": _drop,
    "set": _set,
    "column": _set_column,
}


# ---- the commands that read each kind of directory ({dir}: the copy, {out}: where output would go) ----

COMMANDS = {
    "simulate": ["simulate", "--trace", TRACE, "--step-model", "{dir}", "--out", "{out}"],
    "predict": ["predict", "--tables", "{dir}", "--input", "{intact}/profile/profile.parquet", "--out", "{out}.csv"],
    "export-vidur": ["tables", "export", "{dir}", "--format", "vidur", "--out", "{out}"],
    "export-csv": ["tables", "export", "{dir}", "--format", "csv", "--out", "{out}"],
    "report": ["report", "{dir}", "--out", "{out}"],
    "report-validation": ["report", "{dir}/validation", "--out", "{out}"],
    "validate": ["validate", "--measured", "{dir}", "--step-model", LINEAR, "--out", "{out}"],
    "calibrate": ["calibrate", "--measured", "{dir}", "--step-model", LINEAR, "--max-simulations", "5",
                  "--out", "{out}"],
    "fit": ["fit", "--profile", "{dir}", "--model-spec", "tiny", "--regressor", "rf", "--no-mlflow",
            "--out", "{out}"],
}


@dataclass(frozen=True)
class Case:
    source: str          # the intact directory copied: tables, run, profile
    command: str         # a key of COMMANDS
    file: str            # the file broken, relative to the copy
    how: str             # a key of BREAK
    arg: str = ""        # the key dropped or set
    needle: str = ""     # more the message must hold (default: the key dropped)

    @property
    def id(self) -> str:
        return f"{self.command}-{self.file}-{self.how}{'-' + self.arg if self.arg else ''}"


def _cases() -> list[Case]:
    cases = []
    # T_step tables, read by simulate --step-model (every grid and meta.json) and the other readers
    for term in TERM_FILES:
        cases += [Case("tables", "simulate", term, how) for how in ("truncate", "delete", "garbage", "columns")]
    cases += [Case("tables", "simulate", term, "column", value, value.split("=")[0]) for term, value in
              (("linear.parquet", "time_ms=text"), ("decode_attn.parquet", "kv_mean=text"),
               ("lm_head.parquet", "time_ms=nan"), ("prefill_attn.parquet", "spread_ms=inf"))]
    cases += [Case("tables", "simulate", "meta.json", how) for how in ("truncate", "garbage", "list")]
    cases += [Case("tables", "simulate", "meta.json", "drop", key)
              for key in ("kind", "t_step_terms", "terms", "terms.linear.file", "terms.decode_attn.axes")]
    cases += [Case("tables", "simulate", "meta.json", "set", 'host_terms={"per_step_ms": "fast"}', "host_terms")]
    cases += [Case("tables", "predict", "models/gemm.joblib", how) for how in ("truncate", "delete", "garbage")]
    cases += [Case("tables", "predict", "meta.json", "drop", "targets.gemm.model", "targets.gemm"),
              Case("tables", "predict", "meta.json", "drop", "kind")]
    cases += [Case("tables", "export-vidur", "ops.parquet", how) for how in ("truncate", "garbage", "columns")]
    cases += [Case("tables", "export-vidur", "ops.parquet", "column", "time_ms=text", "time_ms")]
    cases += [Case("tables", "export-csv", "prefill_attn.parquet", "truncate"),
              Case("tables", "export-csv", "meta.json", "drop", "terms.lm_head.file", "'file'")]
    cases += [Case("tables", "report", "linear.parquet", "truncate"), Case("tables", "report", "meta.json", "garbage")]
    # a measured run, read by validate and calibrate --measured
    run_files = ("trace.parquet", "repeat_0/requests.parquet", "repeat_0/steps.parquet", "repeat_1/requests.parquet",
                 "repeat_1/steps.parquet")
    for name in run_files:
        cases += [Case("run", "validate", name, how) for how in ("truncate", "garbage")]
    cases += [Case("run", "validate", name, "delete") for name in run_files[:4]]
    cases += [Case("run", "validate", name, "columns") for name in ("repeat_0/requests.parquet", "repeat_1/steps.parquet")]
    for name in ("meta.json", "summary.json", "repeat_0/summary.json", "repeat_1/summary.json"):
        cases += [Case("run", "validate", name, how) for how in ("truncate", "garbage", "list")]
    cases += [Case("run", "validate", "meta.json", "drop", key) for key in REPLAY.meta_keys]
    cases += [Case("run", "validate", "summary.json", "drop", key) for key in REPLAY.summary_keys]
    cases += [Case("run", "validate", "repeat_1/summary.json", "drop", "tpot_ms")]
    cases += [Case("run", "validate", "meta.json", "set", value, value.split("=")[0]) for value in
              ('block_size="16"', "kv_blocks=-1", "scheduler_config=[]", 'kind="profile"', "scheduler=7",
               'scheduler="fifo"', 'scheduler_config={"max_num_seqs": 0}', 'scheduler_config={"chunk": 8}')]
    cases += [Case("run", "validate", "summary.json", "set", 'ttft_ms={"p50": "slow"}', "ttft_ms")]
    cases += [Case("run", "calibrate", name, how) for name, how in
              (("repeat_0/steps.parquet", "truncate"), ("summary.json", "garbage"), ("meta.json", "list"))]
    cases += [Case("run", "calibrate", "meta.json", "drop", "scheduler_config")]
    # a validation (and the measured run it names), read by report
    cases += [Case("run", "report-validation", "validation/validation.json", how)
              for how in ("truncate", "garbage", "list", "delete")]
    cases += [Case("run", "report-validation", "validation/validation.json", "drop", key) for key in RECORD_KEYS]
    cases += [Case("run", "report-validation", "validation/validation.json", "set", value, value.split("=")[0])
              for value in ('metrics={"ttft_ms": [1]}', 'step_level="good"', 'throughput_rps={"error": "big"}')]
    for name in ("validation/simulated_requests.parquet", "validation/step_predictions.parquet"):
        cases += [Case("run", "report-validation", name, how) for how in ("truncate", "delete", "columns")]
    cases += [Case("run", "report-validation", name, "truncate") for name in
              ("repeat_0/requests.parquet", "repeat_1/requests.parquet")]
    # a profile directory, read by fit --profile
    cases += [Case("profile", "fit", "profile.parquet", how) for how in ("truncate", "garbage", "columns", "delete")]
    # each artifact written by a newer stepcal: refused by its reader in one line naming the file
    newer = ("schema_version=99", "schema_version 99 is newer")
    cases += [Case("run", "validate", "meta.json", "set", *newer), Case("profile", "fit", "meta.json", "set", *newer),
              Case("run", "report-validation", "validation/validation.json", "set", *newer)]
    return cases


CASES = _cases()


def _run(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()     # what a fixture printed before is not this command's
    code = main(argv)
    return code, capsys.readouterr().err


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def _assert_one_clean_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.startswith("stepcal: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err and "np.float" not in err and "np.int" not in err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_broken_file_is_named_in_one_line(case, intact, tmp_path, capsys):
    copy = tmp_path / case.source
    shutil.copytree(intact / case.source, copy)
    broken = copy / case.file
    BREAK[case.how](broken, case.arg)
    before = _files(tmp_path)
    argv = [a.format(dir=copy, out=tmp_path / "out", intact=intact) for a in COMMANDS[case.command]]
    code, err = _run(argv, capsys)
    # a deleted file may be named relative to its directory ("--measured DIR: missing repeat_0/...")
    named = broken.name if case.how == "delete" else str(broken)
    key = case.needle or (case.arg.split(".")[-1] if case.how == "drop" else "")
    _assert_one_clean_line(code, err, named, *([f"{key}"] if key else []))
    assert _files(tmp_path) == before      # nothing written, not even a staging directory


# Broken where the file names itself, not through a directory.
LOOSE = [
    ("sweep-binary", "config.toml", GARBAGE, ["sweep", "{file}", "--out", "{out}"], "not a text file"),
    ("sweep-utf16", "config.toml", 'trace = "x.csv"\n'.encode("utf-16"), ["sweep", "{file}", "--out", "{out}"],
     "not a text file"),
    ("sweep-latin1", "config.toml", 'trace = "caf\xe9.csv"\n'.encode("latin-1"), ["sweep", "{file}", "--out", "{out}"],
     "not UTF-8"),
    ("simulate-trace-binary", "trace.csv", GARBAGE, ["simulate", "--trace", "{file}", "--step-model", "const:1",
                                                     "--out", "{out}"], "not a text file"),
    ("trace-stats-binary-jsonl", "trace.jsonl", GARBAGE, ["trace", "stats", "{file}"], "not a text file"),
    ("trace-stats-binary-parquet", "trace.parquet", GARBAGE, ["trace", "stats", "{file}"], "not a readable Parquet"),
    ("trace-stats-binary-noext", "trace", b"{" + GARBAGE, ["trace", "stats", "{file}"], "not a text file"),
    ("model-spec-binary", "spec.json", GARBAGE, ["import", "vllm-bench", str(DATA / "vllm_bench_tiny.json"),
                                                 "--model-spec", "{file}", "--out", "{out}"], "not a text file"),
    ("model-spec-toml-binary", "spec.toml", GARBAGE, ["import", "vllm-bench", str(DATA / "vllm_bench_tiny.json"),
                                                      "--model-spec", "{file}", "--out", "{out}"], "not a text file"),
    ("fit-profile-binary-csv", "profile.csv", GARBAGE, ["fit", "--profile", "{file}", "--model-spec", "tiny",
                                                        "--no-mlflow", "--out", "{out}"], "not a text file"),
]


@pytest.mark.parametrize("name,filename,content,argv,needle", LOOSE, ids=[c[0] for c in LOOSE])
def test_a_binary_file_given_as_text_is_named(name, filename, content, argv, needle, tmp_path, capsys):
    path = tmp_path / filename
    path.write_bytes(content)
    code, err = _run([a.format(file=path, out=tmp_path / "out") for a in argv], capsys)
    _assert_one_clean_line(code, err, str(path), needle)
    assert sorted(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("source,target", [("run", "{dir}"), ("profile", "{dir}"), ("tables", "{dir}/models")])
def test_report_on_a_directory_that_is_not_a_validation(source, target, intact, tmp_path, capsys):
    """A measured run, a profile and a folder of regressors are not reports' inputs: exit 2 (was 0, with
    a note inside report.md), naming the directory and what it lacks."""
    copy = tmp_path / source
    shutil.copytree(intact / source, copy)
    directory = target.format(dir=copy)
    code, err = _run(["report", directory, "--out", str(tmp_path / "out")], capsys)
    _assert_one_clean_line(code, err, f"{directory}: neither a validation directory")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["simulate", "predict", "export-vidur", "report", "report-validation"])
def test_the_intact_directories_pass(command, intact, tmp_path, capsys):
    """The control: the same commands on the unbroken copies succeed, so each case above fails
    because of its breakage."""
    source = "tables" if command in ("simulate", "predict", "export-vidur", "report") else "run"
    copy = tmp_path / source
    shutil.copytree(intact / source, copy)
    argv = [a.format(dir=copy, out=tmp_path / "out", intact=intact) for a in COMMANDS[command]]
    assert _run(argv, capsys)[0] == 0


# ---- property: random malformed trace files never escape the readers as anything but InputError ----

# Each format's required columns, and optional ones of ours and Mooncake's.
FORMAT_COLUMNS = {"stepcal": ("arrival_s", "num_prompt_tokens", "num_output_tokens"),
                  "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
                  "mooncake": ("timestamp", "input_length", "output_length"),
                  "vidur": ("arrived_at", "num_prefill_tokens", "num_decode_tokens")}
OPTIONAL_COLUMNS = ("request_id", "priority", "slo_ttft_ms", "slo_tpot_ms", "prefix_hash_ids", "hash_ids", "other")
COLUMN_NAMES = tuple(c for columns in FORMAT_COLUMNS.values() for c in columns) + OPTIONAL_COLUMNS
# Cells as a careless export writes them: NaN, infinities, negatives, huge, fractional, words, lists.
BAD_CELLS = st.one_of(
    st.sampled_from(["", "nan", "NaN", "inf", "-inf", "-1", "0", "1e18", "1e19", "1e308", "9.5e18", "2.5",
                     "abc", "true", '"[1, 2]"', "[1,x]", "1 2 3", '"', "0x10", "\u00e9", "2023-11-16 18:15:46"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-10**20, 10**20).map(str))
GOOD_CELLS = st.integers(1, 400).map(str)
GOOD_STAMPS = st.integers(0, 59).map(lambda s: f"2023-11-16 18:15:{s:02d}.5")
BAD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(), st.text(max_size=6),
                       st.lists(st.integers(-2**70, 2**70), max_size=3),
                       st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))
FORMATS = st.sampled_from([None, None, "stepcal", "azure", "mooncake", "vidur"])


@st.composite
def near_valid_rows(draw) -> tuple[list[str], list[list]]:
    """A format's columns (maybe one dropped, maybe some optional or repeated ones added) and a few
    rows of good values with a bad one here and there: the readers' checks of each value run."""
    columns = list(FORMAT_COLUMNS[draw(st.sampled_from(sorted(FORMAT_COLUMNS)))])
    if draw(st.integers(0, 4)) == 0:
        columns.pop(draw(st.integers(0, len(columns) - 1)))
    columns += draw(st.lists(st.sampled_from(OPTIONAL_COLUMNS + tuple(columns)), max_size=2))
    good = {c: GOOD_STAMPS if c == "TIMESTAMP" else GOOD_CELLS for c in columns}
    rows = [[draw(good[c] if draw(st.integers(0, 5)) else BAD_CELLS) for c in columns]
            for _ in range(draw(st.integers(0, 5)))]
    return columns, rows


@st.composite
def csv_files(draw) -> bytes:
    if draw(st.booleans()):
        columns, rows = draw(near_valid_rows())
    else:     # any header, rows of any width
        columns = draw(st.lists(st.sampled_from(COLUMN_NAMES), max_size=6))
        rows = draw(st.lists(st.lists(BAD_CELLS, max_size=len(columns) + 1), max_size=6))
    return "\n".join([",".join(columns)] + [",".join(row) for row in rows]).encode()


@st.composite
def jsonl_files(draw) -> bytes:
    columns, rows = draw(near_valid_rows())
    records = [{c: draw(BAD_VALUES) if draw(st.integers(0, 5)) == 0 else _number(v) for c, v in zip(columns, row)}
               for row in rows]
    lines = [json.dumps(r) for r in records]
    if draw(st.integers(0, 3)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(["{", "[1]", "null", '{"a": NaN}'])))
    return "\n".join(lines).encode()


def _number(cell: str):
    """A CSV cell as JSON would carry it: a number where it is one, else the text."""
    try:
        return json.loads(cell)
    except ValueError:
        return cell


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


def _read_or_refuse(path: Path, fmt: str | None) -> None:
    """read_trace returns a valid workload or raises an InputError naming the file, on one line."""
    try:
        trace = read_trace(path, fmt)
    except InputError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc), str(exc)
        return
    assert len(trace) > 0
    assert np.isfinite(trace.arrival_s).all() and (trace.arrival_s >= 0).all()
    assert (trace.num_prompt_tokens >= 1).all() and (trace.num_output_tokens >= 1).all()
    assert len(np.unique(trace.request_id)) == len(trace)


PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(content=st.one_of(st.binary(max_size=400), csv_files(), jsonl_files()),
       suffix=st.sampled_from([".csv", ".jsonl", ".txt"]), fmt=FORMATS)
def test_random_trace_files_are_read_or_refused(content, suffix, fmt, scratch):
    path = scratch / f"trace{suffix}"
    path.write_bytes(content)
    _read_or_refuse(path, fmt)


@PROPERTY
@given(data=st.data(), fmt=FORMATS)
def test_random_parquet_traces_are_read_or_refused(data, fmt, scratch):
    columns, rows = data.draw(near_valid_rows())
    values = {c: [data.draw(BAD_VALUES) if data.draw(st.integers(0, 5)) == 0 else _number(row[i]) for row in rows]
              for i, c in enumerate(dict.fromkeys(columns))}
    path = scratch / "trace.parquet"
    try:
        pd.DataFrame(values, index=range(len(rows))).to_parquet(path)
    except Exception:     # a column pyarrow cannot store (mixed types) is no Parquet file to read
        path.write_bytes(data.draw(st.binary(max_size=200)))
    _read_or_refuse(path, fmt)


OWN_PARQUET = ("tables/linear.parquet", "tables/decode_attn.parquet", "tables/ops.parquet", "run/trace.parquet",
               "run/repeat_0/requests.parquet", "run/repeat_0/steps.parquet", "profile/profile.parquet")


@PROPERTY
@given(name=st.sampled_from(OWN_PARQUET), flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True),
                                                                   st.integers(0, 255)), min_size=1, max_size=8))
def test_damaged_parquet_files_are_read_or_refused(name, flips, intact, scratch):
    """A few bytes flipped anywhere (pages, footer, pandas metadata): read, or an InputError naming the file.
    (Damaged pandas metadata raises KeyError or TypeError inside pandas, not only pyarrow's errors.)"""
    from stepcal.core.readers import read_parquet
    data = bytearray((intact / name).read_bytes())
    for where, value in flips:
        data[int(where * len(data))] = value
    path = scratch / "damaged.parquet"
    path.write_bytes(bytes(data))
    try:
        read_parquet(path, "a damaged file")
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"{path}: "), str(exc)
