"""Bad numbers, sizes and names, table-driven: every case is one stderr line, exit 2, no traceback,
nothing written, before any real work. Output paths: tests/experiments/test_output_paths.py;
broken directories of ours: tests/test_bad_directories.py."""
import json
import time
from pathlib import Path

import pytest

from stepcal.core.model_spec import PRESETS
from stepcal.experiments.cli import main

DATA = Path(__file__).parent / "data"
GEN = "poisson:rate=5,n=20,prompt=fixed:16,output=fixed:4"
SIM = ["simulate", "--trace", GEN, "--step-model", "const:5"]
CAP = ["capacity", "--trace", GEN, "--step-model", "const:5", "--slo-ttft-ms", "500"]
MEASURE = ["measure", "--trace", "poisson:rate=5,n=3,prompt=fixed:8,output=fixed:2"]


def _trace(tmp_path, rows: str, header: str = "arrival_s,num_prompt_tokens,num_output_tokens") -> str:
    path = tmp_path / "t.csv"
    path.write_text(f"{header}\n{rows}\n")
    return str(path)


def _bench(tmp_path, **changes) -> str:
    data = json.loads((DATA / "vllm_bench_tiny.json").read_text())
    for key, (index, value) in changes.items():
        data[key][index] = value
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data).replace("NaN", "NaN"))
    return str(path)


CASES = {
    # numbers on the command line, refused when parsed
    "seed -1": (SIM + ["--seed", "-1"], "--seed: the seed must be a whole number from 0"),
    "replicas 1e18": (SIM + ["--replicas", "1000000000000000000"], "--replicas: the value must be a whole number from 1 to 10,000"),
    "replicas 0": (SIM + ["--replicas", "0"], "--replicas"),
    "step overhead negative": (SIM + ["--step-overhead-ms", "-1"], "--step-overhead-ms: the value must be a finite number >= 0"),
    "step overhead nan": (SIM + ["--step-overhead-ms", "nan"], "--step-overhead-ms"),
    "slo ttft zero": (SIM + ["--slo-ttft-ms", "0"], "--slo-ttft-ms: the value must be a finite number > 0"),
    "slo tpot negative": (SIM + ["--slo-tpot-ms", "-5"], "--slo-tpot-ms"),
    "slo inf": (SIM + ["--slo-tpot-ms", "inf"], "--slo-tpot-ms"),
    "rate nan": (SIM + ["--rate", "nan"], "--rate: the rate must be a finite number > 0"),
    "num requests 1e18": (SIM + ["--num-requests", "1000000000000000000"], "--num-requests"),
    "duration negative": (SIM + ["--duration", "-3"], "--duration"),
    "max num seqs 0": (SIM + ["--max-num-seqs", "0"], "--max-num-seqs"),
    "chunk size 2.5": (SIM + ["--chunk-size", "2.5"], "--chunk-size"),
    "block size 1e9": (SIM + ["--block-size", "1000000000"], "--block-size"),
    "kv blocks -4": (SIM + ["--kv-blocks", "-4"], "--kv-blocks"),
    "memory nan": (SIM + ["--device-memory-gb", "nan"], "--device-memory-gb"),
    "utilization 1.5": (SIM + ["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: the value must be a finite number > 0 and <= 1"),
    "tp 0": (SIM + ["--tp", "0"], "--tp"),
    "ep does not divide tp": (SIM + ["--tp", "2", "--ep", "4", "--model-spec", "mixtral-8x7b", "--device-memory-gb", "80"],
                              "--ep (4) must divide --tp (2)"),
    "capacity rate max nan": (CAP + ["--rate-max", "nan"], "--rate-max"),
    "capacity attainment 0": (CAP + ["--attainment", "0"], "--attainment"),
    "capacity tolerance 2": (CAP + ["--tolerance", "2"], "--tolerance"),
    "capacity slo negative": (["capacity", "--trace", GEN, "--step-model", "const:5", "--slo-ttft-ms", "-1"], "--slo-ttft-ms"),
    "capacity link gbps 0": (CAP + ["--kv-transfer-gbps", "0"], "--kv-transfer-gbps"),
    "calibrate max simulations 0": (["calibrate", "--measured", "x", "--step-model", "const:1", "--max-simulations", "0"],
                                    "--max-simulations"),
    "fit trials 0": (["fit", "--profile", "x.csv", "--trials", "0"], "--trials"),
    "fit ep link nan": (["fit", "--profile", "x.csv", "--ep-link-gbps", "nan"], "--ep-link-gbps"),
    "measure device tpu": (MEASURE + ["--device", "tpu"], "--device: unknown device 'tpu'; use cpu, cuda or cuda:N"),
    "measure repeats 0": (MEASURE + ["--repeats", "0"], "--repeats"),
    "measure threads 0": (MEASURE + ["--threads", "0"], "--threads"),
    "profile device cuda:x": (["profile", "--model-spec", "tiny", "--device", "cuda:x"], "--device"),
    "quickstart scheduler fifo": (["quickstart", "--schedulers", "fifo"], "--schedulers: unknown fifo; choose from static"),
    "quickstart device tpu": (["quickstart", "--device", "tpu"], "--device"),
    "sweep workers 0": (["sweep", "cfg.json", "--workers", "0"], "--workers"),
    "trace generate seed -2": (["trace", "generate", GEN, "--seed", "-2"], "--seed"),
    # step models
    "step model const nan": (["simulate", "--trace", GEN, "--step-model", "const:nan"], "values must be finite numbers"),
    "step model const inf": (["simulate", "--trace", GEN, "--step-model", "const:inf"], "values must be finite numbers"),
    "step model linear nan": (["simulate", "--trace", GEN, "--step-model", "linear:nan,0,0"], "values must be finite numbers"),
    # generator specs: sizes bounded before numpy allocates anything
    "generator n 1e18": (["simulate", "--trace", "poisson:rate=5,n=1000000000000000000,prompt=fixed:8,output=fixed:2",
                          "--step-model", "const:5"], "must be a positive integer up to 50,000,000"),
    "generator prompt 1e18": (["simulate", "--trace", "poisson:rate=5,n=5,prompt=fixed:1000000000000000000,output=fixed:2",
                               "--step-model", "const:5"], "up to 10,000,000"),
    "generator rate x duration": (["simulate", "--trace", "poisson:rate=100000,duration=100000000,prompt=fixed:8,output=fixed:2",
                                   "--step-model", "const:5"], "rate x duration asks for"),
    "generator seed -1": (["simulate", "--trace", "poisson:rate=5,n=5,prompt=fixed:8,output=fixed:2,seed=-1",
                           "--step-model", "const:5"], "seed=-1"),
    # model specs
    "model spec bool": ("spec:" + json.dumps({**PRESETS["tiny"].to_dict(), "num_layers": True}),
                        "num_layers must be a positive integer, got True"),
    "model spec missing": ("spec:{\"num_layers\": 2}", "model spec has missing keys ['ffn_size'"),
    "model spec list": ("spec:[1, 2]", "got a list"),
    "model spec hf unknown": ("spec:{\"architectures\": [\"GPT2LMHeadModel\"]}", "GPT2LMHeadModel is not supported"),
}
TRACE_CASES = {
    "column twice": ("0,10,4,4", "column 'num_output_tokens' appears 2 times in the header",
                     "arrival_s,num_prompt_tokens,num_output_tokens,num_output_tokens"),
    "slo negative": ("0,10,4,-5", "'slo_ttft_ms' must be positive (or empty for none), got -5",
                     "arrival_s,num_prompt_tokens,num_output_tokens,slo_ttft_ms"),
    "slo zero": ("0,10,4,0", "'slo_tpot_ms' must be positive", "arrival_s,num_prompt_tokens,num_output_tokens,slo_tpot_ms"),
    "output 1e18 tokens": ("0,10,1000000000000000000", "'num_output_tokens' must be at most 10,000,000 tokens"),
    "prompt 1e19 tokens": ("0,10000000000000000000,4", "num_prompt_tokens"),
    "arrival 1e18 s": ("1000000000000000000,10,4", "'arrival_s' must be at most"),
    "arrival nan": ("nan,10,4", "'arrival_s' is missing"),
    "prompt 2.5": ("0,2.5,4", "must be a whole number"),
}
BENCH_CASES = {
    "bench kv smaller than a request": ({}, "--kv-blocks 1 x --block-size 4 holds 4 tokens, fewer than the largest request"),
    "bench output nan": ({"output_lens": (0, float("nan"))}, "'output_lens'[0] must be an integer from 0"),
    "bench input 1e19": ({"input_lens": (1, 1e19)}, "'input_lens'[1] must be an integer from 1 to 10,000,000"),
}


def _run(argv, capsys, tmp_path):
    out = tmp_path / "out"
    before = set(tmp_path.iterdir())
    started = time.process_time()   # CPU time: a job that ran first shows, another process's load does not
    code = main([*argv, "--out", str(out)] if argv[0] != "trace" else [*argv, "--out", str(tmp_path / "o.csv")])
    elapsed = time.process_time() - started
    captured = capsys.readouterr()
    return code, captured.err, elapsed, set(tmp_path.iterdir()) - before


def _assert_one_clear_line(code, err, elapsed, new_files, needle):
    assert code == 2, err
    assert err.startswith("stepcal") and err.count("\n") == 1 and "Traceback" not in err, err
    assert needle in err, err
    assert "np.float" not in err and "np.int" not in err, err      # values as a person writes them
    assert not new_files, new_files
    assert elapsed < 5, elapsed


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_flags_and_values(name, tmp_path, capsys):
    argv, needle = CASES[name]
    if isinstance(argv, str):                  # a model spec file with this JSON
        spec = tmp_path / "spec.json"
        spec.write_text(argv.split(":", 1)[1])
        argv = SIM + ["--model-spec", str(spec), "--device-memory-gb", "80"]
        before = {spec}
    else:
        before = set()
    code, err, elapsed, new = _run(argv, capsys, tmp_path)
    _assert_one_clear_line(code, err, elapsed, new - before, needle)


@pytest.mark.parametrize("name", sorted(TRACE_CASES))
def test_bad_trace_rows(name, tmp_path, capsys):
    row, needle, *header = TRACE_CASES[name]
    trace = _trace(tmp_path, row, *header)
    code, err, elapsed, new = _run(["simulate", "--trace", trace, "--step-model", "const:5"], capsys, tmp_path)
    _assert_one_clear_line(code, err, elapsed, new, needle)
    assert "t.csv" in err


@pytest.mark.parametrize("name", sorted(BENCH_CASES))
def test_bad_vllm_bench_files(name, tmp_path, capsys):
    changes, needle = BENCH_CASES[name]
    bench = _bench(tmp_path, **changes)
    flags = ["--kv-blocks", "1", "--block-size", "4"] if "kv" in name else []
    code, err, elapsed, new = _run(["import", "vllm-bench", bench, "--model-spec", "tiny", *flags], capsys, tmp_path)
    _assert_one_clear_line(code, err, elapsed, new, needle)


def test_sparse_inter_token_gaps_are_a_warning(tmp_path, capsys):
    data = json.loads((DATA / "vllm_bench_tiny.json").read_text())
    data["output_lens"][0] = 300                  # 300 tokens, 3 gaps: TPOT would come out 0.04 ms
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    assert main(["import", "vllm-bench", str(path), "--model-spec", "tiny", "--quiet", "--out", str(tmp_path / "o")]) == 0
    assert "fewer than half as many inter-token gaps as output tokens (e.g. index 0: 3 gaps for 300 tokens)" \
        in capsys.readouterr().err


def test_report_does_not_create_an_mlflow_store_to_look_for_a_run(tmp_path):
    from stepcal.core.errors import InputError
    from stepcal.experiments.report.build import mlflow_client
    store = tmp_path / "new.db"
    with pytest.raises(InputError, match=f"--tracking-uri sqlite:///{store}: no MLflow store at {store}"):
        mlflow_client("abc", f"sqlite:///{store}")
    assert not store.exists()


def test_a_list_valued_parquet_cell_is_shown_whole(tmp_path, capsys):
    import pandas as pd
    path = tmp_path / "t.parquet"
    pd.DataFrame({"arrival_s": [0.0, 1.0], "num_prompt_tokens": [[5, 6], [7]], "num_output_tokens": [3, 4]}).to_parquet(path)
    code, err, _, new = _run(["simulate", "--trace", str(path), "--step-model", "const:5"], capsys, tmp_path)
    assert code == 2 and err.count("\n") == 1 and not new
    assert "column 'num_prompt_tokens' is not a number, got [5, 6]" in err


@pytest.mark.parametrize("column, value, needle", [
    ("time_ms", "nan", "column 'time_ms' must be a finite positive time in ms, got nan"),
    ("m", "-4", "column 'm' must be a positive number, got -4"),
])
def test_bad_profile_cells_show_plain_values(tmp_path, capsys, column, value, needle):
    row = {"op": "gemm", "time_ms": "0.5", "m": "4", "n": "8", "k": "8", column: value}
    profile = tmp_path / "p.csv"
    profile.write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    code, err, elapsed, new = _run(["fit", "--profile", str(profile), "--no-mlflow"], capsys, tmp_path)
    _assert_one_clear_line(code, err, elapsed, new - {profile}, needle)
