"""The whole campaign on a miniature grid and workload, and its stages and headline on their own."""
import json
import re
from types import SimpleNamespace

import pytest

from stepcal.core.errors import InputError
from stepcal.costmodel.table_meta import TableMeta
from stepcal.experiments.campaign import Campaign, CampaignConfig, HeadlineRow, format_headline, target_summary
from stepcal.experiments.campaign.campaign import RETRY_SPENT
from stepcal.experiments.campaign.headline import HEADLINE_METRICS, HEADLINE_STATS, HeadlineCell
from stepcal.profiler.noise_policy import NoisePolicy

SMALL_GRID = {
    "timing": {"max_point_s": 0.05, "min_repeats": 3, "rounds": 2},   # one before the measurements, one after
    "gemm": {"m": [1, 16, 128]},
    "attn_prefill": {"num_seqs": [1], "q": [16, 64], "s": [0, 64], "patterns": ["uniform"]},
    "attn_decode": {"num_seqs": [1, 8], "s": [64, 256], "patterns": ["uniform"]},
    # eight batches: enough rows to fit whole steps from the profile alone ("profiled")
    "step": {"batches": [{"num_decode": 1, "decode_s": 64}, {"num_decode": 8, "decode_s": 128},
                         {"num_decode": 2, "decode_s": 32}, {"num_decode": 4, "decode_s": 96},
                         {"num_prefill": 1, "q": 64, "s": 0}, {"num_prefill": 1, "q": 16, "s": 0},
                         {"num_prefill": 1, "q": 32, "s": 0, "num_decode": 4, "decode_s": 64},
                         {"num_prefill": 1, "q": 16, "s": 0, "num_decode": 2, "decode_s": 32}]},
    "overhead": {"num_seqs": [1, 8], "s": [64]},
    "host": {"num_seqs": [1, 2, 4, 8], "s": [32], "prefill_q": [8, 16, 32, 64]},
}


MODELS = ("tables", "profiled", "kernels", "calibrated", "profiled_cal")


@pytest.mark.slow
def test_campaign_runs_every_stage(tmp_path, capsys):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps(SMALL_GRID))
    config = CampaignConfig(out=tmp_path / "qs", schedulers=("continuous",), loads=(0.3, 0.7), num_requests=24,
                            repeats=2, trials=1, grid=str(grid), prompt="uniform:8:48", output="uniform:2:10",
                            ranges=3, history_file=tmp_path / "history.jsonl")
    campaign = Campaign(config)
    headline = campaign.run()
    out = tmp_path / "qs"
    # the device's history: nothing earlier; both loads' runs added, a pair each
    from stepcal.experiments.validation.device_history import read_history
    assert campaign.history_used == [] and list(read_history(tmp_path / "history.jsonl").entries) == campaign.history_added
    assert [(e.run, len(e.ratios)) for e in campaign.history_added] == [
        (str(out / "measured/continuous" / load), 1) for load in ("load_30", "load_70")]
    for path in ("profile/profile.parquet", "profile_late/profile.parquet", "tables/meta.json", "calibrated/continuous/meta.json",
                 "measured/continuous/load_30/repeat_1/steps.parquet", "report/report.html", "headline.json"):
        assert (out / path).exists(), path
    saturation = json.loads((out / "measured/continuous/saturation/summary.json").read_text())
    assert headline.capacity_rps == {"continuous": saturation["throughput_rps"]}
    # A repeat the shared machine slowed is served again (its own test is below); which one, if any,
    # depends on the machine, so those stages are checked against served_again and left out here.
    again = [stage for stage in config.timings if " again (repeat " in stage]
    assert len(again) == len(headline.served_again)
    assert [stage for stage in config.timings if stage not in again] == [
        f"profile kernels ({grid} grid)", "measure continuous capacity (saturation run)",
        "measure continuous at 30% load (repeat 1 of 2)", "measure continuous at 70% load (repeat 1 of 2)",
        "measure continuous at 70% load (repeat 2 of 2)", "measure continuous at 30% load (repeat 2 of 2)",
        "profile kernels again (1 more rounds)", "fit T_step tables (tuned)", "fit T_step tables from the profile alone (step + host)",
        "fit kernel-only T_step tables",
        "calibrate host terms of the kernels tables on continuous at 30% load",
        "calibrate host terms of the profiled tables on continuous at 30% load",
        *[f"simulate + validate continuous at 30% load ({model})" for model in MODELS],
        *[f"simulate + validate continuous at 70% load ({model})" for model in MODELS[:3]],
        "simulate + validate continuous at 70% load (calibrated, 3 replications)",
        "simulate + validate continuous at 70% load (profiled_cal, 3 replications)",
        "fit and validate the profiled tables on each profile half alone (reproducibility)", "report"]
    # the profiled tables on each half alone: both loads' runs validated with each
    for half in ("profile", "profile_late"):
        assert json.loads((out / f"reproducibility/tables_{half}/meta.json").read_text())["inputs"] == [
            str(out / half / "profile.parquet")]
        for load in ("load_30", "load_70"):
            assert (out / f"reproducibility/validation/{half}/continuous/{load}/validation.json").exists()
    moved = headline.reproducibility
    assert moved["num_cells"] == 12 and 0 <= moved["median_move"] <= moved["max_move"]
    assert 0 <= moved["num_beyond_target"] <= 12 and set(moved["cells_met"]) == {"early", "late"}
    assert "profile reproducibility: with the profiled tables fitted on each half" in format_headline(headline)
    assert moved["late_over_early"]["num_points"] >= 8 and moved["late_over_early"]["median"] > 0   # 8 batches
    rows = headline.rows
    assert [(r.load, r.model, r.held_out) for r in rows] == [   # the profiled tables saw no run
        (0.3, "tables", False), (0.3, "profiled", True), (0.3, "kernels", False), (0.3, "calibrated", False),
        (0.3, "profiled_cal", False),
        (0.7, "tables", True), (0.7, "profiled", True), (0.7, "kernels", True), (0.7, "calibrated", True),
        (0.7, "profiled_cal", True)]
    on_profile = json.loads((out / "profiled_cal/continuous/meta.json").read_text())
    assert on_profile["t_step_terms"] == ["step", "host"] and "host_terms" in on_profile
    profiled = json.loads((out / "tables_profiled/meta.json").read_text())
    assert profiled["t_step_terms"] == ["step", "host"]
    # both profile halves probed the machine's speed, a pair each; every run is set against them
    assert len(profiled["profile_speed_probe_ms"]) == 4
    assert all(r.speed_vs_profile is not None for r in rows if r.model == "profiled")
    assert "machine speed during these runs against the profile" in format_headline(headline)
    kernels = json.loads((out / "tables_kernels/meta.json").read_text())
    assert kernels["mode"] == "composed" and "step" not in kernels["targets"]
    for row in rows:    # each row is its validation.json, read back
        record = json.loads((out / "validation" / row.model / "continuous" / f"load_{round(100 * row.load)}"
                             / "validation.json").read_text())
        cell = record["metrics"]["ttft_ms"]["p50"]
        assert row.cell("ttft_ms", "p50") == HeadlineCell(cell["error"], cell["noise_floor"],
                                                          record["step_matched"]["metrics"]["ttft_ms"]["p50"])
        assert (row.step_mape, row.step_total) == (record["step_level"]["mape"], record["step_level"]["total_error"])
        assert row.step_mape_noise == record["step_level"]["noise_floor"]["mape"] is not None
    # ranges: the calibrated models' held-out run only, their coverage carried into the headline
    assert [r.coverage is not None for r in rows] == [False] * 8 + [True, True]
    for row in rows[-2:]:
        ranges = json.loads((out / f"validation/{row.model}/continuous/load_70/validation.json").read_text())["ranges"]
        assert ranges["num_replications"] == 3
        assert row.coverage == {k: ranges["coverage"][k] for k in ("num_inside", "num_cells", "median_relative_width")}
    assert "90% intervals: the measured value lies inside in" in target_summary(rows)
    written = json.loads((out / "headline.json").read_text())
    assert written == {**headline.to_dict(), "wall_s": headline.wall_s}
    assert [HeadlineRow.from_dict(r) for r in written["rows"]] == rows
    calibrated = json.loads((out / "calibrated/continuous/meta.json").read_text())
    assert set(calibrated["host_terms"]) == {"per_step_ms", "per_seq_ms", "per_token_ms", "per_request_ms",
                                             "per_request_sigma", "per_prompt_token_ms", "per_stream_ms",
                                             "base_scale"}
    assert calibrated["calibration"]["measured_run"] == str(out / "measured/continuous/load_30")
    table = format_headline(headline).splitlines()
    assert table[0] == f"capacity (saturation throughput): continuous {saturation['throughput_rps']:.1f} req/s"
    calibration_rows = [line for line in table if line.endswith("(calibration run)")]
    assert [line[:29] for line in calibration_rows] == [f"continuous   30% {m:<12}" for m in ("tables", "kernels",
                                                                                          "calibrated", "profiled_cal")]
    assert "held-out runs, profiled: " in format_headline(headline)
    assert target_summary(rows) in format_headline(headline)
    printed = capsys.readouterr()
    plots = len(list((out / "report").glob("*.png")))
    assert printed.out.splitlines()[-1] == f"wrote {out / 'report'}/report.md, report.html and {plots} plots"
    assert re.fullmatch(r"\[ +\d+\.\d s\] " + re.escape(f"profile kernels ({grid} grid)"), printed.err.splitlines()[0])


def test_target_summary_counts_cells_against_noise_and_fixed_bounds():
    def row(err, noise, p99, held_out=True, model="tables"):
        r = {"held_out": held_out, "model": model}
        for m in HEADLINE_METRICS:
            r.update({f"{m}.p50": err, f"{m}.p50.noise": noise, f"{m}.p90": err, f"{m}.p90.noise": noise,
                      f"{m}.p99": p99})
        return HeadlineRow.from_dict(r)
    rows = [row(0.04, 0.0, 0.09),            # inside 5%, inside 10%
            row(-0.12, 0.10, 0.2),           # inside 1.5 x noise (15%), P99 outside
            row(0.2, 0.1, 0.0),              # outside both
            row(0.5, 0.0, 0.5, held_out=False),       # calibration run: not counted
            row(0.5, 0.0, 0.5, model="calibrated")]   # another model: counted on its own line
    assert target_summary(rows).splitlines() == [
        "held-out runs, tables: 12 of 18 P50/P90 errors within max(5%, 1.5 x noise); 6 of 9 P99 errors within 10%",
        "held-out runs, calibrated: 0 of 6 P50/P90 errors within max(5%, 1.5 x noise); 0 of 3 P99 errors within 10%"]


def test_target_summary_gives_the_coverage_of_the_held_out_intervals():
    def row(coverage, held_out=True):
        return HeadlineRow.from_dict({"held_out": held_out, "model": "calibrated", "coverage": coverage,
                                      **{f"{m}.{s}": 0.0 for m in HEADLINE_METRICS for s in HEADLINE_STATS}})
    rows = [row({"num_inside": 30, "num_cells": 40, "median_relative_width": 0.2}),
            row({"num_inside": 40, "num_cells": 40, "median_relative_width": 0.6}),
            row({"num_inside": 0, "num_cells": 40, "median_relative_width": 9.0}, held_out=False),   # not counted
            row(None)]
    assert target_summary(rows).splitlines()[1] == (
        "  90% intervals: the measured value lies inside in 70 of 80 cells (88%, target 80-97%); "
        "median width 40% of the measured value")


def test_target_summary_says_which_misses_are_step_time():
    def row(err, matched, preempted=(0, 0)):
        r = {"held_out": True, "model": "tables", "preemptions.measured": preempted[0],
             "preemptions.simulated": preempted[1]}
        for m in HEADLINE_METRICS:
            for s in HEADLINE_STATS:
                r.update({f"{m}.{s}": err, f"{m}.{s}.noise": 0.0, f"{m}.{s}.step_matched": matched})
        return HeadlineRow.from_dict(r)
    rows = [row(0.2, 0.03),                 # misses, within every target once step time matches
            row(0.2, 0.07, (2, 5)),         # P50/P90 still miss (5%), P99 then within 10%
            row(0.01, 0.5)]                 # met: its step-matched value does not count
    assert target_summary(rows).splitlines() == [
        "held-out runs, tables: 6 of 18 P50/P90 errors within max(5%, 1.5 x noise); 3 of 9 P99 errors within 10%",
        "  misses: 12 of 18 are step time (within target once the step total matches the measured one), 6 remain "
        "with it matched (queueing, scheduling, scatter of step time)",
        "  preemptions (KV capacity): measured 2, simulated 5"]


def test_target_summary_names_the_runs_priced_beyond_the_fitted_batches():
    def row(share, load, held_out=True):
        return HeadlineRow.from_dict({"held_out": held_out, "model": "profiled", "scheduler": "continuous",
                                      "load": load, "extrapolated": share,
                                      **{f"{m}.{s}": 0.0 for m in HEADLINE_METRICS for s in HEADLINE_STATS}})
    rows = [row(0.24, 0.9), row(0.0, 0.6), row(None, 0.3), row(0.5, 0.3, held_out=False)]   # the last: not held out
    assert target_summary(rows).splitlines()[1] == (
        "  steps beyond the batches the tables were fitted on (extrapolated prices): continuous 90% load 24.0% of "
        "its step time")
    assert HeadlineRow.from_dict(rows[0].to_dict()) == rows[0] and "extrapolated" not in rows[2].to_dict()


def test_profile_reproducibility_compares_each_runs_simulated_values_between_the_halves():
    from stepcal.experiments.campaign.headline import profile_reproducibility, reproducibility_line

    def row(error, noise=0.0):
        return HeadlineRow.from_dict({"model": "profiled", "held_out": True, **{
            f"{m}.{s}{suffix}": value for m in HEADLINE_METRICS for s in HEADLINE_STATS
            for suffix, value in (("", error), (".noise", noise))}})
    # run 1: -10% with the early half, +10% with the late one: the prediction moves 1.1 / 0.9 - 1 = 22%,
    # beyond the 5% target, and neither half meets a cell; run 2: +2% and +4%, a 2% move (1.04 / 1.02 - 1),
    # within its target of 1.5 x 4% noise = 6%, and both halves meet every cell
    moved = profile_reproducibility([(row(-0.10), row(0.10)), (row(0.02, 0.04), row(0.04, 0.04))])
    assert moved["num_cells"] == 12 and moved["num_beyond_target"] == 6
    assert moved["max_move"] == pytest.approx(1.1 / 0.9 - 1)
    assert moved["median_move"] == pytest.approx(((1.1 / 0.9 - 1) + (1.04 / 1.02 - 1)) / 2)
    assert moved["cells_met"] == {"early": 6, "late": 6}
    assert "move by a median 12.1% (at most 22%), by more than the cell's target in 6 of 12 cells; each half " \
           "alone meets 6 and 6 of them" in reproducibility_line(moved)
    assert reproducibility_line(moved).endswith("of them")
    moved["late_over_early"] = {"median": 1.092, "num_points": 4812}
    assert reproducibility_line(moved).endswith("; the late half timed the same whole steps +9.2% against the early "
                                                "one (median over 4812 points: the machine's speed moved that much)")


def test_late_over_early_matches_the_halves_whole_steps_point_by_point():
    import pandas as pd

    from stepcal.experiments.campaign.headline import late_over_early

    def half(times, op="step", status="ok"):
        return pd.DataFrame({"point_key": ["a", "b", "c", "d"][:len(times)], "name": "x", "op": op,
                             "status": status, "time_ms": times})
    early = pd.concat([half([1.0, 2.0, 4.0]), half([9.0], op="gemm")])       # kernels do not count
    late = pd.concat([half([1.1, 2.2, 4.8]), half([99.0], op="gemm"), half([0, 0, 0, 1.0], status="failed")])
    assert late_over_early(early, late) == {"median": pytest.approx(1.1), "num_points": 3}
    assert late_over_early(early, half([1.0], op="gemm")) is None


def test_headline_rows_keep_the_headline_json_layout():
    data = {"scheduler": "sarathi", "load": 0.6, "model": "calibrated", "held_out": True, "step_mape": 0.5,
            "step_mape.noise": 0.2, "step_total": -0.1, "step_total.noise": 0.03, "preemptions.measured": 1,
            "preemptions.simulated": 0}
    for k, (m, s) in enumerate((m, s) for m in HEADLINE_METRICS for s in HEADLINE_STATS):
        data.update({f"{m}.{s}": k / 10, f"{m}.{s}.noise": k / 100, f"{m}.{s}.step_matched": -k / 10})
    row = HeadlineRow.from_dict(data)
    assert row.cell("tpot_ms", "p90") == HeadlineCell(error=0.4, noise=0.04, step_matched=-0.4)
    assert list(row.to_dict().items()) == list(data.items())     # same keys, same order, same values


def test_headline_table_lines():
    cells = {f"{m}.{s}{suffix}": value for m in HEADLINE_METRICS for s in HEADLINE_STATS
             for suffix, value in (("", 0.123), (".noise", 0.05), (".step_matched", -0.02))}
    rows = [HeadlineRow.from_dict({"scheduler": "sarathi", "load": 0.3, "model": "tables", "held_out": False,
                                   "step_mape": 0.25, "step_mape.noise": None, "step_total": -0.5,
                                   "step_total.noise": 0.1, **cells})]
    from stepcal.experiments.campaign import Headline
    lines = format_headline(Headline({"sarathi": 12.345}, rows, {}, 1.0)).splitlines()
    assert lines[0] == "capacity (saturation throughput): sarathi 12.3 req/s"
    assert lines[4] == ("sarathi      30% tables            25.0% [    -]     -50.0% [+10.0%]  "
                        + " +12.3% [ +5.0%]" * 6 + " (calibration run)")
    assert lines[-1] == "sarathi      30%  " + "     -2.0%" * 6
    assert not any(line.startswith("served again") for line in lines)
    again = Headline({"sarathi": 12.345}, rows, {}, 1.0, served_again=["sarathi 30% repeat 1: why"])
    assert "served again, the machine having slowed them: sarathi 30% repeat 1: why" in format_headline(again)
    assert again.to_dict()["served_again"] == ["sarathi 30% repeat 1: why"]
    assert not any(line.startswith("profile stretches") for line in lines)
    names = [f"vllm/c{c}/n8/p16-1024/o4-128 in profile (1.38x, 40 of 96 steps)" for c in (1, 2, 4, 8)]
    slowed = Headline({"sarathi": 12.345}, rows, {}, 1.0, slowed_servings=names)
    assert ("profile stretches the machine slowed, left out of the profiled tables' fit: "
            + "; ".join(names[:3]) + "; and 1 more (tables_profiled/meta.json)") in format_headline(slowed)
    assert slowed.to_dict()["slowed_servings"] == names


def test_the_campaign_names_the_servings_its_profiled_fit_left_out(tmp_path):
    campaign = Campaign(CampaignConfig(out=tmp_path))
    assert campaign.slowed_servings() == []           # no profiled tables (yet, or no step and host ops)
    (tmp_path / "tables_profiled").mkdir()
    servings = [{"file": str(tmp_path / "profile_late" / "profile.parquet"), "num_rows": 40, "ratio": 1.523,
                 "workload": "serve/sarathi64/c2/n8/p16-1024/o4-128/m2/67ef6aa645ec"},    # written before stretches
                {"file": str(tmp_path / "profile" / "profile.parquet"), "num_rows": 80, "ratio": 1.61,
                 "workload": "serve/vllm/c4/n8/p16-1024/o4-128/m4/0a1b2c3d4e5f", "num_steps": 40, "of_steps": 96}]
    TableMeta(slowed_servings=servings).write(tmp_path / "tables_profiled")
    assert campaign.slowed_servings() == ["vllm/c4/n8/p16-1024/o4-128 in profile (1.61x, 40 of 96 steps)",
                                          "sarathi64/c2/n8/p16-1024/o4-128 in profile_late (1.52x)"]


def test_training_logs_take_every_schedulers_calibration_repeats_and_saturation_run(tmp_path):
    from stepcal.experiments.campaign import training_logs
    for s in ("continuous", "sarathi"):
        for run in ("load_30/repeat_0", "load_30/repeat_1", "load_60/repeat_0", "saturation/repeat_0"):
            (tmp_path / s / run).mkdir(parents=True)
            (tmp_path / s / run / "steps.parquet").write_bytes(b"")
    logs = [str(p.relative_to(tmp_path)) for p in training_logs(tmp_path, ("continuous", "sarathi"), 0.3)]
    assert logs == ["continuous/load_30/repeat_0/steps.parquet", "continuous/load_30/repeat_1/steps.parquet",
                    "sarathi/load_30/repeat_0/steps.parquet", "sarathi/load_30/repeat_1/steps.parquet",
                    "continuous/saturation/repeat_0/steps.parquet", "sarathi/saturation/repeat_0/steps.parquet"]


@pytest.mark.parametrize("flags, message", [
    (["--model-spec", "nope"], "--model-spec"),
    (["--prompt", "lognormal:x"], "--prompt / --output"),
    (["--device", "tpu"], "--device: unknown device 'tpu'"),
    (["--chunk-size", "0"], "--chunk-size: the value must be a whole number from 1"),
    (["--num-requests", "5"], "--num-requests >= 20"),
    (["--arrivals", "gamma:0"], "--arrivals: expected poisson or gamma:CV"),
])
def test_quickstart_rejects_bad_flags_in_one_line_before_any_work(tmp_path, capsys, flags, message):
    from stepcal.experiments.cli import main
    out = tmp_path / "qs"
    assert main(["quickstart", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not out.exists()


class _StopAfterFit(Exception):
    pass


def test_campaign_passes_device_model_and_profile_ops_to_the_stages(tmp_path, monkeypatch):
    import stepcal.profiler.engine.measure as measure
    calls = {}

    def profile_kernels(model_spec, out, noise=None, **kwargs):
        calls.setdefault("profile", []).append({"model_spec": model_spec, "out": out, **kwargs})
        calls.setdefault("noise", []).append(noise)
        return SimpleNamespace(complete=True)

    def measure_trace(trace, spec, config, out, noise=None, **kwargs):
        calls.setdefault("measure", []).append((trace, spec, config, out, kwargs))
        calls.setdefault("noise", []).append(noise)
        return {"throughput_rps": 10.0}

    def fit_tables(options):
        calls["fit"] = options
        raise _StopAfterFit
    monkeypatch.setattr("stepcal.experiments.campaign.campaign.profile_kernels", profile_kernels)
    monkeypatch.setattr("stepcal.experiments.campaign.campaign.describe_sweep", lambda result: "profiled")
    monkeypatch.setattr(measure, "measure_trace", measure_trace)
    monkeypatch.setattr("stepcal.experiments.campaign.campaign.fit_tables", fit_tables)
    monkeypatch.setattr(Campaign, "measure_interleaved", lambda self, capacity: None)
    config = CampaignConfig(out=tmp_path, device="cuda", model_spec="llama-3-8b", profile_ops="step,overhead",
                            schedulers=("sarathi",), chunk_size=512, num_requests=200, trials=3, seed=7)
    with pytest.raises(_StopAfterFit):
        Campaign(config).run()
    # the quick grid's six rounds: three before the measurements, three after them
    assert calls["profile"] == [
        {"model_spec": "llama-3-8b", "out": str(tmp_path / name), "device": "cuda", "ops": "step,overhead",
         "grid": "quick", "progress": False, "rounds": 3} for name in ("profile", "profile_late")]
    [(trace, spec, engine, out, kwargs)] = calls["measure"]     # the saturation run
    workload = "poisson:rate=10000,n=100,prompt=lognormal:128:0.8,output=lognormal:32:0.8,seed=7"
    assert kwargs == {"device": "cuda", "trace_source": workload} and out == str(tmp_path / "measured/sarathi/saturation")
    assert spec.name == "llama-3-8b" and len(trace) == 100
    assert (engine.scheduler, engine.scheduler_config.chunk_size, engine.scheduler_config.max_num_seqs,
            engine.block_size, engine.kv_blocks, engine.seed) == ("sarathi", 512, 256, 16, None, 7)
    options = calls["fit"]
    assert options.profile == [str(tmp_path / "profile/profile.parquet"), str(tmp_path / "profile_late/profile.parquet"),
                               str(tmp_path / "measured/sarathi/saturation/repeat_0/steps.parquet")]
    assert (options.model_spec, options.trials, options.seed, options.ops, options.out) == (
        "llama-3-8b", 3, 7, None, str(tmp_path / "tables"))
    assert config.kernel_ops() == []     # no GEMMs profiled: no kernel-only tables to calibrate
    assert not config.profiled_ops()     # no host op profiled: no tables from the profile alone
    # the device's noise policy reaches the sweeps, the run and the fit: no shared-CPU mechanism on cuda
    cuda = NoisePolicy.for_device("cuda")
    assert calls["noise"] == [cuda, cuda, cuda] and options.noise == cuda and not cuda.mark_slowed_windows


def test_bursty_arrivals_make_a_gamma_workload(tmp_path):
    from stepcal.core.workload import load_workload
    config = CampaignConfig(out=tmp_path, arrivals="gamma:4", num_requests=50)
    spec = config.workload(2.0)
    assert spec.startswith("gamma:rate=2,cv=4,n=50,")
    assert len(load_workload(spec, seed=0)) == 50


def test_fit_options_default_to_the_fit_flags():
    """The campaign fits with FitOptions' defaults: they must be what `stepcal fit` does by default."""
    from dataclasses import fields

    from stepcal.experiments.cli import build_parser
    from stepcal.experiments.fitting import FitOptions
    args = build_parser().parse_args(["fit", "--profile", "p.parquet", "--out", "t"])
    options = FitOptions(profile=["p.parquet"], out="t")
    assert {f.name: getattr(options, f.name) for f in fields(FitOptions)} == {
        f.name: getattr(args, f.name) for f in fields(FitOptions)}


def test_a_failing_stage_says_which_stage_and_command(tmp_path, monkeypatch, capsys):

    def bad_grid(*args, **kwargs):
        raise InputError("--grid nope: no such grid")
    monkeypatch.setattr("stepcal.experiments.campaign.campaign.profile_kernels", bad_grid)
    with pytest.raises(InputError) as failed:
        Campaign(CampaignConfig(out=tmp_path, grid="nope")).run()
    assert str(failed.value) == ("quickstart: stage 'profile kernels (nope grid)' failed (stepcal profile): "
                                 "--grid nope: no such grid")
    assert capsys.readouterr().err.splitlines()[1:] == []     # the stage's line only: the error is said once
    monkeypatch.setattr("stepcal.experiments.campaign.campaign.profile_kernels", lambda *args, **kwargs: SimpleNamespace(complete=False))
    monkeypatch.setattr("stepcal.experiments.campaign.campaign.describe_sweep", lambda result: "incomplete")
    with pytest.raises(InputError, match=r"\(stepcal profile exited 3\)$"):
        Campaign(CampaignConfig(out=tmp_path)).run()


def test_repeats_interleave_and_every_other_pass_is_rotated_by_half(tmp_path, monkeypatch):
    import stepcal.profiler.engine.measure as measure
    outs = []
    monkeypatch.setattr(Campaign, "measure", lambda self, scheduler, workload, out: outs.append((str(out), workload)))
    monkeypatch.setattr(measure, "combine_repeats",
                        lambda parts, out, kept, noise=None: outs.append(("combine", len(parts), str(out), kept)))
    monkeypatch.setattr(Campaign, "serve_slowed_again", lambda self, *args: ())   # no step logs here
    (tmp_path / "measured" / ".repeats").mkdir(parents=True)
    config = CampaignConfig(out=tmp_path, schedulers=("a", "b"), loads=(0.3, 0.9), repeats=2)
    Campaign(config).measure_interleaved({"a": 10.0, "b": 20.0})
    parts = [o[0].split(".repeats/")[1] for o in outs[:8]]
    assert parts == ["a/load_30/0", "a/load_90/0", "b/load_30/0", "b/load_90/0",
                     "b/load_30/1", "b/load_90/1", "a/load_30/1", "a/load_90/1"]
    assert outs[0][1] == config.workload(3.0) and outs[3][1] == config.workload(18.0)   # load x capacity
    assert outs[8:] == [("combine", 2, str(tmp_path / "measured" / s / n), ()) for s in "ab" for n in ("load_30", "load_90")]
    assert not (tmp_path / "measured" / ".repeats").exists()


@pytest.mark.parametrize("schedulers, loads", [(("a", "b"), (0.3, 0.6, 0.9)), (("a",), (0.3, 0.6, 0.9)),
                                                 (("a", "b"), (0.3, 0.6, 0.75, 0.9))])
def test_every_runs_repeats_lie_half_a_pass_apart_and_centred(tmp_path, schedulers, loads):
    order = CampaignConfig(out=tmp_path, schedulers=schedulers, loads=loads, repeats=2).interleaved()
    n = len(schedulers) * len(loads)
    places = {}
    for i, (_k, s, load) in enumerate(order):
        places.setdefault((s, load), []).append(i)
    assert len(order) == 2 * n and all(len(p) == 2 for p in places.values())
    assert min(b - a for a, b in places.values()) >= n // 2 and max(b - a for a, b in places.values()) < 2 * n
    middle = (2 * n - 1) / 2
    assert max(abs((a + b) / 2 - middle) for a, b in places.values()) <= n / 4   # same order each pass: (n - 1) / 2


def test_a_repeat_the_machine_slowed_is_served_again_at_most_twice_and_named(tmp_path, monkeypatch, capsys):
    from stepcal.profiler.engine.slowdown import SlowestWindow
    served = []
    monkeypatch.setattr(Campaign, "measure", lambda self, scheduler, workload, out: served.append((scheduler, workload, out)))
    monkeypatch.setattr("stepcal.experiments.campaign.campaign.read_measured_run", lambda d: SimpleNamespace(repeats=[SimpleNamespace(steps=d, summary={})]))
    clean, slowed = SlowestWindow(1.05, 0.0, 0.1), SlowestWindow(1.6, 1.25, 2.5)
    later = SlowestWindow(1.5, 3.0, 3.5)
    # run a: repeat 2 slowed, then clean once served again; run b: repeat 1 slowed each time somewhere
    # else; run c: repeat 1 slowed in the same place when served again
    answers = {"a": [[clean, slowed], [clean, clean]], "b": [[slowed, clean], [later, clean], [slowed, clean]],
               "c": [[slowed, clean]] * 3}
    monkeypatch.setattr("stepcal.profiler.engine.measure.slowest_windows", lambda logs: answers[logs[0].parts[-3]].pop(0))
    campaign = Campaign(CampaignConfig(out=tmp_path, schedulers=("a", "b", "c"), loads=(0.6,), repeats=2))
    parts = tmp_path / "parts"
    kept = [campaign.serve_slowed_again(scheduler, 0.6, 10.0, parts) for scheduler in "abc"]
    assert [(s, out.relative_to(parts).as_posix()) for s, _, out in served] == [
        ("a", "a/load_60/1"), ("b", "b/load_60/0"), ("b", "b/load_60/0"),   # b: twice, then kept
        ("c", "c/load_60/0")]                                                # c: once, then kept
    assert served[0][1] == campaign.c.workload(6.0) and answers["b"] == [] and answers["c"] == [[slowed, clean]]
    # b, slowed somewhere else each time, is the machine's; c's stretch is the engine's own, flagged so
    assert kept == [(), (), (0,)]
    assert campaign.served_again[0] == "a 60% repeat 2: steps 1.60x their usual time from 1.25 to 2.50 s"
    assert len(campaign.served_again) == 4
    err = capsys.readouterr().err
    assert "measure a at 60% load again (repeat 2 of 2: the machine slowed it" in err
    assert ("c at 60% load, repeat 1: steps 1.60x their usual time from 1.25 to 2.50 s again, in the same place, "
            "when served again: kept, as the engine's own") in err
    assert "b at 60% load, repeat 1" not in err


def test_a_campaign_told_not_to_retry_serves_no_slowed_repeat_again(tmp_path, monkeypatch):
    # gpu/gpu_campaign.py: a device lent for minutes has no time for repeats served again
    from stepcal.profiler.engine.slowdown import SlowestWindow
    served = []
    monkeypatch.setattr(Campaign, "measure", lambda self, scheduler, workload, out: served.append(out))
    monkeypatch.setattr("stepcal.experiments.campaign.campaign.read_measured_run", lambda d: SimpleNamespace(repeats=[SimpleNamespace(steps=d, summary={})]))
    monkeypatch.setattr("stepcal.profiler.engine.measure.slowest_windows", lambda logs: [SlowestWindow(1.6, 1.25, 2.5), SlowestWindow(1.05, 0.0, 0.1)])
    no_retry = NoisePolicy.for_device("cpu").with_retry_slowed(0)
    campaign = Campaign(CampaignConfig(out=tmp_path, schedulers=("a",), loads=(0.6,), repeats=2, noise=no_retry))
    assert campaign.serve_slowed_again("a", 0.6, 10.0, tmp_path / "parts") == () and served == []
    assert campaign.served_again == []


def test_each_calibration_pools_run_cv_with_the_other_calibration_runs_and_the_profile_halves(tmp_path, monkeypatch):
    calls = []
    hints = []
    monkeypatch.setattr("stepcal.experiments.campaign.campaign.calibrate_step_model",
                        lambda measured, tables, out, scatter_runs=(), scatter_profiles=(), history=(), step_log=True,
                        retry_hint=None: calls.append((measured, tables, out, scatter_runs, scatter_profiles, step_log))
                        or hints.append(retry_hint))
    config = CampaignConfig(out=tmp_path, schedulers=("a", "b", "c"), loads=(0.3, 0.9), repeats=2)
    models = {s: {"profiled": f"P{s}"} for s in config.schedulers}
    campaign = Campaign(config)
    campaign.profiled = ["profile", "profile_late"]   # profiled before and after the measurements
    campaign.calibrate_all(models, [("profiled", "profiled_cal")])
    run = {s: str(config.measured_dir(s, 0.3)) for s in "abc"}
    halves = [str(tmp_path / "profile/profile.parquet"), str(tmp_path / "profile_late/profile.parquet")]
    # request logs only (step_log=False): the campaign's calibrated models stand for a deployment's user
    assert calls == [(run["a"], "Pa", str(tmp_path / "profiled_cal/a"), [run["b"], run["c"]], halves, False),
                     (run["b"], "Pb", str(tmp_path / "profiled_cal/b"), [run["a"], run["c"]], halves, False),
                     (run["c"], "Pc", str(tmp_path / "profiled_cal/c"), [run["a"], run["b"]], halves, False)]
    assert models["b"] == {"profiled": "Pb", "profiled_cal": tmp_path / "profiled_cal/b"}   # validated next
    # a repeat still slowed here was served again as often as the campaign does: the warning says so
    assert hints == [RETRY_SPENT] * 3 and "again 2 times, its most" in RETRY_SPENT
    single = CampaignConfig(out=tmp_path, schedulers=("a", "b"), loads=(0.3, 0.9), repeats=1)
    calls.clear()
    Campaign(single).calibrate_all({s: {"kernels": "K"} for s in "ab"}, [("kernels", "calibrated")])
    assert [c[3:5] for c in calls] == [([], []), ([], [])]   # one repeat: no pair to pool
    history = CampaignConfig(out=tmp_path, schedulers=("a", "b"), loads=(0.3, 0.9), repeats=2,
                             scatter_runs=("/old/campaign", "/old/run"))
    calls.clear()
    Campaign(history).calibrate_all({s: {"kernels": "K"} for s in "ab"}, [("kernels", "calibrated")])
    assert [c[3] for c in calls] == [[run["b"], "/old/campaign", "/old/run"], [run["a"], "/old/campaign", "/old/run"]]


def _campaign_of_runs(root, runs, workers):
    """A campaign directory whose calibration runs (schedulers a and b at 30%) are the given measured runs."""
    import shutil
    config = CampaignConfig(out=root, schedulers=("a", "b"), loads=(0.3, 0.9), repeats=2, workers=workers)
    for s, run in zip(config.schedulers, runs):
        shutil.copytree(run, config.measured_dir(s, 0.3))
    return Campaign(config)


@pytest.mark.slow
def test_calibrations_on_two_processes_write_and_print_what_one_process_does(paired_runs, tmp_path, capsys):
    made = {}
    for workers in (1, 2):
        campaign = _campaign_of_runs(tmp_path / str(workers), [paired_runs["a"], paired_runs["b"]], workers)
        models = {s: {"kernels": "const:1"} for s in "ab"}
        campaign.calibrate_all(models, [("kernels", "calibrated")])
        assert models["b"] == {"kernels": "const:1", "calibrated": tmp_path / str(workers) / "calibrated/b"}
        made[workers] = {s: json.loads((tmp_path / str(workers) / "calibrated" / s / "meta.json").read_text())
                         for s in "ab"}
        stages = [line.split("] ", 1)[1] for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
        assert [stage for stage in stages if stage.startswith("calibrate host")] == list(campaign.c.timings) == [
            f"calibrate host terms of the kernels tables on {s} at 30% load" for s in "ab"]
        assert all(seconds > 0 for seconds in campaign.c.timings.values())   # each its own calibration's time
    assert stages[0] == "calibrate 2 tables, 2 at a time"
    for s, meta in made[1].items():
        assert made[2][s]["host_terms"] == meta["host_terms"], s
        assert made[2][s]["calibration"]["loss_after"] == meta["calibration"]["loss_after"], s


def test_a_calibration_failing_in_a_worker_names_its_stage_in_one_line(paired_runs, tmp_path):
    campaign = _campaign_of_runs(tmp_path, [paired_runs["a"], paired_runs["b"]], workers=2)
    models = {s: {"kernels": str(tmp_path / "no_tables")} for s in "ab"}
    with pytest.raises(InputError, match=r"^quickstart: stage 'calibrate host terms of the kernels tables on a at "
                                         r"30% load' failed \(stepcal calibrate\): .*no_tables"):
        campaign.calibrate_all(models, [("kernels", "calibrated")])
    assert not (tmp_path / "calibrated").exists()
