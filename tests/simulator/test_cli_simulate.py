import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from stepcal.core.schemas import REQUEST_LOG_COLUMNS, STEP_LOG_COLUMNS
from stepcal.experiments.cli import main
from tests.experiments.ray_cluster import ray_cluster  # noqa: F401  (a fixture)


def write_csv(path, text):
    path.write_text(text)
    return str(path)


def run_cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_writes_logs_and_summary(tmp_path, capsys):
    trace = write_csv(tmp_path / "t.csv", "arrival_s,num_prompt_tokens,num_output_tokens\n0,20,5\n0.01,300,3\n0.02,7,1\n")
    out = tmp_path / "out"
    code, stdout, _ = run_cli(["simulate", "--trace", trace, "--scheduler", "sarathi", "--chunk-size", "64",
                               "--step-model", "linear:2,0.01,0.001", "--slo-ttft-ms", "100", "--out", str(out)], capsys)
    assert code == 0 and "3/3 requests finished" in stdout and "ttft_ms" in stdout
    requests = pd.read_parquet(out / "requests.parquet")
    steps = pd.read_parquet(out / "steps.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert set(REQUEST_LOG_COLUMNS) <= set(requests.columns) and set(STEP_LOG_COLUMNS) <= set(steps.columns)
    assert summary["num_finished"] == 3 and 0 <= summary["slo_attainment"] <= 1
    for name in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms"):
        assert set(summary[name]) == {"mean", "p50", "p90", "p95", "p99"}
    assert steps["q_lens"].map(len).tolist() == steps["num_seqs"].tolist()
    assert json.loads((out / "config.json").read_text())["sim_config"]["scheduler"] == "sarathi"


BAD_TRACES = {
    "missing column": ("arrival_s,num_prompt_tokens\n0,5\n", "num_output_tokens"),
    "zero length": ("arrival_s,num_prompt_tokens,num_output_tokens\n0,5,1\n1,0,3\n", "num_prompt_tokens"),
    "negative length": ("arrival_s,num_prompt_tokens,num_output_tokens\n0,5,-2\n", "num_output_tokens"),
    "non-numeric time": ("arrival_s,num_prompt_tokens,num_output_tokens\nsoon,5,2\n", "arrival_s"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRACES))
def test_bad_trace_is_one_line_exit_2_and_no_output(tmp_path, capsys, case):
    text, column = BAD_TRACES[case]
    trace = write_csv(tmp_path / "bad.csv", text)
    out = tmp_path / "out"
    code, stdout, err = run_cli(["simulate", "--trace", trace, "--step-model", "const:5", "--out", str(out)], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("stepcal: ")
    assert "bad.csv" in err and column in err
    assert not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "bad.csv"]


@pytest.mark.parametrize("args,needle", [
    (["--scheduler", "fifo"], "--scheduler"),
    (["--step-model", "quadratic:1"], "--step-model"),
    (["--kv-blocks", "2", "--block-size", "4"], "--skip-oversize"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--device-memory-gb", "10"], "--model-spec"),
])
def test_bad_flags_are_one_line_exit_2(tmp_path, capsys, args, needle):
    trace = write_csv(tmp_path / "t.csv", "arrival_s,num_prompt_tokens,num_output_tokens\n0,20,5\n")
    base = ["simulate", "--trace", trace, "--step-model", "const:5", "--out", str(tmp_path / "out")]
    if "--step-model" in args:
        base = base[:3] + base[5:]
    code, _, err = run_cli(base + args, capsys)     # usage errors too: main returns 2, raises nothing
    assert code == 2 and needle in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_unsorted_arrivals_are_sorted_with_a_warning(tmp_path, capsys):
    trace = write_csv(tmp_path / "t.csv", "arrival_s,num_prompt_tokens,num_output_tokens\n1.0,5,2\n0.5,5,2\n")
    code, _, err = run_cli(["simulate", "--trace", trace, "--step-model", "const:5", "--quiet",
                            "--out", str(tmp_path / "out")], capsys)
    assert code == 0 and "warning" in err and "sorted" in err
    requests = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    # ids keep their rows (0 arrives at 1.0 s, 1 at 0.5 s); the later arrival is served later
    assert requests["arrival_s"].tolist() == [1.0, 0.5]
    assert requests["first_token_s"][1] < requests["first_token_s"][0]


def test_simulate_a_real_trace_and_a_generated_one(tmp_path, capsys, shared_data):
    azure = shared_data / "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv"
    code, stdout, _ = run_cli(["simulate", "--trace", str(azure), "--num-requests", "500", "--scheduler", "vllm",
                               "--step-model", "linear:8,0.03,0.0002", "--out", str(tmp_path / "a")], capsys)
    assert code == 0 and "500/500" in stdout
    code, stdout, _ = run_cli(["simulate", "--trace", "poisson:rate=4,n=200,prompt=lognormal:300:0.8,output=uniform:4:64",
                               "--model-spec", "llama-3-8b", "--device-memory-gb", "80", "--scheduler", "continuous",
                               "--step-model", "const:20", "--replicas", "2", "--router", "least-tokens",
                               "--out", str(tmp_path / "b")], capsys)
    assert code == 0 and "200/200" in stdout
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["kv_blocks"] > 1000 and summary["num_replicas"] == 2


def test_imports_stay_light():
    # `import stepcal.simulator` loads neither torch, sklearn nor mlflow; `import stepcal.costmodel` no torch;
    # building the CLI parser (what `stepcal --help` does) loads none of them, nor numpy.
    code = (
        "import sys, stepcal.simulator, stepcal.simulator.simulation, stepcal.core.workload\n"
        "import stepcal.experiments.cli as c\n"
        "c.build_parser()\n"
        "heavy = [m for m in ('torch', 'sklearn', 'mlflow', 'optuna') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "import stepcal.costmodel\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    code = "import sys, stepcal.experiments.cli as c; c.build_parser(); assert 'numpy' not in sys.modules, 'numpy'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_simulate_reuses_prefixes_and_times_out_from_the_command_line(tmp_path, capsys):
    # two requests sharing 64 tokens, one second apart; a third that cannot finish in 50 ms
    trace = write_csv(tmp_path / "p.csv", "arrival_s,num_prompt_tokens,num_output_tokens,prefix_hash_ids\n"
                                          "0,70,2,1 2 3 4 5\n1,70,2,1 2 3 4 6\n2,16,100,\n")
    runs = {}
    for caching in ("on", "off"):
        out = tmp_path / caching
        code, stdout, _ = run_cli(["simulate", "--trace", trace, "--step-model", "const:2", "--prefix-caching",
                                   caching, "--timeout-s", "0.05", "--out", str(out)], capsys)
        assert code == 0 and "1 requests timed out" in stdout
        assert ("prefix cache: 41.0% of prompt tokens reused" in stdout) == (caching == "on")
        runs[caching] = (json.loads((out / "summary.json").read_text()), pd.read_parquet(out / "requests.parquet"))
    summary, requests = runs["on"]
    assert requests["num_cached_tokens"].tolist() == [0, 64, 0]
    assert summary["prefix_hit_rate"] == pytest.approx(64 / 156) and summary["num_timeouts"] == 1
    assert runs["off"][0]["prefix_hit_rate"] is None and runs["off"][1]["num_cached_tokens"].sum() == 0


def test_simulate_ranges_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "r"
    code, stdout, _ = run_cli(["simulate", "--trace", "poisson:rate=20,n=40,prompt=uniform:20:200,output=uniform:5:50",
                               "--step-model", "linear:3,0.01,0.0005", "--ranges", "5", "--scatter-cv", "0.1",
                               "--scatter-rho", "0.5", "--out", str(out)], capsys)
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    ranges = summary["ranges"]
    assert ranges["num_replications"] == 5 and ranges["drawn_terms"] == [] and ranges["scatter_cv"] == 0.1
    cell = ranges["stats"]["tpot_ms"]["p50"]
    assert cell["low"] < cell["median"] < cell["high"]
    assert "ranges (5 replications" in stdout


RANGES_RUN = ["simulate", "--trace", "poisson:rate=20,n=40,prompt=uniform:20:200,output=uniform:5:50",
              "--step-model", "linear:3,0.01,0.0005", "--ranges", "4", "--scatter-cv", "0.1", "--scatter-rho", "0.5"]


def test_simulate_ranges_store_each_replications_quantiles_and_show_progress(tmp_path, capsys):
    code, _, err = run_cli([*RANGES_RUN, "--out", str(tmp_path / "r")], capsys)
    assert code == 0 and "replications" in err    # the bar over replications, on stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    ranges = summary["ranges"]
    assert ranges["replica_quantiles_file"] == "ranges_percentiles.parquet" and ranges["backend"] == "local"
    table = pd.read_parquet(tmp_path / "r" / "ranges_percentiles.parquet")
    assert sorted(table["replication"].unique()) == [0, 1, 2, 3] and set(table["metric"]) == {"ttft_ms", "tpot_ms", "e2e_ms"}
    # each replication's P99 TTFT is its 0.99 quantile; the block's median is the median of those
    p99 = table[(table["metric"] == "ttft_ms") & (table["quantile"] == 0.99)]["value_ms"]
    assert ranges["stats"]["ttft_ms"]["p99"]["median"] == pytest.approx(p99.median())
    code, _, err = run_cli([*RANGES_RUN, "--quiet", "--out", str(tmp_path / "q")], capsys)
    assert code == 0 and err == ""


@pytest.mark.slow   # a local Ray cluster
def test_simulate_ranges_on_ray_equal_the_local_pool(tmp_path, capsys, ray_cluster):  # noqa: F811
    stats = {}
    for backend in ("local", "ray"):
        code, _, _ = run_cli([*RANGES_RUN, "--backend", backend, "--workers", "2", "--quiet",
                              "--out", str(tmp_path / backend)], capsys)
        assert code == 0
        stats[backend] = json.loads((tmp_path / backend / "summary.json").read_text())["ranges"]["stats"]
        stats[backend + " quantiles"] = pd.read_parquet(tmp_path / backend / "ranges_percentiles.parquet")
    assert stats["ray"] == stats["local"]
    pd.testing.assert_frame_equal(stats["ray quantiles"], stats["local quantiles"])


def test_a_ray_address_without_the_ray_backend_is_one_line_exit_2(tmp_path, capsys):
    code, _, err = run_cli([*RANGES_RUN, "--ray-address", "auto", "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and err == "stepcal: --ray-address needs --backend ray\n" and not (tmp_path / "x").exists()


@pytest.mark.parametrize("flag, value", [("--scatter-rho", "1"), ("--scatter-cv", "-0.1"), ("--ranges", "-1")])
def test_bad_range_flags_are_one_line_exit_2(tmp_path, capsys, flag, value):
    code, _, err = run_cli(["simulate", "--trace", "poisson:rate=1,n=2,prompt=fixed:5,output=fixed:5",
                            "--step-model", "const:1", flag, value, "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and err.count("\n") == 1 and f"argument {flag}" in err


def test_the_cli_keeps_numpy_and_arrow_off_huge_pages_unless_told(monkeypatch):
    from stepcal.experiments.cli import avoid_huge_page_stalls
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "mimalloc")
    avoid_huge_page_stalls()
    assert os.environ["NUMPY_MADVISE_HUGEPAGE"] == "0"
    assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "mimalloc"   # the user's choice stands
