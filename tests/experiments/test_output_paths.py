"""Every command that writes refuses an output it cannot write before any work: one line naming the
flag and the path, exit 2, no traceback, nothing written (experiments/commands/output_paths.py)."""
import os
import re
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from stepcal.core.errors import InputError
from stepcal.experiments.cli import build_parser, main
from stepcal.experiments.output_paths import check_output
from tests.costmodel.conftest import make_profile
from tests.experiments.test_import_llmservingsim import write_run

BENCH = Path(__file__).resolve().parents[1] / "data" / "vllm_bench_tiny.json"
# Inputs that would keep each command busy for a long time: a refusal must come before them.
BIG_TRACE = "poisson:rate=50,n=5000,prompt=lognormal:512:1.0,output=uniform:16:256"
LINEAR = "linear:2,0.05,0.001"
SWEEP = f"""
trace = "{BIG_TRACE}"
rates_rps = [5.0, 10.0, 20.0, 40.0]
step_models = ["{LINEAR}"]

[[schedulers]]
name = "vllm"
max_num_seqs = [8, 64, 256]
"""
QUICK_S = 3.0   # loose: the refusal loads no numpy or torch; the jobs take minutes


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Valid, small inputs for every command: a measured run and its validation, T_step tables, a
    profile file and directory, a sweep config. Built once, outside each test's tmp_path."""
    root = tmp_path_factory.mktemp("inputs")
    profile_file = root / "profile.parquet"
    make_profile().to_parquet(profile_file, index=False)
    steps = [
        ["import", "vllm-bench", str(BENCH), "--model-spec", "tiny", "--quiet", "--out", str(root / "measured")],
        ["validate", "--measured", str(root / "measured"), "--step-model", LINEAR, "--quiet"],
        ["fit", "--profile", str(profile_file), "--model-spec", "tiny", "--regressor", "rf", "--no-mlflow",
         "--out", str(root / "tables")],
        ["profile", "--model-spec", "tiny", "--ops", "overhead", "--no-progress", "--out", str(root / "profile")],
    ]
    for argv in steps:
        assert main(argv) == 0, argv
    (root / "sweep.toml").write_text(SWEEP)
    write_run(root / "llmservingsim")
    return SimpleNamespace(root=root, llmservingsim=str(root / "llmservingsim"), measured=str(root / "measured"), tables=str(root / "tables"),
                           validation=str(root / "measured" / "validation"), profile_file=str(profile_file),
                           profile_dir=str(root / "profile"), sweep=str(root / "sweep.toml"))


# Each writing command with a directory output, as argv before `--out DIR`.
DIR_COMMANDS = {
    "quickstart": lambda i: ["quickstart"],
    "simulate": lambda i: ["simulate", "--trace", BIG_TRACE, "--step-model", LINEAR],
    "measure": lambda i: ["measure", "--trace", BIG_TRACE],
    "validate": lambda i: ["validate", "--measured", i.measured, "--step-model", LINEAR],
    "calibrate": lambda i: ["calibrate", "--measured", i.measured, "--step-model", LINEAR],
    "profile": lambda i: ["profile", "--model-spec", "tiny", "--grid", "quick"],
    "profile merge": lambda i: ["profile", "merge", i.profile_dir],
    "fit": lambda i: ["fit", "--profile", i.profile_file, "--model-spec", "tiny", "--trials", "50"],
    "tables export": lambda i: ["tables", "export", i.tables, "--format", "csv"],
    "capacity": lambda i: ["capacity", "--trace", BIG_TRACE, "--step-model", LINEAR, "--slo-ttft-ms", "500"],
    "sweep": lambda i: ["sweep", i.sweep],
    "import vllm-bench": lambda i: ["import", "vllm-bench", str(BENCH), "--model-spec", "tiny"],
    "import llmservingsim": lambda i: ["import", "llmservingsim", i.llmservingsim],
    "report": lambda i: ["report", i.validation, i.tables],
}

# Each flag naming a file to write: (command, flag, argv before it, how the path becomes the value).
FILE_FLAGS = {
    "predict --out": ("--out", lambda i: ["predict", "--tables", i.tables, "--input", i.profile_file], str),
    "trace generate --out": ("--out", lambda i: ["trace", "generate", BIG_TRACE], str),
    "fit --storage": ("--storage", lambda i: ["fit", "--profile", i.profile_file, "--trials", "50",
                                              "--out", str(i.root / "never")], str),
    "fit --tracking-uri": ("--tracking-uri", lambda i: ["fit", "--profile", i.profile_file, "--trials", "50",
                                                        "--out", str(i.root / "never")], lambda p: f"sqlite:///{p}"),
    "report --tracking-uri": ("--tracking-uri", lambda i: ["report", i.validation, "--mlflow-run-id", "0" * 32,
                                                           "--out", str(i.root / "never")], lambda p: f"sqlite:///{p}"),
}

# Bad outputs (relative to tmp_path, the working directory) and what the line must say about them.
BAD_DIRS = {
    "existing file": ("taken", r"taken: is an existing file, not a directory"),
    "child of a file": ("taken/x", r"taken/x: taken is not a directory"),
    "in a read-only dir": ("ro/x", r"ro/x: cannot write in ro "),
    "read-only dir itself": ("ro", r"ro: cannot write in ro "),
    "under /proc": ("/proc/stepcal-out", r"/proc is a system pseudo filesystem"),
}
BAD_FILES = {
    "existing dir": ("adir", r"adir: is a directory; give a file name"),
    "child of a file": ("taken/x.csv", r"taken/x\.csv: taken is not a directory"),
    "in a read-only dir": ("ro/x.csv", r"ro/x\.csv: cannot write in ro "),
    "under /proc": ("/proc/stepcal-out.csv", r"/proc is a system pseudo filesystem"),
}
BAD_SUFFIX = {"predict --out": "x.txt", "trace generate --out": "x.json"}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """tmp_path as the working directory, holding a file `taken`, a directory `adir` and a read-only
    directory `ro`; anything a command wrote by mistake would land here and be seen."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("not a directory\n")
    (tmp_path / "adir").mkdir()
    make_read_only(tmp_path / "ro", monkeypatch)
    yield tmp_path
    for path in tmp_path.iterdir():
        if path.is_dir():
            path.chmod(0o755)   # so that pytest can clean up


def make_read_only(directory: Path, monkeypatch) -> None:
    """chmod 0o555; as root, for whom every directory is writable, os.access is told otherwise."""
    directory.mkdir(exist_ok=True)
    directory.chmod(0o555)
    if os.geteuid() != 0:
        return
    read_only, previous = directory.resolve(), os.access

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK and Path(path).resolve() == read_only:
            return False
        return previous(path, mode, *args, **kwargs)
    monkeypatch.setattr(os, "access", access)


def snapshot(root: Path) -> set:
    return {(str(p.relative_to(root)), p.is_dir()) for p in root.rglob("*")}


def assert_refused(argv: list[str], flag: str, pattern: str, root: Path, capsys) -> None:
    before = snapshot(root)
    started = time.process_time()   # CPU time: a job that ran first shows, another process's load does not
    code = main(argv)
    elapsed = time.process_time() - started
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in err and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"stepcal: {flag} "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert snapshot(root) == before
    assert elapsed < QUICK_S, f"refused after {elapsed:.1f} s: the job ran first"


@pytest.mark.parametrize("bad", list(BAD_DIRS))
@pytest.mark.parametrize("command", list(DIR_COMMANDS))
def test_a_directory_output_that_cannot_be_written_is_refused_first(command, bad, inputs, workdir, capsys):
    path, pattern = BAD_DIRS[bad]
    assert_refused(DIR_COMMANDS[command](inputs) + ["--out", path], "--out", pattern, workdir, capsys)


@pytest.mark.parametrize("bad", list(BAD_FILES))
@pytest.mark.parametrize("case", list(FILE_FLAGS))
def test_a_file_output_that_cannot_be_written_is_refused_first(case, bad, inputs, workdir, capsys):
    flag, before, value = FILE_FLAGS[case]
    path, pattern = BAD_FILES[bad]
    assert_refused(before(inputs) + [flag, value(path)], flag, pattern, workdir, capsys)


@pytest.mark.parametrize("case", list(BAD_SUFFIX))
def test_a_file_output_with_an_unsupported_suffix_is_refused_first(case, inputs, workdir, capsys):
    flag, before, _ = FILE_FLAGS[case]
    name = BAD_SUFFIX[case]
    assert_refused(before(inputs) + [flag, name], flag, rf"{re.escape(name)}: must end in ", workdir, capsys)


def test_validate_checks_its_default_output_beside_a_read_only_measured_run(inputs, workdir, capsys,
                                                                           monkeypatch):
    measured = workdir / "measured"
    shutil.copytree(inputs.measured, measured, ignore=shutil.ignore_patterns("validation"))
    make_read_only(measured, monkeypatch)
    assert_refused(["validate", "--measured", "measured", "--step-model", LINEAR],
                   "--out (default MEASURED/validation)", r"measured/validation: cannot write in measured ",
                   workdir, capsys)


def test_every_command_with_an_out_flag_is_covered():
    """A new writing command must join the tables above (and call check_output)."""
    with_out = set()

    def walk(parser, name):
        for action in parser._actions:
            if "--out" in action.option_strings:
                with_out.add(name)
            if isinstance(action.choices, dict):    # a subparsers action: name -> parser
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}".strip())
    walk(build_parser(), "")
    covered = set(DIR_COMMANDS) | {case.removesuffix(" --out") for case in FILE_FLAGS if case.endswith("--out")}
    assert with_out == covered


def test_trace_suffixes_agree_with_the_writer():
    from stepcal.core.workload.writer import TRACE_SUFFIXES
    from stepcal.experiments.commands.trace import SUFFIXES
    assert SUFFIXES == TRACE_SUFFIXES     # duplicated there to keep --help free of numpy


@pytest.mark.parametrize("path, kind", [
    ("adir", "dir"),              # an existing directory: its files are replaced, as before
    ("new/nested/dir", "dir"),    # created later, by the command
    ("taken", "file"),            # an existing file is replaced
    ("new/out.csv", "file"),
    (".", "dir"),
])
def test_writable_outputs_pass_and_nothing_is_created(path, kind, workdir):
    before = snapshot(workdir)
    assert check_output(path, kind=kind) == Path(path)
    assert snapshot(workdir) == before


def test_a_broken_symbolic_link_is_refused(workdir):
    (workdir / "dangling").symlink_to(workdir / "nowhere")
    with pytest.raises(InputError, match="--out dangling: is a broken symbolic link"):
        check_output("dangling")


def test_dev_shm_is_storage_not_a_pseudo_filesystem():
    if not Path("/dev/shm").is_dir() or not os.access("/dev/shm", os.W_OK | os.X_OK):
        pytest.skip("no writable /dev/shm")
    check_output("/dev/shm/stepcal-never-created")
    assert not Path("/dev/shm/stepcal-never-created").exists()
