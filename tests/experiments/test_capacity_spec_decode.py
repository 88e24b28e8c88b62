"""capacity with speculative decoding: the drafter's time is in the model, drafts raise the TPOT-bound rate."""
import json

from stepcal.experiments.cli import main

TRACE = "poisson:rate=4,n=150,prompt=uniform:32:256,output=uniform:32:128,seed=3"
SLO = ["--slo-ttft-ms", "2000", "--slo-tpot-ms", "12"]
STEP_MODEL = "linear:8,0.03,0.0002"


def _capacity(tmp_path, name, *extra):
    out = tmp_path / name
    assert main(["capacity", "--trace", TRACE, "--step-model", STEP_MODEL, *SLO, "--tolerance", "0.05", *extra,
                 "--quiet", "--out", str(out)]) == 0
    return json.loads((out / "capacity.json").read_text())


def test_spec_decode_raises_a_tpot_bound_capacity(tmp_path):
    off = _capacity(tmp_path, "off")
    on = _capacity(tmp_path, "on", "--spec-decode", "ngram:3", "--acceptance", "rates:0.9,0.8,0.7",
                   "--drafter", "const:1")
    assert "drafter const:1" in on["step_model"] and "drafter" not in off["step_model"]
    assert on["max_rate_rps"] > off["max_rate_rps"]


def test_spec_decode_with_disaggregation_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["capacity", "--trace", TRACE, "--step-model", STEP_MODEL, *SLO, "--spec-decode", "ngram:2",
                 "--acceptance", "mean:2", "--disaggregated", "1:1", "--model-spec", "llama-3-8b", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists() and err.count("\n") == 1 and "--spec-decode" in err
