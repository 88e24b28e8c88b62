import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stepcal.core.schemas import REQUEST_LOG_COLUMNS, STEP_LOG_COLUMNS
from stepcal.experiments.cli import main
from stepcal.experiments.validation.vllm_bench import read_vllm_bench

BENCH = Path(__file__).resolve().parents[1] / "data" / "vllm_bench_tiny.json"
FLAGS = ["--model-spec", "tiny", "--scheduler", "continuous", "--max-num-seqs", "8", "--kv-blocks", "64", "--quiet"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm") / "run"
    assert main(["import", "vllm-bench", str(BENCH), *FLAGS, "--out", str(out)]) == 0
    return out


def _bench(tmp_path, **changes):
    data = json.loads(BENCH.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    return path


def test_request_log_follows_the_bench_times(imported):
    requests = pd.read_parquet(imported / "repeat_0" / "requests.parquet")
    assert list(requests.columns) == list(REQUEST_LOG_COLUMNS)
    r0, r4 = requests.iloc[0], requests.iloc[4]
    # start_times 1000.00 and 1000.40: arrivals relative to the first
    assert r4.arrival_s == pytest.approx(0.40)
    assert r0.first_token_s == pytest.approx(0.05) and r0.finish_s == pytest.approx(0.05 + 0.033)
    assert r0.ttft_ms == pytest.approx(50.0) and r0.tpot_ms == pytest.approx(11.0) and r0.e2e_ms == pytest.approx(83.0)
    assert r4.tpot_ms == pytest.approx(78.0 / 4) and r4.e2e_ms == pytest.approx(198.0)
    assert np.isnan(requests.iloc[2].tpot_ms)             # one output token: TPOT undefined
    failed = requests.iloc[3]                             # non-empty error: kept, unfinished
    assert np.isnan(failed.first_token_s) and np.isnan(failed.finish_s)
    assert (requests.num_preemptions == 0).all()


def test_meta_summary_trace_and_empty_step_log(imported):
    meta = json.loads((imported / "meta.json").read_text())
    assert meta["kind"] == "measured_run" and meta["source"] == "vllm-bench"
    assert meta["arrival_source"] == "start_times" and meta["repeats"] == 1 and meta["num_failed"] == 1
    assert meta["scheduler"] == "continuous" and meta["scheduler_config"]["max_num_seqs"] == 8
    assert meta["kv_blocks"] == 64 and meta["block_size"] == 16 and meta["model_spec"]["name"] == "tiny"
    assert meta["bench_totals"]["completed"] == 5
    summary = json.loads((imported / "summary.json").read_text())
    assert summary["num_requests"] == 6 and summary["num_finished"] == 5
    itls_ms = np.array([10, 12, 11, 15, 13, 20, 18, 19, 21, 9], dtype=float)
    assert summary["itl_ms"]["mean"] == pytest.approx(itls_ms.mean())
    assert summary["itl_ms"]["p50"] == pytest.approx(np.percentile(itls_ms, 50))
    assert summary["ttft_ms"]["p50"] == pytest.approx(50.0)
    trace = pd.read_parquet(imported / "trace.parquet")
    assert list(trace.num_prompt_tokens) == [32, 64, 16, 48, 128, 24]
    assert list(trace.num_output_tokens) == [4, 3, 1, 1, 5, 2]   # the failed request replays with 1 token
    steps = pd.read_parquet(imported / "repeat_0" / "steps.parquet")
    assert len(steps) == 0 and list(steps.columns) == list(STEP_LOG_COLUMNS)


def test_validate_runs_on_an_imported_bench(imported, tmp_path):
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(imported), "--step-model", "linear:2,0.05,0.001", "--quiet",
                 "--out", str(out)]) == 0
    record = json.loads((out / "validation.json").read_text())
    assert record["num_requests"] == 6 and record["num_finished_both"] == 5
    assert record["num_finished_only_simulated"] == 1          # the failed request, counted not dropped
    assert record["step_level"] == {"mape": None, "p90_ape": None, "max_ape": None, "mean_predicted_ms": None,
                                    "mean_measured_ms": None, "num_steps": 0, "noise_floor": None}
    cell = record["metrics"]["ttft_ms"]["p50"]
    assert cell["measured"] == pytest.approx(50.0)
    assert cell["error"] == pytest.approx((cell["simulated"] - 50.0) / 50.0)
    assert (out / "validation.md").read_text().endswith("\n\nstep level: no measured step log\n")


def test_arrivals_without_start_times(tmp_path):
    even = read_vllm_bench(_bench(tmp_path, start_times=None))
    assert even.arrival_source == "request_rate"
    np.testing.assert_allclose(even.arrival_s, np.arange(6) / 10.0)
    assert "evenly spaced" in even.warnings[0]
    zero = read_vllm_bench(_bench(tmp_path, start_times=None, request_rate="inf", max_concurrency=4))
    assert zero.arrival_source == "zero" and (zero.arrival_s == 0).all()
    assert "max_concurrency 4" in zero.warnings[0]


def test_import_records_the_arrival_choice(tmp_path):
    out = tmp_path / "run"
    assert main(["import", "vllm-bench", str(_bench(tmp_path, start_times=None)), *FLAGS, "--out", str(out)]) == 0
    assert json.loads((out / "meta.json").read_text())["arrival_source"] == "request_rate"


def test_kv_blocks_from_device_memory(tmp_path):
    out = tmp_path / "run"
    flags = ["--model-spec", "llama-3-8b", "--device-memory-gb", "80", "--quiet"]
    assert main(["import", "vllm-bench", str(BENCH), *flags, "--out", str(out)]) == 0
    kv_blocks = json.loads((out / "meta.json").read_text())["kv_blocks"]
    # 80 GB · 0.9 minus 16 GB of bf16 weights, at 128 KiB of KV per token, 16 tokens a block: about 27k blocks
    assert 25_000 < kv_blocks < 30_000


@pytest.mark.parametrize(("changes", "message"), [
    ({"ttfts": None}, "missing key 'ttfts'"),
    ({"output_lens": [4, 3, 1, 0, 5]}, "'output_lens' has 5 entries but 'input_lens' has 6"),
    ({"start_times": [1.0] * 5}, "'start_times' has 5 entries"),
    ({"ttfts": [0.05, -0.08, 0.03, 0.0, 0.12, 0.04]}, "'ttfts'[1] is negative"),
    ({"itls": [[0.01], [0.015, -0.013], [], [], [0.02], [0.009]]}, "'itls[1]'[1] is negative"),
    ({"input_lens": [32, 64, 0, 48, 128, 24]}, "'input_lens'[2] must be an integer from 1 to"),
    ({"output_lens": [4, 0, 1, 0, 5, 2]}, "'output_lens'[1] is 0 for a request without an error"),
])
def test_bad_bench_files_name_the_key(tmp_path, capsys, changes, message):
    path = _bench(tmp_path, **changes)
    assert main(["import", "vllm-bench", str(path), *FLAGS, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stepcal: {path}: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_bench_saved_without_save_detailed_says_so(tmp_path, capsys):
    # what `vllm bench serve --save-result` writes without --save-detailed: the run's averages, no request
    data = json.loads(BENCH.read_text())
    for key in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"):
        data.pop(key)
    data |= {"median_ttft_ms": 50.0, "median_tpot_ms": 12.0}
    path = tmp_path / "summary_only.json"
    path.write_text(json.dumps(data))
    assert main(["import", "vllm-bench", str(path), *FLAGS, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == (f"stepcal: {path}: no per-request lists (input_lens, output_lens, ttfts, itls): the bench was "
                   f"saved without --save-detailed; run `vllm bench serve` again with --save-result --save-detailed\n")
    assert not (tmp_path / "o").exists()
    path.write_text("[1, 2]")
    assert main(["import", "vllm-bench", str(path), *FLAGS, "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.endswith("--save-detailed` JSON (an object), got a list\n")


def test_not_json_and_missing_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["import", "vllm-bench", str(bad), *FLAGS, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stepcal: {bad}: not a readable JSON file (") and err.count("\n") == 1
    assert main(["import", "vllm-bench", str(tmp_path / "nope.json"), *FLAGS, "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"stepcal: {tmp_path / 'nope.json'}: no such file\n"
    assert not (tmp_path / "o").exists()


def test_import_without_a_source_shows_usage(capsys):
    from stepcal.experiments.cli import build_parser
    assert main(["import"]) == 2
    commands = next(action for action in build_parser()._actions if action.dest == "command")
    usage = commands.choices["import"].format_help()
    assert capsys.readouterr().err == usage and "vllm-bench" in usage.split("SOURCE")[-1]


@pytest.mark.parametrize("group", ["import", "tables", "trace"])
def test_a_command_group_without_an_action_is_an_error_on_stderr(group, capsys):
    """An action is required: its absence exits 2 with the help (or a one-line error) on stderr, nothing
    on stdout."""
    assert main([group]) == 2
    out, err = capsys.readouterr()
    assert out == "" and (err.startswith(f"usage: stepcal {group}") or err.count("\n") == 1)
