import json

import numpy as np
import pytest

from stepcal.core.batch import StepBatch
from stepcal.core.measured_run import RunStats
from stepcal.experiments.calibration import OBJECTIVE, SUMMARY_OBJECTIVE, TERM_NAMES, calibrate
from stepcal.experiments.calibration.search import _step_scale_ms
from stepcal.experiments.cli import main
from stepcal.experiments.step_models import resolve_step_model
from stepcal.experiments.validation.measured import load_measured_run
from stepcal.simulator.step_model import HostTerms, HostTermsModel, LinearStepModel
from tests.experiments.simulated_truth import served_as


def test_host_terms_add_to_every_path_bit_identically():
    model = HostTermsModel(LinearStepModel(2.0, 0.01, 0.001), HostTerms(0.5, 0.1, 0.002, 7.0))
    batch = StepBatch.of([0, 1, 2], [1, 1, 40], [10, 20, 0])
    assert model.step_ms(batch) == pytest.approx(2.0 + 0.01 * 42 + 0.001 * (30 + 42) + 0.5 + 0.1 * 3 + 0.002 * 42)
    assert model.features_ms(batch.features())[0] == model.step_ms(batch)
    kv = np.array([5, 9])
    run = model.decode_run_ms(kv, 4)
    assert run.tolist() == [model.step_ms(StepBatch.of([0, 1], [1, 1], kv + j)) for j in range(4)]
    assert model.per_request_ms == 7.0


def test_calibration_recovers_host_time_a_base_model_misses(measured):
    """The measured workload served at a constant step time (a run simulated from it, so that the
    figures do not depend on this machine's speed); a base model at half that step time: calibration
    must add the missing host time."""
    from stepcal.experiments.validation.measured import sim_config_for
    from stepcal.simulator.simulation import simulate
    step_ms = 2.0     # the truth's step time: the same load on any machine (as test_calibration_bias)
    truth = simulate(measured.trace, LinearStepModel(step_ms, 0.0, 0.0), sim_config_for(measured))
    run = served_as(measured, truth)
    steps = run.steps
    result = calibrate(run, LinearStepModel(step_ms / 2, 0.0, 0.0), max_simulations=120, step_log=False)
    assert result.loss_after < result.loss_before / 4
    # with the terms, the model's time for the measured batches is near the true step time again (it
    # was half of it); not exactly: the fit matches latencies, which queueing makes nonlinear in step time
    t = result.terms
    added_ms = t.per_step_ms + t.per_seq_ms * steps["num_seqs"] + t.per_token_ms * steps["num_tokens"]
    # with the engine's own batches (their mix the machine's) this was within 3.2% in 24 runs here and
    # 6.1% once on CI; on the truth's batches, the same on any machine
    assert step_ms / 2 + added_ms.mean() == pytest.approx(step_ms, rel=0.05)
    assert abs(result.errors_after[("tpot_ms", "p50")]) < abs(result.errors_before[("tpot_ms", "p50")])


def test_calibrate_cli_writes_a_step_model_directory(measured, tmp_path, capsys):
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(measured.path), "--step-model", "const:1",
                 "--max-simulations", "60", "--quiet", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["kind"] == "builtin" and meta["step_model"] == "const:1"
    assert set(meta["host_terms"]) == set(HostTerms().to_dict())
    model = resolve_step_model(str(out))
    assert isinstance(model, HostTermsModel) and model.terms.to_dict() == meta["host_terms"]
    calibration = meta["calibration"]
    assert calibration["loss_after"] < calibration["loss_before"]
    assert list(calibration["errors_after"]) == calibration["objective"] == [f"{m}.{s}" for m, s in OBJECTIVE]
    assert calibration["measured_run"] == str(measured.path)
    assert calibration["uncertainty"]["noise"] == "bootstrap"    # one repeat: no step scatter measured
    # the calibrated directory is a step model for validate, which replays exactly what calibration fitted
    assert main(["validate", "--measured", str(measured.path), "--step-model", str(out), "--quiet",
                 "--out", str(tmp_path / "v")]) == 0
    record = json.loads((tmp_path / "v" / "validation.json").read_text())
    for metric, stat in SUMMARY_OBJECTIVE:   # the TTFT slope is calibration's, not a validated metric
        error = calibration["errors_after"][f"{metric}.{stat}"]
        assert record["metrics"][metric][stat]["error"] == pytest.approx(error, abs=1e-12), (metric, stat)


def test_a_per_step_gap_is_fitted_as_per_step_time_not_per_sequence(measured):
    """A run whose every step costs 1.5 ms more than the base model: calibration finds it in the per-step
    term, and the per-sequence and per-token terms add next to nothing to a step."""
    from stepcal.experiments.validation.measured import sim_config_for
    from stepcal.simulator.simulation import simulate
    base = LinearStepModel(1.0, 0.02, 0.0005)
    truth = HostTermsModel(base, HostTerms(1.5, 0.0, 0.0, 0.0))
    simulated = simulate(measured.trace, truth, sim_config_for(measured))
    run = served_as(measured, simulated)
    result = calibrate(run, base, max_simulations=150, step_log=False)
    # A TTFT slope a little above the base's starts a per-token term, and the search of all four may
    # then keep a small per-sequence one (0.022 ms with 1.47 ms per step once, on CI's engine batches):
    # together they stay a few per cent of the step's gap.
    t, steps = result.terms, run.steps
    added_ms = t.per_seq_ms * steps["num_seqs"].mean() + t.per_token_ms * steps["num_tokens"].mean()
    assert added_ms < 0.1 * 1.5
    assert result.terms.per_step_ms == pytest.approx(1.5, rel=0.1)
    assert result.loss_after < result.loss_before / 100


def test_per_sequence_and_per_token_time_found_at_a_low_load_carries_to_three_times_it():
    """A chunked-prefill run whose host time has per-step, per-sequence and per-token parts (0.45 ms,
    0.03 ms and 0.008 ms: the CPU engine's, from its step logs) and a constant request path. At a low
    load the prefill chunks' per-token cost looks like a skewed front end; the fit must find it as
    step time (searched from the two-term fit alone, it kept 0.61 ms per step and a front-end shape
    instead, and three times the load came out 10-31% fast), so that three times the load is right."""
    from stepcal.core.workload import load_workload
    from stepcal.simulator.simulation import SimConfig, simulate
    base = LinearStepModel(1.0, 0.02, 0.0005)
    truth = HostTermsModel(base, HostTerms(per_step_ms=0.45, per_seq_ms=0.03, per_token_ms=0.008,
                                           per_request_ms=0.3))
    shape = "prompt=lognormal:128:0.8,output=lognormal:32:0.8"
    low = synthetic_run(load_workload(f"poisson:rate=20,n=200,{shape}", seed=1), truth, front_end_seed=5)
    result = calibrate(low, base, max_simulations=300, uncertainty=False)
    assert not result.front_end["kept"] and result.terms.per_token_ms > 0.004
    high = load_workload(f"poisson:rate=60,n=200,{shape}", seed=2)
    config = SimConfig(scheduler="vllm", record_batches=False)
    true, fitted = (simulate(high, model, config).summary for model in (truth, HostTermsModel(base, result.terms)))
    for metric in ("ttft_ms", "tpot_ms"):
        for stat in ("p50", "p90"):
            assert fitted[metric][stat] == pytest.approx(true[metric][stat], rel=0.15), (metric, stat)


def test_search_terms_are_the_host_terms_in_their_natural_units(measured):
    """The first search's vector is HostTerms' first four fields in order (the front end's shape is
    searched after); each term's unit is a typical step, per sequence and per token of a step, and a
    typical TTFT for the request path."""
    assert TERM_NAMES == tuple(HostTerms().to_dict())[:4]
    step_ms, ttft_ms = measured.stats.stat("tpot_ms", "p50"), measured.stats.stat("ttft_ms", "p50")
    seqs, tokens = measured.steps["num_seqs"].mean(), measured.steps["num_tokens"].mean()
    assert _step_scale_ms(measured).tolist() == pytest.approx([step_ms, step_ms / max(seqs, 1.0),
                                                               step_ms / max(tokens, 1.0), ttft_ms])


def synthetic_run(trace, model, front_end_seed: int, scatter=None):
    """A measured run that is a simulation: its request log, step log and statistics, as validate and
    calibrate read them (front-end draws seeded apart from calibration's own seed 0; `scatter`, a
    simulator.scatter.Scatter, drawn from the same seed)."""
    from dataclasses import asdict
    from pathlib import Path

    from stepcal.core.run_meta import RunMeta
    from stepcal.experiments.validation.measured import MeasuredRun
    from stepcal.simulator.schedulers import SchedulerConfig
    from stepcal.simulator.simulation import SimConfig, simulate
    config = SimConfig(scheduler="vllm", front_end=model.front_end, front_end_seed=front_end_seed,
                       scatter=scatter, scatter_seed=front_end_seed, record_batches=False)
    result = simulate(trace, model, config)
    meta = RunMeta(scheduler="vllm", scheduler_config=asdict(SchedulerConfig()), block_size=16, kv_blocks=None,
                   prefix_caching=False)
    return MeasuredRun(Path("synthetic"), meta, trace, result.requests, result.steps,
                       RunStats.from_summary(result.summary))


def test_calibration_recovers_a_front_end_distribution_and_its_load_part():
    """A run served with a log-normal request path (median 25 ms, sigma 0.5) and 3 ms per active stream,
    drawn with another seed than calibration simulates with: the fit recovers the three from the
    TTFT distribution, each within three of its standard errors (and the step terms stay near zero,
    the base model being the true one)."""
    from stepcal.core.workload import load_workload
    base = LinearStepModel(4.0, 0.02, 0.0005)
    truth = HostTerms(per_request_ms=25.0, per_request_sigma=0.5, per_stream_ms=3.0)
    trace = load_workload("poisson:rate=12,n=300,prompt=uniform:64:512,output=uniform:16:128", seed=3)
    run = synthetic_run(trace, HostTermsModel(base, truth), front_end_seed=99)
    # 90 (+ 70 + 15) simulations, about 10 s: with a third of that, the first search stops before it
    # has separated per-step time from the front end's tail
    result = calibrate(run, base, max_simulations=90)
    assert result.front_end["kept"]
    t, err = result.terms, result.std_err
    for name, tolerance in (("per_request_ms", 0.2), ("per_request_sigma", 0.25), ("per_stream_ms", 0.4)):
        true = getattr(truth, name)
        assert getattr(t, name) == pytest.approx(true, rel=tolerance), name
        assert err[name] is not None and 0 < err[name] < true, name
        assert abs(getattr(t, name) - true) < 3 * err[name] + 0.02 * true, name
    assert t.per_step_ms < 0.5
    # the calibrated model reproduces the TTFT tail that was not fitted
    assert result.errors_after[("ttft_ms", "p90")] == pytest.approx(0.0, abs=0.05)


def test_calibration_keeps_a_constant_front_end_constant(measured):
    """A run whose request path is a constant: the shape terms do not earn their place."""
    from stepcal.experiments.validation.measured import sim_config_for
    from stepcal.simulator.simulation import simulate
    base = LinearStepModel(1.0, 0.02, 0.0005)
    truth = HostTerms(per_step_ms=0.5, per_request_ms=6.0)
    simulated = simulate(measured.trace, HostTermsModel(base, truth), sim_config_for(measured, 0.0, truth.front_end))
    run = served_as(measured, simulated)
    result = calibrate(run, base, max_simulations=150, step_log=False)   # the truth's requests, not its step times
    assert not result.front_end["kept"]
    assert result.terms.per_request_sigma == 0.0 and result.terms.per_stream_ms == 0.0
    assert result.terms.per_request_ms == pytest.approx(6.0, rel=0.15)


def test_calibrate_stores_the_measured_scatter_and_ranges_draw_it(tmp_path):
    """Two repeats of a run give the device's step-time scatter (experiments.validation.noise) and
    the run-to-run speed; calibrate stores them with the tables, and --ranges takes them unless
    flags say otherwise."""
    run = tmp_path / "run"
    assert main(["measure", "--trace", "poisson:rate=30,n=30,prompt=uniform:8:60,output=uniform:2:12",
                 "--scheduler", "continuous", "--repeats", "2", "--quiet", "--out", str(run)]) == 0
    out = tmp_path / "cal"
    assert main(["calibrate", "--measured", str(run), "--step-model", "const:1", "--max-simulations", "30",
                 "--quiet", "--out", str(out)]) == 0
    scatter = json.loads((out / "meta.json").read_text())["scatter"]
    from stepcal.experiments.validation.noise import run_noise
    from stepcal.experiments.validation.steps import step_noise_floor
    noise, floor = run_noise(load_measured_run(run)), step_noise_floor(load_measured_run(run))
    assert scatter["cv"] == pytest.approx(np.sqrt(np.expm1(noise.sigma_log ** 2))) and scatter["rho"] == noise.rho
    assert scatter["run_cv"] == pytest.approx(np.sqrt(np.expm1(np.log1p(floor.total_difference) ** 2 / 2)))

    def ranges_of(*flags):
        v = tmp_path / f"v{len(flags)}"
        assert main(["validate", "--measured", str(run), "--step-model", str(out), "--ranges", "3", "--quiet",
                     "--out", str(v), *flags]) == 0
        return json.loads((v / "validation.json").read_text())["ranges"]
    # The calibrated terms are fitted to both repeats: the model carries that run's speed.
    assert (scatter["run_cv_pairs"], scatter["model_level_repeats"]) == (1, 2)
    stored = ranges_of()
    assert (stored["scatter_cv"], stored["scatter_rho"], stored["scatter_run_cv"], stored["scatter_source"]) == (
        scatter["cv"], scatter["rho"], scatter["run_cv"], "tables")
    # The model's level carries the run's speed by default; run_cv is taken as exact unless asked.
    assert (stored["scatter_run_cv_pairs"], stored["scatter_model_repeats"]) == (0, 2)
    given = ranges_of("--scatter-cv", "0", "--scatter-rho", "0", "--scatter-run-cv", "0")
    assert (given["scatter_cv"], given["scatter_run_cv"], given["scatter_source"]) == (0.0, 0.0, "flags")
    counted = ranges_of("--scatter-run-cv", "0.1", "--scatter-run-cv-pairs", "5", "--scatter-model-repeats", "0")
    assert (counted["scatter_run_cv_pairs"], counted["scatter_model_repeats"], counted["scatter_source"]) == (
        5, 0, "flags and tables")


def test_fit_on_step_logs_of_two_repeats_stores_their_scatter(tmp_path, capsys):
    from stepcal.experiments.validation.scatter import measured_scatter
    run = tmp_path / "run"
    assert main(["measure", "--trace", "poisson:rate=30,n=30,prompt=uniform:8:60,output=uniform:2:12",
                 "--scheduler", "continuous", "--repeats", "2", "--quiet", "--out", str(run)]) == 0
    logs = [str(run / f"repeat_{k}" / "steps.parquet") for k in (0, 1)]
    assert main(["fit", "--profile", *logs, "--regressor", "rf", "--no-mlflow", "--out", str(tmp_path / "t")]) == 0
    scatter = json.loads((tmp_path / "t" / "meta.json").read_text())["scatter"]
    expected = measured_scatter(load_measured_run(run))
    assert {k: scatter[k] for k in ("cv", "rho", "run_cv")} == {k: expected[k] for k in ("cv", "rho", "run_cv")}
    assert scatter["runs"] == [str(run)]
    assert "step-time scatter from 1 measured run(s)" in capsys.readouterr().out
    # a step log copied out of its run has no second repeat to pair with: no scatter
    import shutil
    (tmp_path / "alone").mkdir()
    shutil.copy(logs[0], tmp_path / "alone" / "steps.parquet")
    assert main(["fit", "--profile", str(tmp_path / "alone" / "steps.parquet"), "--regressor", "rf", "--no-mlflow",
                 "--out", str(tmp_path / "u")]) == 0
    assert "scatter" not in json.loads((tmp_path / "u" / "meta.json").read_text())


# --- every repeat of a run: statistics averaged over repeats, each grouped in its own queue ----

def two_repeat_run(trace, model, seeds=(99, 98), scatter=None):
    """A measured run of two repeats that are simulations served with different front-end draws (and
    step scatter, given one)."""
    from dataclasses import replace

    from stepcal.experiments.validation.measured import mean_over_repeats
    first, second = (synthetic_run(trace, model, front_end_seed=seed, scatter=scatter) for seed in seeds)
    stats = mean_over_repeats([first.stats, second.stats])
    return replace(first, stats=stats, later_requests=(second.requests,), num_repeats=2), first


def test_pooled_statistics_of_one_repeat_are_that_repeat_s_and_a_second_one_narrows_them(measured):
    from stepcal.experiments.calibration.request_stats import (
        FRONT_OBJECTIVE,
        LoadGroups,
        active_at_arrival,
        measured_group_stats,
        pooled_bootstrap_log_covariance,
        repeat_groups,
    )
    log = measured.requests
    one = measured_group_stats([log], repeat_groups([log]))
    # independently: light load is at most the median number of other active streams at arrival
    active = active_at_arrival(log["arrival_s"].to_numpy(), log["finish_s"].to_numpy())
    light = log["ttft_ms"].to_numpy()[active <= np.median(active)]
    assert one[("ttft_ms", "light_load.p50")] == np.percentile(light, 50)
    # a repeat served exactly alike adds no information about the means, and halves their bootstrap variance
    assert measured_group_stats([log, log], repeat_groups([log, log])) == one
    keys = [("ttft_ms", "p50"), ("e2e_ms", "p90"), *FRONT_OBJECTIVE[:3]]
    single = np.diag(pooled_bootstrap_log_covariance([log], [LoadGroups.of(log)], keys))
    pooled = np.diag(pooled_bootstrap_log_covariance([log, log], repeat_groups([log, log]), keys))
    assert (pooled < single).all() and np.mean(pooled / single) == pytest.approx(0.5, abs=0.15)


def test_calibration_fits_every_repeat_against_its_own_queue():
    """Two repeats of a run served with a log-normal request path and a per-stream part (different draws in
    each): the fit uses both (each repeat's requests grouped by that repeat's active streams), recovers the
    front end within three standard errors, and states how many repeats it fitted."""
    from stepcal.core.workload import load_workload
    base = LinearStepModel(4.0, 0.02, 0.0005)
    truth = HostTerms(per_request_ms=25.0, per_request_sigma=0.5, per_stream_ms=3.0)
    trace = load_workload("poisson:rate=12,n=300,prompt=uniform:64:512,output=uniform:16:128", seed=3)
    run, _ = two_repeat_run(trace, HostTermsModel(base, truth))
    result = calibrate(run, base, max_simulations=90)
    assert result.num_repeats == 2 and result.to_dict()["num_repeats"] == 2
    assert result.front_end["kept"]
    for name in ("per_request_ms", "per_request_sigma", "per_stream_ms"):
        true, err = getattr(truth, name), result.std_err[name]
        assert err is not None and 0 < err < true, name
        assert abs(getattr(result.terms, name) - true) < 3 * err + 0.02 * true, name
