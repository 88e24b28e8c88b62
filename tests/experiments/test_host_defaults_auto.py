"""--host-defaults auto, the default: the vllm scheduler gets vLLM's published terms on kernel tables."""
import json
import shutil
from pathlib import Path

import pytest

from stepcal.experiments.cli import main
from stepcal.experiments.commands.flags import SCHEDULER_NAMES
from stepcal.experiments.host_defaults import ENGINE_NAMES, SCHEDULER_ENGINES, TERM_WORDS, host_defaults
from stepcal.simulator.step_model import HostTerms
from tests.costmodel.conftest import make_profile

TRACE = "poisson:rate=20,n=60,prompt=uniform:32:256,output=uniform:4:32,seed=1"
# summary.json's record of vLLM's terms added by default: every engine term by name
VLLM_TERMS = {"engine": "vllm", "source": "auto",
              "terms": {k: v for k, v in host_defaults("vllm").to_dict().items() if k in HostTerms.engine_names()}}


@pytest.fixture(scope="module")
def kernel_tables(tmp_path_factory) -> Path:
    """T_step tables composed from a synthetic kernel profile (GEMMs and attention): kernels only."""
    root = tmp_path_factory.mktemp("kernel_tables")
    make_profile().to_parquet(root / "profile.parquet", index=False)
    assert main(["fit", "--profile", str(root / "profile.parquet"), "--model-spec", "tiny", "--regressor", "rf",
                 "--no-mlflow", "--out", str(root / "tables")]) == 0
    return root / "tables"


def _calibrated_copy(tables: Path, path: Path) -> Path:
    """The tables with calibrated host terms in meta.json, as `stepcal calibrate` writes them."""
    shutil.copytree(tables, path)
    meta = json.loads((path / "meta.json").read_text())
    meta["host_terms"] = {"per_step_ms": 0.5, "per_request_ms": 3.0}
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def _simulate(tmp_path, name: str, step_model, *flags: str, quiet: bool = True) -> dict:
    out = tmp_path / name
    assert main(["simulate", "--trace", TRACE, "--step-model", str(step_model), *flags,
                 *(["--quiet"] if quiet else []), "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text())


def test_every_scheduler_engine_is_a_scheduler_and_an_engine_of_the_data_file():
    assert set(SCHEDULER_ENGINES) <= set(SCHEDULER_NAMES) and set(SCHEDULER_ENGINES.values()) <= set(ENGINE_NAMES)
    assert set(TERM_WORDS) == HostTerms.engine_names()


def test_the_vllm_scheduler_adds_vllms_terms_to_kernel_tables_and_says_so(kernel_tables, tmp_path, capsys):
    auto = _simulate(tmp_path, "auto", kernel_tables, quiet=False)
    printed = capsys.readouterr().out
    assert auto["host_defaults"] == VLLM_TERMS
    line = ("host terms: vllm published defaults (auto): 0.012 ms per sequence per step, 13.5 ms per request "
            "(median), 0.0028 ms per prompt token")
    assert line in printed.splitlines()
    config = json.loads((tmp_path / "auto" / "config.json").read_text())
    assert config["sim_config"]["front_end"]["median_ms"] == 13.5 and "host terms" in auto["step_model"]
    # the same terms as the flag names them: the same run, recorded as the flag's
    flag = _simulate(tmp_path, "flag", kernel_tables, "--host-defaults", "vllm")
    assert flag["host_defaults"] == {**VLLM_TERMS, "source": "flag"}
    assert flag["ttft_ms"] == auto["ttft_ms"] and flag["tpot_ms"] == auto["tpot_ms"]
    # none: the kernel tables alone, recorded as null and not printed
    none = _simulate(tmp_path, "none", kernel_tables, "--host-defaults", "none", quiet=False)
    assert none["host_defaults"] is None and "host terms:" not in capsys.readouterr().out
    assert auto["ttft_ms"]["p50"] > none["ttft_ms"]["p50"] + 13.5 and auto["tpot_ms"]["p50"] > none["tpot_ms"]["p50"]


@pytest.mark.parametrize("flags", [["--scheduler", "sarathi"], ["--scheduler", "continuous"]])
def test_schedulers_of_no_engine_get_nothing_by_default(kernel_tables, tmp_path, flags):
    assert _simulate(tmp_path, "s", kernel_tables, *flags)["host_defaults"] is None


@pytest.mark.parametrize("step_model", ["const:5", "linear:5,0.01,0.0002"])
def test_synthetic_models_get_nothing_by_default(tmp_path, step_model):
    summary = _simulate(tmp_path, "s", step_model, "--scheduler", "vllm")
    assert summary["host_defaults"] is None and "host terms" not in summary["step_model"]


def test_tables_with_calibrated_host_terms_keep_theirs_by_default_and_refuse_the_flag(kernel_tables, tmp_path, capsys):
    calibrated = _calibrated_copy(kernel_tables, tmp_path / "cal")
    summary = _simulate(tmp_path, "auto", calibrated)
    assert summary["host_defaults"] is None
    config = json.loads((tmp_path / "auto" / "config.json").read_text())
    assert config["sim_config"]["front_end"]["median_ms"] == 3.0          # the calibrated request path, alone
    code = main(["simulate", "--trace", TRACE, "--step-model", str(calibrated), "--host-defaults", "vllm",
                 "--quiet", "--out", str(tmp_path / "flag")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "already has calibrated host terms" in err


def test_tables_with_a_profiled_host_term_get_nothing_by_default(tmp_path):
    from tests.costmodel.test_host_term import _profile
    tables = tmp_path / "tables"
    assert main(["fit", "--profile", str(_profile(tmp_path)), "--ops", "step,host", "--model-spec", "tiny",
                 "--regressor", "rf", "--no-mlflow", "--out", str(tables)]) == 0
    assert "host" in json.loads((tables / "meta.json").read_text())["t_step_terms"]
    assert _simulate(tmp_path, "s", tables)["host_defaults"] is None


def test_capacity_records_the_terms_and_decides_for_both_pools_at_once(kernel_tables, tmp_path):
    base = ["capacity", "--trace", TRACE, "--slo-ttft-ms", "300", "--slo-tpot-ms", "40", "--tolerance", "0.2",
            "--quiet"]
    assert main([*base, "--step-model", str(kernel_tables), "--out", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c" / "capacity.json").read_text())["host_defaults"] == VLLM_TERMS
    # a calibrated decode pool: auto adds nothing to either pool, rather than two request paths
    decode = _calibrated_copy(kernel_tables, tmp_path / "cal")
    assert main([*base, "--step-model", str(kernel_tables), "--decode-step-model", str(decode),
                 "--disaggregated", "1:1", "--model-spec", "tiny", "--out", str(tmp_path / "d")]) == 0
    record = json.loads((tmp_path / "d" / "capacity.json").read_text())
    assert record["host_defaults"] is None and "host terms" not in record["disaggregated"]["prefill_step_model"]


def test_validate_adds_them_for_a_vllm_bench_run_only(kernel_tables, tmp_path):
    """An imported `vllm bench` run was served by vLLM; a `stepcal measure` run, under the same
    scheduler, by the torch engine, whose host time is not vLLM's."""
    from stepcal.simulator.step_model import HostTermsModel, LinearStepModel
    from tests.experiments.test_vllm_bench_end_to_end import bench_from_simulation
    bench, served = tmp_path / "bench.json", tmp_path / "served"
    bench_from_simulation(bench, HostTermsModel(LinearStepModel(3.0, 0.01, 0.0002), HostTerms(per_request_ms=10.0)))
    assert main(["import", "vllm-bench", str(bench), "--model-spec", "tiny", "--scheduler", "vllm",
                 "--kv-blocks", "2048", "--quiet", "--out", str(served)]) == 0
    torch = tmp_path / "torch"
    assert main(["measure", "--trace", "poisson:rate=30,n=20,prompt=uniform:8:60,output=uniform:2:12",
                 "--scheduler", "vllm", "--quiet", "--out", str(torch)]) == 0
    for run, expected in ((served, VLLM_TERMS), (torch, None)):
        out = tmp_path / f"v_{run.name}"
        assert main(["validate", "--measured", str(run), "--step-model", str(kernel_tables), "--quiet",
                     "--out", str(out)]) == 0
        assert json.loads((out / "validation.json").read_text())["host_defaults"] == expected, run.name
        assert ("host terms: vllm published defaults (auto)" in (out / "validation.md").read_text()) == bool(expected)


@pytest.mark.parametrize("command", ["simulate", "validate", "capacity"])
def test_help_says_what_the_default_does(command, capsys):
    import re
    assert main([command, "--help"]) == 0
    shown = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "Default auto:" in shown and "none: add nothing" in shown and "auto, none, vllm" in shown
