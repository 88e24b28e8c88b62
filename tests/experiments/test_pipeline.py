"""The whole campaign on a miniature grid and workload: every stage runs and hands its output on."""
import json

import pytest

from experiments.pipeline import Campaign, CampaignConfig, format_headline

SMALL_GRID = {
    "timing": {"max_point_s": 0.05, "min_repeats": 3, "rounds": 1},
    "gemm": {"m": [1, 16, 128]},
    "attn_prefill": {"num_seqs": [1], "q": [16, 64], "s": [0, 64], "patterns": ["uniform"]},
    "attn_decode": {"num_seqs": [1, 8], "s": [64, 256], "patterns": ["uniform"]},
    "step": {"batches": [{"num_decode": 1, "decode_s": 64}, {"num_decode": 8, "decode_s": 128},
                         {"num_prefill": 1, "q": 64, "s": 0}, {"num_prefill": 1, "q": 32, "s": 0,
                                                               "num_decode": 4, "decode_s": 64}]},
    "overhead": {"num_seqs": [1, 8], "s": [64]},
}


@pytest.mark.slow
def test_campaign_runs_every_stage(tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps(SMALL_GRID))
    config = CampaignConfig(out=tmp_path / "qs", schedulers=("continuous",), loads=(0.3, 0.7), num_requests=24,
                            repeats=2, trials=1, grid=str(grid), prompt="uniform:8:48", output="uniform:2:10")
    result = Campaign(config).run()
    out = tmp_path / "qs"
    for path in ("profile/profile.parquet", "tables/meta.json", "calibrated/continuous/meta.json",
                 "measured/continuous/load_30/repeat_1/steps.parquet", "report/report.html", "headline.json"):
        assert (out / path).exists(), path
    assert result["capacity_rps"]["continuous"] > 0
    rows = result["rows"]
    assert [(r["load"], r["model"], r["held_out"]) for r in rows] == [
        (0.3, "tables", False), (0.3, "kernels", False), (0.3, "calibrated", False),
        (0.7, "tables", True), (0.7, "kernels", True), (0.7, "calibrated", True)]
    kernels = json.loads((out / "tables_kernels/meta.json").read_text())
    assert kernels["mode"] == "composed" and "step" not in kernels["targets"]
    assert all(r["ttft_ms.p50.noise"] is not None and r["step_mape"] is not None for r in rows)
    assert all(r["step_total"] is not None and r["e2e_ms.p50.step_matched"] is not None for r in rows)
    calibrated = json.loads((out / "calibrated/continuous/meta.json").read_text())
    assert calibrated["host_terms"] is not None and "calibration" in calibrated
    assert "continuous" in format_headline(result)


def test_target_summary_counts_cells_against_noise_and_fixed_bounds():
    from experiments.pipeline import target_summary

    def row(err, noise, p99, held_out=True, model="tables"):
        r = {"held_out": held_out, "model": model}
        for m in ("ttft_ms", "tpot_ms", "e2e_ms"):
            r.update({f"{m}.p50": err, f"{m}.p50.noise": noise, f"{m}.p90": err, f"{m}.p90.noise": noise,
                      f"{m}.p99": p99})
        return r
    rows = [row(0.04, 0.0, 0.09),            # inside 5%, inside 10%
            row(-0.12, 0.10, 0.2),           # inside 1.5 x noise (15%), P99 outside
            row(0.2, 0.1, 0.0),              # outside both
            row(0.5, 0.0, 0.5, held_out=False),       # calibration run: not counted
            row(0.5, 0.0, 0.5, model="calibrated")]   # another model: counted on its own line
    assert target_summary(rows).splitlines() == [
        "held-out runs, tables: 12 of 18 P50/P90 errors within max(5%, 1.5 x noise); 6 of 9 P99 errors within 10%",
        "held-out runs, calibrated: 0 of 6 P50/P90 errors within max(5%, 1.5 x noise); 0 of 3 P99 errors within 10%"]


def test_target_summary_says_which_misses_are_step_time():
    from experiments.pipeline import target_summary

    def row(err, matched, preempted=(0, 0)):
        r = {"held_out": True, "model": "tables", "preemptions.measured": preempted[0],
             "preemptions.simulated": preempted[1]}
        for m in ("ttft_ms", "tpot_ms", "e2e_ms"):
            for s in ("p50", "p90", "p99"):
                r.update({f"{m}.{s}": err, f"{m}.{s}.noise": 0.0, f"{m}.{s}.step_matched": matched})
        return r
    rows = [row(0.2, 0.03),                 # misses, within every target once step time matches
            row(0.2, 0.07, (2, 5)),         # P50/P90 still miss (5%), P99 then within 10%
            row(0.01, 0.5)]                 # met: its step-matched value does not count
    lines = target_summary(rows).splitlines()
    assert lines[0] == ("held-out runs, tables: 6 of 18 P50/P90 errors within max(5%, 1.5 x noise); "
                        "3 of 9 P99 errors within 10%")
    assert lines[1].startswith("  misses: 12 of 18 are step time") and "6 remain with it matched" in lines[1]
    assert lines[2] == "  preemptions (KV capacity): measured 2, simulated 5"


def test_training_logs_take_every_schedulers_calibration_repeats_and_saturation_run(tmp_path):
    from experiments.pipeline import training_logs
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
    (["--device", "tpu"], "--device tpu"),
    (["--chunk-size", "0"], "--chunk-size 0"),
    (["--num-requests", "5"], "--num-requests >= 20"),
])
def test_quickstart_rejects_bad_flags_in_one_line_before_any_work(tmp_path, capsys, flags, message):
    from experiments.cli import main
    out = tmp_path / "qs"
    assert main(["quickstart", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not out.exists()


def test_campaign_passes_device_model_and_profile_ops_to_the_stages(tmp_path, monkeypatch):
    import experiments.pipeline as pipeline
    calls = []
    monkeypatch.setattr(pipeline.Campaign, "stage", lambda self, title, argv: calls.append([str(a) for a in argv]))
    monkeypatch.setattr(pipeline, "_summary", lambda path: {"throughput_rps": 10.0})
    monkeypatch.setattr(pipeline.Campaign, "measure_interleaved", lambda self, capacity: None)
    config = CampaignConfig(out=tmp_path, device="cuda", model_spec="llama-3-8b", profile_ops="step,overhead",
                            schedulers=("sarathi",), chunk_size=512)
    with pytest.raises(FileNotFoundError):     # stops at the headline: no stage really ran
        Campaign(config).run()
    profile = calls[0]
    assert profile[:5] == ["profile", "--model-spec", "llama-3-8b", "--device", "cuda"]
    assert profile[profile.index("--ops") + 1] == "step,overhead"
    saturation = calls[1]
    assert saturation[saturation.index("--chunk-size") + 1] == "512" and "cuda" in saturation


def test_repeats_interleave_and_every_other_pass_runs_in_reverse(tmp_path, monkeypatch):
    import experiments.pipeline as pipeline
    import profiler.engine.measure as measure
    outs = []
    monkeypatch.setattr(pipeline.Campaign, "stage", lambda self, title, argv: outs.append(str(argv[-1])))
    monkeypatch.setattr(measure, "combine_repeats", lambda parts, out: outs.append(("combine", len(parts), str(out))))
    (tmp_path / "measured" / ".repeats").mkdir(parents=True)
    config = CampaignConfig(out=tmp_path, schedulers=("a", "b"), loads=(0.3, 0.9), repeats=2)
    Campaign(config).measure_interleaved({"a": 10.0, "b": 20.0})
    parts = [o.split(".repeats/")[1] for o in outs[:8]]
    assert parts == ["a/load_30/0", "a/load_90/0", "b/load_30/0", "b/load_90/0",
                     "b/load_90/1", "b/load_30/1", "a/load_90/1", "a/load_30/1"]
    assert outs[8:] == [("combine", 2, str(tmp_path / "measured" / s / n)) for s in "ab" for n in ("load_30", "load_90")]
    assert not (tmp_path / "measured" / ".repeats").exists()
