"""--host-defaults: an engine's published host-time and front-end terms (experiments/data/serving_defaults.json)."""
import json
from pathlib import Path

import pytest

from stepcal.experiments.cli import main
from stepcal.experiments.host_defaults import DEFAULTS_PATH, ENGINE_NAMES, host_defaults, read_serving_defaults
from stepcal.simulator.step_model import HostTerms

TRACE = "poisson:rate=20,n=200,prompt=uniform:256:1024,output=uniform:8:64"


def test_every_default_names_its_source_where_in_it_and_how_it_was_derived():
    data = read_serving_defaults()
    assert tuple(data["engines"]) == ENGINE_NAMES
    sources = data["sources"]
    for source in sources.values():
        assert source["url"].startswith("https://") and source["where"] and source["measured"] and source["figures"]
    for engine, entry in data["engines"].items():
        assert set(entry["terms"]) == HostTerms.engine_names() == set(HostTerms().to_dict()) - {"base_scale"}, engine
        for name, term in entry["terms"].items():
            assert "\n" not in term["how_derived"] and term["notes"], (engine, name)
            assert all(s in sources for s in term["sources"]), (engine, name)
            if term["value"] != 0:       # a number needs a measurement behind it
                assert term["sources"], (engine, name)
            else:                        # a zero says why it is zero
                assert term["how_derived"].startswith("left 0"), (engine, name)
        assert host_defaults(engine) == HostTerms.from_dict({k: t["value"] for k, t in entry["terms"].items()})


def _broken(change) -> dict:
    data = json.loads(DEFAULTS_PATH.read_text())
    change(data)
    return data


@pytest.mark.parametrize("change, needle", [
    (lambda d: d["engines"]["vllm"]["terms"]["per_seq_ms"].update(sources=[]), "per_seq_ms: the value 0.012 cites no source"),
    (lambda d: d["sources"]["vllm-pr-51281"].pop("where"), "sources.vllm-pr-51281: missing where"),
    (lambda d: d["engines"]["vllm-async"]["terms"]["per_seq_ms"].update(how_derived="160 us\n/ 256"), "one line"),
    (lambda d: d["engines"]["vllm"]["terms"]["per_stream_ms"].update(how_derived="nothing"), "left 0"),
    (lambda d: d["engines"]["vllm"]["terms"]["per_seq_ms"].update(sources=["a-blog"]), "must list keys of"),
    (lambda d: d["engines"]["vllm"]["terms"].pop("per_token_ms"), "must give each of"),
])
def test_a_default_without_its_source_is_refused(change, needle, tmp_path):
    from stepcal.experiments.host_defaults import check_serving_defaults
    from stepcal.simulator.errors import InputError
    with pytest.raises(InputError, match=needle.replace("(", r"\(")):
        check_serving_defaults(_broken(change), tmp_path / "serving_defaults.json")
    path = tmp_path / "serving_defaults.json"       # and at use, not only in this test
    path.write_text(json.dumps(_broken(change)))
    with pytest.raises(InputError, match="serving_defaults.json"):
        host_defaults("vllm", path)


def test_help_says_where_every_default_comes_from(capsys):
    """`stepcal simulate --help` gives each engine's non-zero numbers, the sources they cite and the data file."""
    import re
    assert main(["simulate", "--help"]) == 0
    shown = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "experiments/data/serving_defaults.json" in shown
    data = read_serving_defaults()
    for engine, entry in data["engines"].items():
        assert engine in shown
        for name, term in entry["terms"].items():
            if term["value"]:
                assert f"{term['value']:g} ms per" in shown, (engine, name)
                for key in term["sources"]:
                    assert data["sources"][key]["short"] in shown, (engine, name, key)


def test_the_defaults_file_is_package_data():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"stepcal.experiments" = ["data/*.json"]' in pyproject
    assert DEFAULTS_PATH.parent.name == "data" and DEFAULTS_PATH.exists()


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_host_defaults_change_the_prediction(tmp_path):
    base = ["simulate", "--trace", TRACE, "--step-model", "linear:5,0.01,0.0002", "--quiet"]
    assert main([*base, "--out", str(tmp_path / "plain")]) == 0
    assert main([*base, "--host-defaults", "vllm", "--out", str(tmp_path / "vllm")]) == 0
    plain, vllm = _summary(tmp_path / "plain"), _summary(tmp_path / "vllm")
    terms = host_defaults("vllm")
    # the request path delays every request by 13.5 ms plus 0.0028 ms x its prompt: at least 0.7 ms more here
    assert terms.per_request_ms == 13.5
    assert vllm["ttft_ms"]["p50"] > plain["ttft_ms"]["p50"] + terms.per_request_ms + 256 * terms.per_prompt_token_ms
    assert vllm["tpot_ms"]["p50"] > plain["tpot_ms"]["p50"]      # per-sequence host time per step
    assert "host terms" in vllm["step_model"]


def test_sglang_defaults_hide_the_step_terms_behind_the_gpu_unless_overlap_is_off(tmp_path):
    base = ["simulate", "--trace", TRACE, "--step-model", "linear:5,0.01,0.0002", "--quiet"]
    for name in ("plain", "sglang", "sglang-no-overlap"):
        engine = [] if name == "plain" else ["--host-defaults", name]
        assert main([*base, *engine, "--out", str(tmp_path / name)]) == 0
    plain, overlap, synchronous = (_summary(tmp_path / n) for n in ("plain", "sglang", "sglang-no-overlap"))
    terms = host_defaults("sglang-no-overlap")
    assert terms.per_step_ms == 0.61 and host_defaults("sglang").per_step_ms == 0.0
    # with the overlap scheduler only the request path adds time: the tokeniser's, before the first token
    assert overlap["tpot_ms"]["p50"] == pytest.approx(plain["tpot_ms"]["p50"])
    assert overlap["ttft_ms"]["p50"] > plain["ttft_ms"]["p50"] + 256 * terms.per_prompt_token_ms
    # without it every step pays the 0.61 ms the overlap hides
    assert synchronous["tpot_ms"]["p50"] > overlap["tpot_ms"]["p50"] + 0.5


def test_host_defaults_on_calibrated_terms_is_refused_in_one_line(tmp_path, capsys):
    cal = tmp_path / "cal"
    cal.mkdir()
    (cal / "meta.json").write_text(json.dumps({"kind": "builtin", "step_model": "const:5",
                                               "host_terms": {"per_step_ms": 0.5, "per_request_ms": 3.0}}))
    code = main(["simulate", "--trace", TRACE, "--step-model", str(cal), "--host-defaults", "vllm", "--quiet",
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "already has calibrated host terms" in err


@pytest.mark.parametrize("terms, needle", [({"per_request_sigma": -0.5}, "per_request_sigma"),
                                           ({"per_stream_ms": "x"}, "finite numbers"),
                                           ({"per_stream_sec": 1.0}, "unknown keys")])
def test_a_bad_front_end_value_exits_2_in_one_line(terms, needle, tmp_path, capsys):
    cal = tmp_path / "cal"
    cal.mkdir()
    (cal / "meta.json").write_text(json.dumps({"kind": "builtin", "step_model": "const:5", "host_terms": terms}))
    code = main(["simulate", "--trace", TRACE, "--step-model", str(cal), "--quiet", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and needle in err and err.startswith("stepcal:")


def test_an_unknown_engine_is_an_argument_error_in_one_line(tmp_path, capsys):
    code = main(["simulate", "--trace", TRACE, "--step-model", "const:5", "--host-defaults", "tgi",
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "--host-defaults" in err


def test_validate_and_calibrate_take_the_defaults(tmp_path):
    run = tmp_path / "m"
    assert main(["measure", "--trace", "poisson:rate=30,n=30,prompt=uniform:8:80,output=uniform:2:16",
                 "--scheduler", "continuous", "--quiet", "--out", str(run)]) == 0
    assert main(["validate", "--measured", str(run), "--step-model", "const:1", "--host-defaults", "vllm-async",
                 "--quiet", "--out", str(tmp_path / "v")]) == 0
    assert main(["calibrate", "--measured", str(run), "--step-model", "const:1", "--host-defaults", "vllm",
                 "--max-simulations", "20", "--quiet", "--out", str(tmp_path / "c")]) == 0
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    assert meta["host_terms"]["per_prompt_token_ms"] == host_defaults("vllm").per_prompt_token_ms   # held
    assert meta["calibration"]["host_defaults"] == "vllm"
    assert set(meta["calibration"]["uncertainty"]["std_err"]) <= set(HostTerms().to_dict())


DISAGG = ["capacity", "--trace", "poisson:rate=4,n=150,prompt=uniform:32:512,output=uniform:8:128,seed=3",
          "--slo-ttft-ms", "300", "--slo-tpot-ms", "40", "--disaggregated", "1:1", "--model-spec", "llama-3-8b",
          "--tolerance", "0.1", "--quiet"]


def _start_probe(record: dict) -> dict:
    """The disaggregated search's probe at the trace's own rate, where every search starts."""
    rate = record["trace_rate_rps"]
    return next(p for p in record["disaggregated"]["probes"] if p["rate_rps"] == pytest.approx(rate, rel=1e-12))


def test_host_defaults_apply_to_both_disaggregated_pools(tmp_path):
    base = [*DISAGG, "--step-model", "linear:5,0.01,0.0002"]
    assert main([*base, "--out", str(tmp_path / "plain")]) == 0
    assert main([*base, "--host-defaults", "vllm", "--out", str(tmp_path / "vllm")]) == 0
    plain, vllm = (json.loads((tmp_path / d / "capacity.json").read_text()) for d in ("plain", "vllm"))
    for pool in ("prefill_step_model", "decode_step_model"):
        assert "host terms" in vllm["disaggregated"][pool] and "host terms" not in plain["disaggregated"][pool], pool
    # at the same rate, the per-sequence host time lengthens every decode step and the request path every TTFT
    before, after = _start_probe(plain), _start_probe(vllm)
    assert before["rate_rps"] == after["rate_rps"]
    assert after["tpot_p99_ms"] > before["tpot_p99_ms"] and after["ttft_p99_ms"] > before["ttft_p99_ms"]


def _calibrated(path: Path, **host_terms) -> str:
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"kind": "builtin", "step_model": "const:5", "host_terms": host_terms}))
    return str(path)


def test_disaggregated_pools_with_two_request_paths_are_refused_in_one_line(tmp_path, capsys):
    prefill = _calibrated(tmp_path / "p", per_request_ms=3.0)
    decode = _calibrated(tmp_path / "d", per_request_ms=9.0)
    code = main([*DISAGG, "--step-model", prefill, "--decode-step-model", decode, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "--decode-step-model" in err and "one front end" in err
    assert not (tmp_path / "o").exists()


def test_disaggregated_host_defaults_on_calibrated_pool_tables_are_refused(tmp_path, capsys):
    decode = _calibrated(tmp_path / "d", per_step_ms=0.5)
    code = main([*DISAGG, "--step-model", "const:5", "--decode-step-model", decode, "--host-defaults", "vllm",
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "already has calibrated host terms" in err
