import json

import pandas as pd
import pytest

from stepcal.core.measured_run import SAME_PLACE, RunStats
from stepcal.experiments.cli import main
from stepcal.experiments.validation.compare import ValidationRecord, compare
from stepcal.experiments.validation.errors import relative_error
from stepcal.experiments.validation.measured import load_measured_run
from stepcal.experiments.validation.steps import StepLevelError, step_noise_floor
from stepcal.experiments.validation.table import format_table


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
    # the measured value is the mean of the repeats' values, the noise floor their difference
    repeats = [json.loads((measured / f"repeat_{k}" / "summary.json").read_text()) for k in (0, 1)]
    first, second = repeats[0]["ttft_ms"]["p50"], repeats[1]["ttft_ms"]["p50"]
    assert cell["measured"] == pytest.approx((first + second) / 2)
    assert cell["noise_floor"] == pytest.approx(abs(second - first) / first)
    assert record["num_repeats"] == 2
    assert record["speed_probe_ms"] == [repeats[0]["speed_probe_ms"], repeats[1]["speed_probe_ms"]]
    steps = [pd.read_parquet(measured / f"repeat_{k}" / "steps.parquet") for k in (0, 1)]
    assert record["step_level"]["num_steps"] == len(steps[0]) + len(steps[1])
    # the same batches, timed in both repeats (step_noise_floor's own figures are tested below)
    assert record["step_level"]["noise_floor"] == step_noise_floor(load_measured_run(measured)).to_dict()
    simulated = pd.read_parquet(out / "simulated_requests.parquet")
    assert sorted(simulated["request_id"]) == list(range(16))
    predictions = pd.read_parquet(out / "step_predictions.parquet")
    both = pd.concat(steps, ignore_index=True)
    assert predictions["measured_ms"].tolist() == both["duration_ms"].tolist()
    # linear:A,B,C is A + B·num_tokens + C·Σ(s_i + q_i), for each measured batch
    expected = [2 + 0.05 * sum(q) + 0.001 * sum(q + k) for q, k in zip(both["q_lens"], both["kv_lens"])]
    assert predictions["predicted_ms"].tolist() == pytest.approx(expected)
    markdown = (out / "validation.md").read_text()
    assert markdown == format_table(ValidationRecord.from_dict(record)) + "\n"
    assert markdown.startswith(f"measured run {measured}: 16 requests, each statistic the mean of 2 repeats, "
                               "16 finished in both runs\n")
    p99 = record["metrics"]["ttft_ms"]["p99"]
    assert (f"| ttft_ms | p99 | {p99['measured']:.4g} | {p99['simulated']:.4g} | {100 * p99['error']:+.1f}% | "
            f"{100 * p99['noise_floor']:+.1f}% |") in markdown.splitlines()


def test_a_perfect_step_model_has_zero_step_error(measured):
    run = load_measured_run(measured)
    from stepcal.experiments.validation.steps import step_level_error

    class Replay:
        """Returns each measured step's own duration."""
        def __init__(self, steps):
            self.by_batch = {(tuple(r), tuple(q), tuple(k)): d for r, q, k, d in
                             zip(steps.request_ids, steps.q_lens, steps.kv_lens, steps.duration_ms)}

        def step_ms(self, batch):
            return self.by_batch[(batch.request_ids, tuple(batch.q_lens), tuple(batch.kv_lens))]

    first = run.steps[run.steps["repeat"] == 0]
    error = step_level_error(Replay(first), first)
    assert (error.mape, error.max_ape, error.total_error, error.num_steps) == (0.0, 0.0, 0.0, len(first))


def test_unfinished_requests_are_counted_not_dropped(measured):
    run = load_measured_run(measured)
    simulated = run.requests.copy()
    simulated.loc[simulated.request_id == 3, "finish_s"] = float("nan")
    record = compare(run, simulated, run.stats, StepLevelError(0))
    assert record.num_finished_only_measured == 1 and record.num_finished_both == 15
    assert record.cell("e2e_ms", "p50").error == 0.0
    assert relative_error(None, 1.0) is None and relative_error(1.5, 1.0) == 0.5


def test_validate_bad_measured_dir(tmp_path, capsys):
    assert main(["validate", "--measured", str(tmp_path), "--step-model", "const:1"]) == 2
    assert capsys.readouterr().err == (f"stepcal: --measured {tmp_path}: missing meta.json (expected the output of "
                                       f"`stepcal measure` or `stepcal import vllm-bench`)\n")


def test_step_matched_errors_isolate_step_time_from_queueing(measured):
    """A 'measured' run made by the simulator with 2 ms steps, validated with a 3 ms model: every
    latency is off, but once the model is rescaled to the measured total, nothing is left."""
    from dataclasses import replace

    from stepcal.experiments.validation.compare import step_matched_errors
    from stepcal.experiments.validation.measured import MeasuredRun, sim_config_for
    from stepcal.experiments.validation.steps import step_level_error
    from stepcal.simulator.simulation import simulate
    from stepcal.simulator.step_model import ConstStepModel
    run = load_measured_run(measured)
    config = sim_config_for(run)
    truth = simulate(run.trace, ConstStepModel(2.0), replace(config, record_batches=True))
    synthetic = MeasuredRun(run.path, run.meta, run.trace, truth.requests, truth.steps,
                            RunStats.from_summary(truth.summary))
    model = ConstStepModel(3.0)
    step_error = step_level_error(model, truth.steps)
    assert step_error.total_error == pytest.approx(0.5)
    plain = simulate(run.trace, model, config).summary
    assert relative_error(plain["e2e_ms"]["p50"], truth.summary["e2e_ms"]["p50"]) > 0.2
    matched = step_matched_errors(synthetic, model, step_error, config)
    assert matched.scale == pytest.approx(2.0 / 3.0)
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        for stat in ("p50", "p90", "p99"):
            assert matched.error(metric, stat) == pytest.approx(0.0, abs=1e-9)


def test_step_noise_floor_compares_the_same_batches_of_two_repeats(measured):
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
    assert noise.num_matched_steps == len(common)
    assert noise.total_difference == pytest.approx(sum(b[k] for k in common) / sum(a[k] for k in common) - 1)
    assert noise.mape == pytest.approx(sum(abs(b[k] - a[k]) / a[k] for k in common) / len(common))


def test_validation_json_keeps_its_layout_and_reads_back(measured, tmp_path):
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(measured), "--step-model", "const:2", "--quiet", "--out", str(out)]) == 0
    record = json.loads((out / "validation.json").read_text())
    assert list(record) == ["kind", "schema_version", "tool_version", "measured_run", "num_requests", "num_repeats", "num_finished_both",
                            "num_finished_only_measured", "num_finished_only_simulated", "metrics", "throughput_rps",
                            "num_preemptions", "step_level", "speed_probe_ms", "step_model", "step_matched",
                            "prefix_reuse", "ranges", "step_split", "slowed_repeats", "beyond_fitted",
                            "profile_speed_probe_ms", "speed_vs_profile", "host_defaults", "timeseries"]
    assert record["step_split"] is None and record["beyond_fitted"] is None   # const: has no terms, no fitted range
    assert record["speed_vs_profile"] is None   # nor a profile's speed probe
    # the fixture's own repeats: none slowed on a quiet machine, but a busy one may slow one for real
    assert all(list(s) == ["repeat", "ratio", "start_s", "end_s", "others"] for s in record["slowed_repeats"])
    assert {m: list(stats) for m, stats in record["metrics"].items()} == {
        m: ["mean", "p50", "p90", "p95", "p99"] for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")}
    assert list(record["metrics"]["itl_ms"]["p95"]) == list(record["throughput_rps"]) == [
        "measured", "simulated", "error", "noise_floor"]
    assert list(record["step_level"]) == ["mape", "p90_ape", "max_ape", "total_error", "mean_predicted_ms",
                                          "mean_measured_ms", "num_steps", "noise_floor"]
    assert list(record["step_level"]["noise_floor"]) == ["mape", "median_ape", "num_matched_steps", "total_difference"]
    assert list(record["step_matched"]) == ["scale", "metrics", "throughput_rps"]
    assert record["step_model"] == "const:2" and record["num_preemptions"] == {"measured": 0, "simulated": 0}
    assert record["prefix_reuse"] is None   # the run did not cache prefixes
    assert record["timeseries"] is None     # nor kept the engine's queue over time
    again = ValidationRecord.from_dict(record).to_dict()
    assert json.dumps(again) == json.dumps(record)      # the same content, in the same order


def test_validate_names_a_measured_repeat_the_machine_slowed(measured, tmp_path, capsys):
    import shutil

    from stepcal.profiler.engine.slowdown import SlowestWindow
    run = tmp_path / "run"
    shutil.copytree(measured, run)
    # Every repeat a copy of the first: the measured repeats differ as the shared machine pleases (a CI
    # machine slowed one by 1.5x once, and the 1.6x below no longer stood out), so the 1.6x is the one
    # difference left.
    shutil.rmtree(run / "repeat_1")
    for k in (1, 2):
        shutil.copytree(run / "repeat_0", run / f"repeat_{k}")
    steps = pd.read_parquet(run / "repeat_1" / "steps.parquet")
    steps["duration_ms"] *= 1.6                                # the whole of repeat 1 slowed by another process
    steps.to_parquet(run / "repeat_1" / "steps.parquet")
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(run), "--step-model", "const:2", "--quiet", "--out", str(out)]) == 0
    record = json.loads((out / "validation.json").read_text())
    assert [s["repeat"] for s in record["slowed_repeats"]] == [1]
    window = SlowestWindow(**{k: v for k, v in record["slowed_repeats"][0].items() if k != "repeat"})
    # against repeats 0 and 2 over the same stretch, well past the 1.25 threshold
    assert window.excess == pytest.approx(1.6, rel=0.05)
    assert (f"warning: the machine slowed measured repeat 1 ({window.describe()}): its statistics are in the measured "
            "values above; `stepcal measure --retry-slowed 2` serves such a repeat again") in (out / "validation.md").read_text()
    # what calibrate says of the run it fits
    from stepcal.experiments.validation.measured import warn_slowed
    capsys.readouterr()
    assert warn_slowed(load_measured_run(run), "the terms are fitted to it") == record["slowed_repeats"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: {run}: the machine slowed repeat 1 ({window.describe()}); "
                                                   "the terms are fitted to it")
    assert err.endswith("(`stepcal measure --retry-slowed 2` serves such a repeat again)\n")
    warn_slowed(load_measured_run(run), "the terms are fitted to it", "served twice already")
    assert capsys.readouterr().err.endswith("the terms are fitted to it (served twice already)\n")
    # the same repeat kept by the measurement, slow again in the same place when served again: a note
    summary = json.loads((run / "repeat_1" / "summary.json").read_text())
    (run / "repeat_1" / "summary.json").write_text(json.dumps({**summary, SAME_PLACE: True}))
    out = tmp_path / "v_kept"
    assert main(["validate", "--measured", str(run), "--step-model", "const:2", "--quiet", "--out", str(out)]) == 0
    record = json.loads((out / "validation.json").read_text())
    assert [(s["repeat"], s.get("same_place")) for s in record["slowed_repeats"]] == [(1, True)]
    text = (out / "validation.md").read_text()
    assert "the machine slowed" not in text and (
        f"note: measured repeat 1 was slow in the same place each time it was served ({window.describe()}): kept, "
        "as the engine's own: its statistics are in the measured values above\n") in text
    capsys.readouterr()
    warn_slowed(load_measured_run(run), "the terms are fitted to it")
    assert capsys.readouterr().err == (f"note: {run}: repeat 1 was slow in the same place each time it was served "
                                       f"({window.describe()}): kept, as the engine's own; the terms are fitted to it\n")


def test_validate_compares_prefix_reuse_of_a_multi_turn_workload(tmp_path, capsys):
    """Sessions on a shared system prompt, measured with prefix caching: the simulator reuses the
    same tokens for every request (arrivals far apart leave no room for timing to differ)."""
    spec = "poisson:rate=0.5,n=3,system=64,turns=fixed:2,think=5,prompt=fixed:20,output=fixed:4,seed=3"
    measured = tmp_path / "m"
    assert main(["measure", "--trace", spec, "--prefix-caching", "on", "--quiet", "--out", str(measured)]) == 0
    assert json.loads((measured / "meta.json").read_text())["prefix_caching"] is True
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(measured), "--step-model", "const:2", "--quiet", "--out", str(out)]) == 0
    reuse = json.loads((out / "validation.json").read_text())["prefix_reuse"]
    assert reuse["num_compared"] == 6 and reuse["num_same_cached"] == 6
    assert reuse["measured_hit_rate"] == reuse["simulated_hit_rate"] > 0.5
    assert "6 of 6 requests reused the same number of tokens" in (out / "validation.md").read_text()


def test_validate_ranges_report_how_often_the_measured_values_fall_inside(measured, tmp_path):
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(measured), "--step-model", "linear:2,0.05,0.001", "--ranges", "6",
                 "--scatter-cv", "0.3", "--scatter-rho", "0.5", "--quiet", "--out", str(out)]) == 0
    ranges = json.loads((out / "validation.json").read_text())["ranges"]
    assert ranges["num_replications"] == 6 and ranges["drawn_terms"] == []   # a linear model: scatter only
    coverage = ranges["coverage"]
    cells = [c for stats in coverage["cells"].values() for c in stats.values() if c is not None]
    repeats = coverage["num_repeats"]
    assert len(cells) >= 16 and coverage["num_cells"] == repeats * len(cells)
    for cell in cells:
        assert cell["inside"] == (cell["low"] <= cell["measured"] <= cell["high"])
        assert cell["low"] <= cell["high"] and len(cell["repeats_inside"]) == repeats
    assert coverage["num_inside"] == sum(sum(c["repeats_inside"]) for c in cells)
    assert coverage["coverage"] == pytest.approx(coverage["num_inside"] / coverage["num_cells"])
    assert coverage["coverage_of_mean"]["num_inside"] == sum(c["inside"] for c in cells)
    assert coverage["median_relative_width"] > 0
    assert f"in {coverage['num_inside']} of {coverage['num_cells']} cells" in (out / "validation.md").read_text()
