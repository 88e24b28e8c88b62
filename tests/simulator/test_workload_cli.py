"""`stepcal trace stats` and `stepcal trace generate` through experiments.cli.main."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from stepcal.core.workload import read_trace
from stepcal.experiments import cli

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "data"
AZURE_CONV = REPO.parent / "shared" / "data" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture(autouse=True)
def only_the_trace_command(monkeypatch):
    # Build the parser with this command alone, so these tests do not depend on other
    # commands' modules (written in parallel) being importable.
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("trace",))


def test_stats_of_the_azure_trace(capsys):
    if not AZURE_CONV.exists():
        pytest.skip("shared data not present")
    assert cli.main(["trace", "stats", str(AZURE_CONV)]) == 0
    out = capsys.readouterr().out
    assert "requests     19366" in out
    assert "rate         5.53 req/s" in out          # 19,365 gaps over 3,501.7 s
    assert "prompt" in out and "1154.7" in out         # mean prompt length


def test_stats_json(capsys):
    assert cli.main(["trace", "stats", str(FIXTURES / "vidur_tiny.csv"), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["num_requests"] == 3
    assert stats["rate_rps"] == pytest.approx(0.8)
    assert stats["num_output_tokens_max"] == 256.0


def test_generate_writes_a_readable_trace(tmp_path, capsys):
    out = tmp_path / "w.parquet"
    spec = "gamma:rate=5,cv=2,n=300,prompt=lognormal:512:1.0,output=uniform:16:256,seed=3"
    assert cli.main(["trace", "generate", spec, "--out", str(out)]) == 0
    assert "wrote 300 requests" in capsys.readouterr().out
    trace = read_trace(out)
    assert len(trace) == 300 and trace.arrival_s[0] == 0.0
    assert trace.num_output_tokens.min() >= 16 and trace.num_output_tokens.max() <= 256


def test_generate_converts_a_file_with_rate_and_cut(tmp_path):
    out = tmp_path / "m.csv"
    argv = ["trace", "generate", str(FIXTURES / "mooncake_tiny.jsonl"), "--out", str(out),
            "--rate", "2", "--num-requests", "2"]
    assert cli.main(argv) == 0
    trace = read_trace(out)
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.5])   # cut to 2 requests first, then 2 req/s
    assert trace.prefix_hash_ids[1][-1] == 2366


@pytest.mark.parametrize("argv, pattern", [
    (["trace", "stats", "no-such-file.csv"], "TRACE: 'no-such-file.csv' is neither an existing file"),
    (["trace", "stats", "poisson:rate=x,n=5"], "'rate=x': must be a positive number"),
    (["trace", "stats", str(FIXTURES / "azure_tiny.csv"), "--trace-format", "vidur"],
     "missing column 'arrived_at'"),
    (["trace", "generate", "poisson:rate=1,n=3,prompt=fixed:1,output=fixed:1", "--out", "x.txt"],
     r"--out x\.txt: must end in \.csv or \.parquet"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, pattern):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepcal: ")
    assert re.search(pattern, lines[0])


def test_bad_row_names_file_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,5,5\n1,5,-2\n")
    assert cli.main(["trace", "stats", str(bad)]) == 2
    assert capsys.readouterr().err == (f"stepcal: {bad}: line 3 (data row 2): column "
                                       f"'num_output_tokens' must be positive, got -2\n")


def test_help_lists_the_reader_formats():
    from stepcal.core.workload import TRACE_FORMATS
    from stepcal.experiments.commands import trace as command
    assert command.FORMATS == TRACE_FORMATS      # duplicated there to keep --help free of numpy
