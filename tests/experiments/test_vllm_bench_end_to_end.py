"""`stepcal import vllm-bench` -> `validate` -> `calibrate` -> `simulate`: the host terms and the front end's
distribution fitted from a bench file land in the calibrated tables' meta.json and drive the simulation."""
import json

import numpy as np
import pytest

from stepcal.experiments.cli import main
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel

BASE = "linear:3,0.01,0.0002"
SETTINGS = ["--scheduler", "vllm", "--kv-blocks", "2048"]
TRUTH = HostTerms(per_step_ms=1.0, per_request_ms=20.0, per_request_sigma=0.4)


VARIED = "poisson:rate=8,n=120,prompt=uniform:32:400,output=uniform:4:48"


def bench_from_simulation(path, model, front_end_seed: int = 5, workload: str = VARIED) -> None:
    """A `vllm bench serve --save-result` JSON of a deployment that is a simulation with known host terms:
    per request its prompt and output lengths, TTFT, the gaps between its streamed tokens (even, as TPOT
    says), and its start time on the bench's perf_counter clock."""
    from stepcal.core.workload import load_workload
    from stepcal.simulator.simulation import SimConfig, simulate
    trace = load_workload(workload, seed=2)
    result = simulate(trace, model, SimConfig(scheduler="vllm", kv_blocks=2048, front_end=model.front_end,
                                              front_end_seed=front_end_seed))
    log = result.requests.sort_values("request_id")
    gaps_s = [[float(r.tpot_ms) / 1000.0] * (int(r.num_output_tokens) - 1) for r in log.itertuples()]
    bench = {"date": "20261201-000000", "backend": "vllm", "model_id": "synthetic", "num_prompts": len(log),
             "duration": float(log["finish_s"].max()), "completed": len(log), "request_rate": 8.0,
             "input_lens": log["num_prompt_tokens"].tolist(), "output_lens": log["num_output_tokens"].tolist(),
             "ttfts": (log["ttft_ms"] / 1000.0).tolist(), "itls": gaps_s, "errors": [""] * len(log),
             "start_times": (1000.0 + log["arrival_s"]).tolist()}
    path.write_text(json.dumps(bench))


def test_bench_import_validate_calibrate_simulate_carries_the_host_terms(tmp_path):
    bench = tmp_path / "bench.json"
    bench_from_simulation(bench, HostTermsModel(LinearStepModel(3.0, 0.01, 0.0002), TRUTH))
    run, cal = tmp_path / "run", tmp_path / "cal"
    assert main(["import", "vllm-bench", str(bench), "--model-spec", "tiny", *SETTINGS, "--quiet",
                 "--out", str(run)]) == 0

    def validate(step_model: str, out: str) -> dict:
        assert main(["validate", "--measured", str(run), "--step-model", step_model, "--quiet",
                     "--out", str(tmp_path / out)]) == 0
        return json.loads((tmp_path / out / "validation.json").read_text())["metrics"]
    before = validate(BASE, "v0")
    assert main(["calibrate", "--measured", str(run), "--step-model", BASE, "--max-simulations", "30", "--quiet",
                 "--out", str(cal)]) == 0
    meta = json.loads((cal / "meta.json").read_text())
    # every term of the model lands in meta.json, the front end's distribution included, with the fit's record
    assert set(meta["host_terms"]) == set(HostTerms().to_dict())
    record = meta["calibration"]
    assert record["num_repeats"] == 1 and record["measured_run"] == str(run)
    assert {"kept", "loss_before", "loss_after", "errors_after"} <= set(record["front_end"])
    assert meta["host_terms"]["per_request_ms"] > 0 and meta["host_terms"]["per_step_ms"] > 0
    assert "per_token_ms" not in record["held_terms"]   # prompts of many lengths: TTFT's slope prices a token
    assert set(record["uncertainty"]["std_err"]) >= {"per_step_ms", "per_request_ms"}
    # validate and simulate read them back: the calibrated tables are closer to the bench on TTFT and TPOT
    after = validate(str(cal), "v1")
    for metric in ("ttft_ms", "tpot_ms"):
        assert abs(after[metric]["p50"]["error"]) < abs(before[metric]["p50"]["error"]), metric
    trace = str(run / "trace.parquet")
    for step_model, out in ((BASE, "s0"), (str(cal), "s1")):
        assert main(["simulate", "--trace", trace, "--step-model", step_model, *SETTINGS, "--quiet",
                     "--out", str(tmp_path / out)]) == 0
    plain, calibrated = (json.loads((tmp_path / out / "summary.json").read_text()) for out in ("s0", "s1"))
    assert "host terms" in calibrated["step_model"]
    front_ms = meta["host_terms"]["per_request_ms"]
    # the request path delays every request's entry: TTFT P50 grows by at least most of its median
    assert calibrated["ttft_ms"]["p50"] - plain["ttft_ms"]["p50"] > 0.5 * front_ms
    sim = json.loads((tmp_path / "s1" / "config.json").read_text())["sim_config"]["front_end"]
    assert sim["median_ms"] == pytest.approx(front_ms)
    assert sim["sigma"] == meta["host_terms"]["per_request_sigma"] and np.isfinite(sim["sigma"])


ONE_LENGTH = "poisson:rate=8,n=120,prompt=uniform:256:256,output=uniform:4:48"


def _calibrated_one_length(tmp_path, truth: HostTerms) -> dict:
    bench = tmp_path / "bench.json"
    bench_from_simulation(bench, HostTermsModel(LinearStepModel(3.0, 0.01, 0.0002), truth), workload=ONE_LENGTH)
    run, cal = tmp_path / "run", tmp_path / "cal"
    assert main(["import", "vllm-bench", str(bench), "--model-spec", "tiny", *SETTINGS, "--quiet",
                 "--out", str(run)]) == 0
    assert main(["calibrate", "--measured", str(run), "--step-model", BASE, "--max-simulations", "30", "--quiet",
                 "--out", str(cal)]) == 0
    return json.loads((cal / "meta.json").read_text())


@pytest.mark.parametrize("truth", [TRUTH, HostTerms(per_step_ms=1.0, per_token_ms=0.02, per_request_ms=3.0)],
                         ids=["request-path", "token-cost"])
def test_prompts_of_one_length_tell_a_token_from_the_request_path_by_the_prefills_alongside(tmp_path, truth):
    """`vllm bench`'s random dataset sends prompts of one length by default. TTFT then has no slope on the
    prompt's tokens, and the calibration run's TTFTs fit a prompt token's cost and the request path
    alike; but a token's cost rides in the steps of the requests decoding alongside, and the request
    path's does not (TPOT's slope on the prefills alongside). A 20 ms request path stays on the request,
    and 0.02 ms per token (5 ms a prompt) is found on the token."""
    meta = _calibrated_one_length(tmp_path, truth)
    fitted = meta["host_terms"]
    assert "per_token_ms" not in meta["calibration"]["held_terms"]
    if truth.per_token_ms == 0:
        assert fitted["per_request_ms"] > 0.5 * truth.per_request_ms and 256 * fitted["per_token_ms"] < 2.0
    else:
        assert 0.5 * truth.per_token_ms < fitted["per_token_ms"] < 1.5 * truth.per_token_ms
        assert fitted["per_request_ms"] < 0.5 * 256 * truth.per_token_ms + truth.per_request_ms


def test_a_log_without_either_slope_holds_the_per_token_term():
    """Neither TTFT's slope on the prompt nor TPOT's on the prefills alongside (one prompt length, no
    prefill cost showing in TPOT): the per-token term is held at zero, and why is said."""
    from stepcal.experiments.calibration import UNTOLD_TOKEN, untold_terms

    class _NoSlopes:
        def measured(self, key):
            return None
    assert untold_terms(_NoSlopes()) == {"per_token_ms": UNTOLD_TOKEN}
