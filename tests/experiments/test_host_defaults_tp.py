"""--host-defaults at --tp > 1: what a multi-GPU instance adds to an engine's published host terms."""
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from stepcal.core.errors import InputError
from stepcal.experiments import host_defaults as hd
from stepcal.experiments.cli import main
from stepcal.experiments.host_defaults import DEFAULTS_PATH, host_defaults, read_serving_defaults
from stepcal.experiments.host_defaults_tp import TP_BLOCK, deployment_tp
from tests.conftest import SHARED_DATA

TRACE = "poisson:rate=20,n=200,prompt=uniform:256:1024,output=uniform:8:64"
H100_GEMMS = SHARED_DATA / "profiles/aiconfigurator/h100_sxm/gemm/vllm/0.14.0/gemm_perf.parquet"
AZURE_CONV = SHARED_DATA / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def _tp_values(engine: str) -> dict:
    return {name: t["value"] for name, t in read_serving_defaults()["engines"][engine][TP_BLOCK]["terms"].items()}


@pytest.mark.parametrize("engine", hd.ENGINE_NAMES)
def test_at_tp_1_every_engine_keeps_its_own_terms(engine):
    own = {name: t["value"] for name, t in read_serving_defaults()["engines"][engine]["terms"].items()}
    assert host_defaults(engine, tp=1).to_dict() == {**own, "base_scale": 1.0}


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_vllm_adds_its_executor_terms_above_one_gpu(tp):
    one, many, added = host_defaults("vllm"), host_defaults("vllm", tp=tp), _tp_values("vllm")
    assert added["per_step_ms"] > 0 and added["per_prompt_token_ms"] > 0    # the executor's queue, the token ids
    for name, value in added.items():
        expected = getattr(one, name) if name == "per_request_sigma" else getattr(one, name) + value
        assert getattr(many, name) == pytest.approx(expected), name
    assert many == host_defaults("vllm", tp=2)           # one queue whatever the worker count


def test_engines_that_hide_or_lack_the_executor_add_nothing():
    assert not any(_tp_values("vllm-async").values())        # overlapped with the GPU step
    for engine in ("vllm-async", "sglang", "sglang-no-overlap"):
        assert host_defaults(engine, tp=8) == host_defaults(engine)


def _broken(change) -> dict:
    data = json.loads(DEFAULTS_PATH.read_text())
    change(data["engines"]["vllm"][TP_BLOCK])
    return data


@pytest.mark.parametrize("change, needle", [
    (lambda b: b["terms"]["per_step_ms"].update(sources=[]), "tensor_parallel.terms.per_step_ms: the value 0.05 cites no source"),
    (lambda b: b["terms"]["per_request_sigma"].update(value=0.3, sources=["vllm-pr-9856"]), "a spread is not added"),
    (lambda b: b["terms"].pop("per_token_ms"), "must have a description and terms"),
    (lambda b: b["terms"]["per_seq_ms"].update(how_derived="none"), "left 0"),
])
def test_a_tp_term_without_its_source_is_refused(change, needle, tmp_path):
    path = tmp_path / "serving_defaults.json"
    path.write_text(json.dumps(_broken(change)))
    with pytest.raises(InputError, match=needle):
        host_defaults("vllm", path, tp=2)


def _tables(tp):
    return SimpleNamespace(meta=SimpleNamespace(tp=tp))


def test_the_tp_is_the_flags_else_the_tables_and_two_are_refused():
    assert deployment_tp(1, [_tables(None)]) == 1 and deployment_tp(4, [object()]) == 4
    assert deployment_tp(1, [_tables(4)]) == 4 and deployment_tp(4, [_tables(4)]) == 4
    with pytest.raises(InputError, match="--tp 2: the --step-model tables were fitted at --tp 4"):
        deployment_tp(2, [_tables(4)])


def test_a_step_model_fitted_at_tp_4_gets_the_tp_4_terms(monkeypatch):
    from stepcal.experiments import step_models
    monkeypatch.setattr(step_models, "_resolve", lambda spec: _tables(4))
    assert step_models.resolve_step_model("tables", "vllm").terms == host_defaults("vllm", tp=4)
    (model,), added = step_models.resolve_step_models(["tables"], "vllm", "vllm")
    assert added.tp == 4 and model.terms == host_defaults("vllm", tp=4)
    assert step_models.resolve_step_model("tables", None).meta.tp == 4    # no engine: the tables as they are


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_simulate_at_tp_2_pays_the_executor_and_says_so(tmp_path, capsys):
    base = ["simulate", "--trace", TRACE, "--step-model", "const:5", "--host-defaults", "vllm"]
    assert main([*base, "--quiet", "--out", str(tmp_path / "tp1")]) == 0
    assert main([*base, "--tp", "2", "--out", str(tmp_path / "tp2")]) == 0
    assert "(flag, TP 2): 0.05 ms per step" in capsys.readouterr().out
    one, two, added = _summary(tmp_path / "tp1"), _summary(tmp_path / "tp2"), _tp_values("vllm")
    assert "tp" not in one["host_defaults"] and two["host_defaults"]["tp"] == 2
    # every step pays the queue's round trip on top of vLLM's per-sequence time
    own = host_defaults("vllm")
    for run, per_step_ms in (("tp1", 0.0), ("tp2", added["per_step_ms"])):
        steps = pd.read_parquet(tmp_path / run / "steps.parquet")
        expected = 5.0 + per_step_ms + own.per_seq_ms * steps["num_seqs"]
        assert steps["duration_ms"].to_numpy() == pytest.approx(expected.to_numpy()), run
    # and each request's path its prompt's token ids
    front_ends = [json.loads((tmp_path / run / "config.json").read_text())["sim_config"]["front_end"]
                  for run in ("tp1", "tp2")]
    assert front_ends[1]["per_prompt_token_ms"] == pytest.approx(
        front_ends[0]["per_prompt_token_ms"] + added["per_prompt_token_ms"])


@pytest.fixture(scope="module")
def h100_tables(tmp_path_factory) -> Path:
    """Kernel-only T_step tables from AIConfigurator's H100 GEMMs (the shared data), at TP 1."""
    if not H100_GEMMS.is_file() or not AZURE_CONV.is_file():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    out = tmp_path_factory.mktemp("h100") / "tables"
    assert main(["fit", "--profile", str(H100_GEMMS), "--model-spec", "llama-3-8b", "--no-mlflow",
                 "--out", str(out)]) == 0
    return out


def test_tp_1_predictions_are_byte_identical_on_the_shared_h100_tables(h100_tables, tmp_path, monkeypatch):
    """At TP 1 the run is the run without any TP term (the engine's terms alone, as before they
    existed): the same request and step logs, byte for byte; at TP 2 they move."""
    argv = ["simulate", "--trace", str(AZURE_CONV), "--num-requests", "200", "--scheduler", "vllm",
            "--step-model", str(h100_tables), "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "tp1")]) == 0
    assert main([*argv, "--tp", "2", "--out", str(tmp_path / "tp2")]) == 0
    monkeypatch.setattr(hd, "with_tp_terms", lambda values, terms, tp: values)
    assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
    for name in ("requests.parquet", "steps.parquet"):
        assert (tmp_path / "tp1" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
    assert _summary(tmp_path / "tp1")["host_defaults"] == _summary(tmp_path / "plain")["host_defaults"]
    assert _summary(tmp_path / "tp2")["host_defaults"]["tp"] == 2
    assert (tmp_path / "tp2" / "steps.parquet").read_bytes() != (tmp_path / "tp1" / "steps.parquet").read_bytes()
