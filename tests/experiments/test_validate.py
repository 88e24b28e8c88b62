import json

import pandas as pd
import pytest

from experiments.cli import main
from experiments.validation import compare, load_measured_run, relative_error


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("measured") / "run"
    assert main(["measure", "--trace", "poisson:rate=40,n=16,prompt=uniform:4:60,output=uniform:1:12",
                 "--scheduler", "sarathi", "--chunk-size", "32", "--repeats", "2", "--quiet", "--out", str(out)]) == 0
    return out


def test_validate_replays_the_measured_run(measured, tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(measured), "--step-model", "linear:2,0.05,0.001", "--quiet",
                 "--out", str(out)]) == 0
    record = json.loads((out / "validation.json").read_text())
    assert record["num_requests"] == 16 and record["num_finished_both"] == 16
    cell = record["metrics"]["ttft_ms"]["p50"]
    assert cell["error"] == pytest.approx((cell["simulated"] - cell["measured"]) / cell["measured"])
    assert cell["noise_floor"] is not None           # two repeats were measured
    # the measured value is the mean of the repeats' values; the step log is every repeat's
    repeats = [json.loads((measured / f"repeat_{k}" / "summary.json").read_text()) for k in (0, 1)]
    assert cell["measured"] == pytest.approx((repeats[0]["ttft_ms"]["p50"] + repeats[1]["ttft_ms"]["p50"]) / 2)
    assert record["num_repeats"] == 2 and "mean of 2 repeats" in (out / "validation.md").read_text()
    assert len(record["speed_probe_ms"]) == 2 and min(record["speed_probe_ms"]) > 0
    steps = [pd.read_parquet(measured / f"repeat_{k}" / "steps.parquet") for k in (0, 1)]
    assert record["step_level"]["num_steps"] == len(steps[0]) + len(steps[1])
    noise = record["step_level"]["noise_floor"]          # the same batches, timed in both repeats
    assert noise["num_matched_steps"] > 0 and noise["mape"] >= 0
    # the simulated run used the measured run's scheduler: same first batch composition
    simulated = pd.read_parquet(out / "simulated_requests.parquet")
    assert sorted(simulated["request_id"]) == list(range(16))
    assert "| ttft_ms | p99 |" in (out / "validation.md").read_text()


def test_a_perfect_step_model_has_zero_step_error(measured):
    run = load_measured_run(measured)
    from experiments.validation import step_level_error

    class Replay:
        """Returns each measured step's own duration."""
        def __init__(self, steps):
            self.by_batch = {(tuple(r), tuple(q), tuple(k)): d for r, q, k, d in
                             zip(steps.request_ids, steps.q_lens, steps.kv_lens, steps.duration_ms)}

        def step_ms(self, batch):
            return self.by_batch[(batch.request_ids, tuple(batch.q_lens), tuple(batch.kv_lens))]

    first = run.steps[run.steps["repeat"] == 0]
    assert step_level_error(Replay(first), first)["mape"] == 0.0


def test_unfinished_requests_are_counted_not_dropped(measured):
    run = load_measured_run(measured)
    simulated = run.requests.copy()
    simulated.loc[simulated.request_id == 3, "finish_s"] = float("nan")
    record = compare(run, simulated, run.summary, {"mape": 0.0})
    assert record["num_finished_only_measured"] == 1 and record["num_finished_both"] == 15
    assert record["metrics"]["e2e_ms"]["p50"]["error"] == 0.0
    assert relative_error(None, 1.0) is None and relative_error(1.5, 1.0) == 0.5


def test_validate_bad_measured_dir(tmp_path, capsys):
    assert main(["validate", "--measured", str(tmp_path), "--step-model", "const:1"]) == 2
    err = capsys.readouterr().err
    assert "meta.json" in err and err.count("\n") == 1


def test_step_matched_errors_isolate_step_time_from_queueing(measured):
    """A 'measured' run made by the simulator with 2 ms steps, validated with a 3 ms model: every
    latency is off, but once the model is rescaled to the measured total, nothing is left."""
    from dataclasses import replace

    from experiments.validation import MeasuredRun, sim_config_for, step_level_error, step_matched_errors
    from simulator.simulation import simulate
    from simulator.step_model import ConstStepModel
    run = load_measured_run(measured)
    config = sim_config_for(run)
    truth = simulate(run.trace, ConstStepModel(2.0), replace(config, record_batches=True))
    synthetic = MeasuredRun(run.path, run.meta, run.trace, truth.requests, truth.steps, truth.summary)
    model = ConstStepModel(3.0)
    step_error = step_level_error(model, truth.steps)
    assert step_error["total_error"] == pytest.approx(0.5)
    plain = simulate(run.trace, model, config).summary
    assert relative_error(plain["e2e_ms"]["p50"], truth.summary["e2e_ms"]["p50"]) > 0.2
    matched = step_matched_errors(synthetic, model, step_error, config)
    assert matched["scale"] == pytest.approx(2.0 / 3.0)
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        for stat in ("p50", "p90", "p99"):
            assert matched["metrics"][metric][stat] == pytest.approx(0.0, abs=1e-9)


def test_step_noise_floor_compares_the_same_batches_of_two_repeats(measured):
    from experiments.validation import step_noise_floor
    run = load_measured_run(measured)
    second = pd.read_parquet(measured / "repeat_1" / "steps.parquet")

    def by_batch(steps):
        first = {}       # a batch seen twice in one run counts with its first timing
        for r, q, k, d in zip(steps.request_ids, steps.q_lens, steps.kv_lens, steps.duration_ms):
            first.setdefault((tuple(r), tuple(q), tuple(k)), d)
        return first
    a, b = by_batch(pd.read_parquet(measured / "repeat_0" / "steps.parquet")), by_batch(second)
    common = sorted(set(a) & set(b))
    noise = step_noise_floor(run)
    assert noise["num_matched_steps"] == len(common)
    assert noise["total_difference"] == pytest.approx(sum(b[k] for k in common) / sum(a[k] for k in common) - 1)
    assert noise["mape"] == pytest.approx(sum(abs(b[k] - a[k]) / a[k] for k in common) / len(common))
