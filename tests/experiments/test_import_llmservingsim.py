"""`stepcal import llmservingsim`: a vLLM run recorded by LLMServingSim's bench as a measured run."""
import json
import re

import numpy as np
import pandas as pd
import pytest

from stepcal.core.schemas import REQUEST_LOG_COLUMNS, STEP_LOG_COLUMNS
from stepcal.experiments.cli import main

# Three requests with known stamps. The engine's monotonic clock is the epoch clock minus 950 s
# for request 0; request 1 reaches the engine 100 ms after it was sent, the others at once.
REQUESTS = [
    {"request_id": "bench-0", "input_toks": 10, "output_toks": 5, "arrival_time": 1000.0,
     "queued_ts": 50.0, "scheduled_ts": 50.001, "first_token_ts": 50.2, "last_token_ts": 50.6},
    {"request_id": "bench-1", "input_toks": 20, "output_toks": 1, "arrival_time": 1000.5,
     "queued_ts": 50.6, "scheduled_ts": 50.61, "first_token_ts": 50.9, "last_token_ts": 50.9},
    {"request_id": "bench-2", "input_toks": 30, "output_toks": 3, "arrival_time": 1001.0,
     "queued_ts": 51.0, "scheduled_ts": 51.1, "first_token_ts": 51.5, "last_token_ts": 51.7},
]
ENGINE = {"model": "tiny/model", "tensor_parallel_size": 2, "data_parallel_size": 1, "max_num_seqs": 8,
          "max_num_batched_tokens": 64, "max_model_len": None, "dtype": "bfloat16", "kv_cache_dtype": "auto",
          "seed": 7}
META = {"schema_version": 1, "model": "tiny/model", "vllm_version": "0.19.0", "engine_kwargs": ENGINE,
        "num_requests": 3, "started_at": "2026-04-25T18:47:18Z", "finished_at": "2026-04-25T18:47:21Z",
        "tick_seconds": 1.0}
TIMESERIES = "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n1.0,60.0,9.0,2,0,0.5\n"
CLUSTER = {"nodes": [{"instances": [{"model_name": "tiny/model", "hardware": "RTXPRO6000", "tp_size": 2}]}]}
LINEAR = "linear:8,0.03,0.0002"


def write_run(root, requests=REQUESTS, lines=None):
    """A bench run directory: RUN/vllm/{requests.jsonl,meta.json,timeseries.csv} and RUN/config.json."""
    (root / "vllm").mkdir(parents=True)
    text = "\n".join(lines if lines is not None else [json.dumps(r) for r in requests]) + "\n"
    (root / "vllm" / "requests.jsonl").write_text(text)
    (root / "vllm" / "meta.json").write_text(json.dumps(META))
    (root / "vllm" / "timeseries.csv").write_text(TIMESERIES)
    (root / "config.json").write_text(json.dumps(CLUSTER))
    return root


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = write_run(tmp_path_factory.mktemp("lss") / "run")
    out = root.parent / "imported"
    assert main(["import", "llmservingsim", str(root), "--quiet", "--out", str(out)]) == 0
    return out


def test_request_log_measures_from_the_engines_receipt(imported):
    requests = pd.read_parquet(imported / "repeat_0" / "requests.parquet")
    assert list(requests.columns) == list(REQUEST_LOG_COLUMNS)
    assert requests.request_id.tolist() == [0, 1, 2]
    assert requests.arrival_s.tolist() == pytest.approx([0.0, 0.6, 1.0])
    assert requests.first_token_s.tolist() == pytest.approx([0.2, 0.9, 1.5])
    assert requests.finish_s.tolist() == pytest.approx([0.6, 0.9, 1.7])
    assert requests.ttft_ms.tolist() == pytest.approx([200.0, 300.0, 500.0])
    assert requests.e2e_ms.tolist() == pytest.approx([600.0, 300.0, 700.0])
    assert requests.tpot_ms[0] == pytest.approx(100.0) and requests.tpot_ms[2] == pytest.approx(100.0)
    assert np.isnan(requests.tpot_ms[1])                 # one output token: TPOT undefined
    assert requests.num_prompt_tokens.tolist() == [10, 20, 30]
    assert requests.num_output_tokens.tolist() == [5, 1, 3]
    steps = pd.read_parquet(imported / "repeat_0" / "steps.parquet")
    assert list(steps.columns) == list(STEP_LOG_COLUMNS) and len(steps) == 0


def test_trace_replays_the_same_arrivals_and_lengths(imported):
    trace = pd.read_parquet(imported / "trace.parquet")
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 0.6, 1.0])
    assert trace.num_prompt_tokens.tolist() == [10, 20, 30]
    assert trace.num_output_tokens.tolist() == [5, 1, 3]


def test_summary(imported):
    summary = json.loads((imported / "summary.json").read_text())
    assert summary["num_requests"] == 3 and summary["num_finished"] == 3
    assert summary["ttft_ms"]["mean"] == pytest.approx(1000.0 / 3)
    assert summary["ttft_ms"]["p50"] == pytest.approx(300.0)
    assert summary["e2e_ms"]["p90"] == pytest.approx(600.0 + 0.8 * 100.0)
    assert summary["tpot_ms"]["mean"] == pytest.approx(100.0)
    assert summary["throughput_rps"] == pytest.approx(3 / 1.7)
    assert summary["itl_ms"]["mean"] is None             # the bench records no inter-token gaps


def test_meta_holds_the_engine_definitions_and_clocks(imported):
    meta = json.loads((imported / "meta.json").read_text())
    assert meta["kind"] == "measured_run" and meta["source"] == "llmservingsim"
    assert meta["scheduler"] == "vllm"
    assert meta["scheduler_config"]["max_num_seqs"] == 8
    assert meta["scheduler_config"]["max_num_batched_tokens"] == 64
    assert meta["tensor_parallel_size"] == 2 and meta["dtype"] == "bfloat16" and meta["seed"] == 7
    assert meta["vllm_version"] == "0.19.0" and meta["engine_kwargs"] == ENGINE
    assert meta["block_size"] == 16 and meta["kv_blocks"] is None and meta["arrival_source"] == "queued_ts"
    assert meta["latency_definitions"]["ttft_ms"] == "first_token_ts - queued_ts"
    clocks = meta["clock_alignment"]
    assert clocks["epoch_minus_monotonic_s"] == pytest.approx(950.0)
    assert clocks["send_to_queued_ms"]["max"] == pytest.approx(100.0)
    assert clocks["send_to_queued_ms"]["p50"] == pytest.approx(0.0, abs=1e-6)
    assert meta["cluster_config"].endswith("run/config.json") and meta["cluster_model_name"] == "tiny/model"
    assert meta["timeseries"] == "timeseries.csv"
    assert (imported / "timeseries.csv").read_text() == TIMESERIES


def test_validate_replays_the_import(imported, tmp_path):
    out = tmp_path / "validation"
    assert main(["validate", "--measured", str(imported), "--step-model", LINEAR, "--out", str(out)]) == 0
    report = json.loads((out / "validation.json").read_text())
    assert report["num_requests"] == 3 and report["num_finished_both"] == 3
    assert report["metrics"]["ttft_ms"]["mean"]["measured"] == pytest.approx(1000.0 / 3)
    assert report["metrics"]["ttft_ms"]["mean"]["simulated"] > 0


def test_older_layout_without_a_vllm_folder(tmp_path):
    """The bench's older runs hold requests.jsonl and meta.json in RUN_DIR itself (no cluster config)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    (tmp_path / "run" / "meta.json").write_text(json.dumps(META))
    out = tmp_path / "out"
    assert main(["import", "llmservingsim", str(tmp_path / "run"), "--kv-blocks", "64", "--quiet",
                 "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["kv_blocks"] == 64 and meta["cluster_config"] is None and meta["timeseries"] is None
    assert not (out / "timeseries.csv").exists()
    requests = pd.read_parquet(out / "repeat_0" / "requests.parquet")
    assert requests.ttft_ms.tolist() == pytest.approx([200.0, 300.0, 500.0])


def test_kv_blocks_too_small_for_a_request(tmp_path, capsys):
    root = write_run(tmp_path / "run")
    assert main(["import", "llmservingsim", str(root), "--kv-blocks", "2", "--quiet",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--kv-blocks 2" in capsys.readouterr().err and not (tmp_path / "o").exists()


def _bad(line: dict) -> list[str]:
    return [json.dumps(REQUESTS[0]), json.dumps(line)]


@pytest.mark.parametrize("lines, message", [
    (lambda: [json.dumps(REQUESTS[0]), "{not json"], r"requests\.jsonl: line 2: not a JSON object"),
    (lambda: _bad(REQUESTS[1] | {"last_token_ts": 50.8}),
     r"requests\.jsonl: line 2: last_token_ts \(50\.8\) is before first_token_ts \(50\.9\)"),
    (lambda: _bad(REQUESTS[1] | {"output_toks": 0}), r"requests\.jsonl: line 2: output_toks must be an integer from 1"),
    (lambda: _bad({k: v for k, v in REQUESTS[1].items() if k != "queued_ts"}),
     r"requests\.jsonl: line 2: missing key 'queued_ts'"),
    (lambda: _bad(REQUESTS[1] | {"first_token_ts": "soon"}), r"requests\.jsonl: line 2: first_token_ts must be"),
])
def test_bad_lines_exit_2_naming_file_and_line(tmp_path, capsys, lines, message):
    root = write_run(tmp_path / "run", lines=lines())
    out = tmp_path / "out"
    assert main(["import", "llmservingsim", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err
    assert str(root / "vllm" / "requests.jsonl") in err
    assert not out.exists()


def test_missing_files_exit_2(tmp_path, capsys):
    root = write_run(tmp_path / "run")
    (root / "vllm" / "requests.jsonl").unlink()
    assert main(["import", "llmservingsim", str(root), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{root / 'vllm' / 'requests.jsonl'}: no such file" in err
    root = write_run(tmp_path / "run2")
    (root / "vllm" / "meta.json").unlink()
    assert main(["import", "llmservingsim", str(root), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "meta.json" in err
    assert not (tmp_path / "o").exists()


# LLMServingSim's validation/summary.txt rows -> our summary's metric and statistic
SUMMARY_ROW = re.compile(r"^(TTFT|TPOT|Latency) (Mean|Median|P90|P95|P99)\s+([\d.]+)\s+([\d.]+)")
METRIC = {"TTFT": "ttft_ms", "TPOT": "tpot_ms", "Latency": "e2e_ms"}
STAT = {"Mean": "mean", "Median": "p50", "P90": "p90", "P95": "p95", "P99": "p99"}


@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Qwen3-32B"])
def test_shared_runs_match_llmservingsims_measured_column(shared_data, tmp_path, model):
    run_dir = shared_data / "runs" / "llmservingsim" / "RTXPRO6000" / model
    out = tmp_path / model
    assert main(["import", "llmservingsim", str(run_dir), "--quiet", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = [SUMMARY_ROW.match(line) for line in (run_dir / "validation" / "summary.txt").read_text().splitlines()]
    rows = [m for m in rows if m]
    assert len(rows) == 15
    for m in rows:
        measured = float(m.group(3))       # the "vLLM" column, printed to 0.1 ms
        assert summary[METRIC[m.group(1)]][STAT[m.group(2)]] == pytest.approx(measured, abs=0.05), m.group(0)
    meta = json.loads((out / "meta.json").read_text())
    engine = json.loads((run_dir / "vllm" / "meta.json").read_text())["engine_kwargs"]
    assert meta["scheduler_config"]["max_num_seqs"] == engine["max_num_seqs"]
    assert meta["tensor_parallel_size"] == engine["tensor_parallel_size"]
    assert (out / "timeseries.csv").read_bytes() == (run_dir / "vllm" / "timeseries.csv").read_bytes()


def test_device_memory_derives_the_kv_cache_with_the_runs_engine(tmp_path):
    """--device-memory-gb sizes the cache as vLLM does, with the run's TP and engine limits: the same
    blocks as simulate's own sizing of that engine."""
    from stepcal.simulator.kv_cache import KvCacheSizing
    root = write_run(tmp_path / "run")
    out = tmp_path / "o"
    assert main(["import", "llmservingsim", str(root), "--model-spec", "llama-3-8b", "--device-memory-gb", "40",
                 "--quiet", "--out", str(out)]) == 0
    expected = KvCacheSizing(device_memory_gb=40, tp=ENGINE["tensor_parallel_size"], sizing="vllm",
                             max_num_batched_tokens=ENGINE["max_num_batched_tokens"],
                             max_num_seqs=ENGINE["max_num_seqs"]).num_blocks("llama-3-8b")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["kv_blocks"] == expected > 0
    weights_only = KvCacheSizing(device_memory_gb=40, tp=2).num_blocks("llama-3-8b")
    assert expected < weights_only      # vLLM's profile run takes its activations off too


def test_device_memory_needs_a_model_spec(tmp_path, capsys):
    root = write_run(tmp_path / "run")
    assert main(["import", "llmservingsim", str(root), "--device-memory-gb", "40", "--quiet",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--model-spec" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_validate_adds_vllms_host_terms_by_default(imported, tmp_path):
    """LLMServingSim's bench records vLLM servers: auto adds vLLM's published host terms to kernel tables."""
    from tests.costmodel.test_importer_llmservingsim import _bundle, _fit
    tables = tmp_path / "tables"
    assert _fit(tmp_path, _bundle(tmp_path), tables) == 0
    assert main(["validate", "--measured", str(imported), "--step-model", str(tables), "--quiet",
                 "--out", str(tmp_path / "v")]) == 0
    added = json.loads((tmp_path / "v" / "validation.json").read_text())["host_defaults"]
    assert added["engine"] == "vllm" and added["source"] == "auto"
