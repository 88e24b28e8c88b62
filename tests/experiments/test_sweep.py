import importlib.util
import json

import numpy as np
import pandas as pd
import pytest

from stepcal.core.errors import InputError
from stepcal.experiments.cli import main
from stepcal.experiments.sweep import WALL_COLUMN, load_sweep_config, run_sweep
from stepcal.experiments.sweep.config import Slo
from stepcal.experiments.sweep.pareto import best_per_slo, pareto_mask, point_label

CONFIG = """
trace = "poisson:rate=5,n=80,prompt=uniform:32:400,output=uniform:4:60,seed=1"
rates_rps = [5.0, 40.0]
replicas = [1, 2]
step_models = ["linear:8,0.03,0.0002"]

[[schedulers]]
name = "vllm"
max_num_seqs = [8, 256]

[[schedulers]]
name = "sarathi"
chunk_size = 256

[[slos]]
name = "chat"
ttft_ms = 300
tpot_ms = 40
attainment = 0.9
"""
NUM_POINTS = 3 * 2 * 2   # (vllm × 2 settings + sarathi) × replicas × rates


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The sweep run in this process (one worker), the reference for every other backend."""
    path = tmp_path_factory.mktemp("ref") / "sweep.toml"
    path.write_text(CONFIG)
    report = run_sweep(load_sweep_config(path), path.parent / "out")
    return report.frame.drop(columns=WALL_COLUMN)


def test_config_expands_the_grid(config_path):
    config = load_sweep_config(config_path)
    assert len(config.points) == NUM_POINTS and [p.index for p in config.points] == list(range(NUM_POINTS))
    vllm = [p for p in config.points if p.scheduler == "vllm"]
    assert sorted({p.max_num_seqs for p in vllm}) == [8, 256] and {p.chunk_size for p in vllm} == {None}
    assert {(p.rate_rps, p.num_replicas) for p in config.points} == {(5.0, 1), (5.0, 2), (40.0, 1), (40.0, 2)}
    assert config.slos == (Slo("chat", 300.0, 40.0, 0.9),)


def test_summaries_hold_settings_metrics_and_slo_columns(reference):
    assert len(reference) == NUM_POINTS and reference["index"].tolist() == list(range(NUM_POINTS))
    assert (reference["num_finished"] == 80).all()
    for column in ("ttft_ms_p99", "tpot_ms_p99", "throughput_rps", "slo_chat_attainment", "slo_chat_goodput_rps"):
        assert reference[column].notna().all(), column
    # more replicas never hurt P99 TTFT at the high rate here
    high = reference[reference["rate_rps"] == 40.0]
    one, two = (high[high["num_replicas"] == n].set_index(["scheduler", "max_num_seqs"])["ttft_ms_p99"] for n in (1, 2))
    assert (two <= one).all()


def test_two_local_workers_give_identical_results(config_path, reference):
    report = run_sweep(load_sweep_config(config_path), config_path.parent / "out", workers=2)
    assert report.num_run == NUM_POINTS
    pd.testing.assert_frame_equal(report.frame.drop(columns=WALL_COLUMN), reference)


@pytest.mark.slow   # starting a local Ray cluster takes ~10 s
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray (pip install 'stepcal[ray]')")
def test_ray_backend_on_a_local_cluster_gives_identical_results(config_path, reference):
    report = run_sweep(load_sweep_config(config_path), config_path.parent / "out", backend="ray", workers=2)
    assert report.num_run == NUM_POINTS
    pd.testing.assert_frame_equal(report.frame.drop(columns=WALL_COLUMN), reference)


def test_an_interrupted_sweep_resumes_where_it_stopped(config_path, reference):
    out = config_path.parent / "out"
    config = load_sweep_config(config_path)

    def interrupt_after_5(done, total):
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, out, on_progress=interrupt_after_5)
    assert len(list((out / "points").glob("*.json"))) == 5 and not (out / "summaries.parquet").exists()
    report = run_sweep(config, out, workers=2)
    assert (report.num_reused, report.num_run) == (5, NUM_POINTS - 5)
    pd.testing.assert_frame_equal(report.frame.drop(columns=WALL_COLUMN), reference)
    again = run_sweep(config, out)
    assert (again.num_reused, again.num_run) == (NUM_POINTS, 0)


def test_changing_a_shared_setting_reruns_every_point(config_path):
    out = config_path.parent / "out"
    run_sweep(load_sweep_config(config_path), out)
    config_path.write_text(CONFIG.replace("seed=1", "seed=2"))
    report = run_sweep(load_sweep_config(config_path), out)
    assert report.num_run == NUM_POINTS and report.num_reused == 0


def test_pareto_front_and_best_point():
    latency = np.array([10.0, 20.0, 15.0, 30.0, np.nan])
    throughput = np.array([1.0, 3.0, 1.0, 3.0, 9.0])
    assert pareto_mask(latency, throughput).tolist() == [True, True, False, False, False]
    frame = pd.DataFrame({"index": [0, 1, 2], "slo_a_attainment": [0.95, 0.5, 0.91],
                          "slo_a_goodput_rps": [2.0, 9.0, 3.0], "slo_b_attainment": [0.1, 0.2, 0.3],
                          "slo_b_goodput_rps": [1.0, 1.0, 1.0]})
    slos = (Slo("a", 100.0, None, 0.9), Slo("b", 1.0, None, 0.99))
    assert best_per_slo(frame, slos) == {"a": 2, "b": None}


def test_sweep_cli_writes_parquet_plot_and_best(config_path, capsys):
    out = config_path.parent / "cli"
    assert main(["sweep", str(config_path), "--workers", "1", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    record = json.loads((out / "sweep.json").read_text())
    frame = pd.read_parquet(out / "summaries.parquet")
    best = record["best"]["chat"]
    assert stdout.splitlines() == [f"{NUM_POINTS} points: {NUM_POINTS} simulated, 0 reused from {out}/points",
                                   f"best for chat: {point_label(frame.set_index('index', drop=False).loc[best['index']])}",
                                   f"wrote {out}/summaries.parquet, pareto.png, sweep.json"]
    assert best["slo_chat_attainment"] >= 0.9
    assert best["slo_chat_goodput_rps"] == frame.loc[frame["slo_chat_attainment"] >= 0.9, "slo_chat_goodput_rps"].max()
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("text,needle", [
    (CONFIG.replace('name = "sarathi"', 'name = "fifo"'), "schedulers[1].name must be one of"),
    (CONFIG + "\nrate = 3\n", "unknown key slos[0].rate; known: attainment, name"),   # appended: in [[slos]]
    (CONFIG.replace("chunk_size = 256", "chunk = 256"), "unknown key schedulers[1].chunk (did you mean schedulers[1].chunk_size?)"),
    (CONFIG.replace("replicas = [1, 2]", "replicas = [0]"), "replicas"),
    (CONFIG.replace("ttft_ms = 300\ntpot_ms = 40", ""), "ttft_ms and/or tpot_ms"),
    ("trace = [", "not valid TOML"),
])
def test_bad_config_is_one_line_exit_2(tmp_path, capsys, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code = main(["sweep", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("stepcal: ") and err.count("\n") == 1 and needle in err and "bad.toml" in err
    assert not (tmp_path / "out").exists()


def test_bad_backend_arguments():
    with pytest.raises(InputError, match="--workers"):
        run_sweep(None, "unused", workers=0)


def test_the_config_example_in_the_help_is_a_valid_config(tmp_path):
    """`stepcal sweep --help` shows a config: it parses, and expands to the grid it describes."""
    import textwrap

    from stepcal.experiments.commands.sweep import HELP
    example = HELP.split("config example (see experiments/sweep/config.py for every key):\n")[1].split("\n\nexamples:")[0]
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(example))
    config = load_sweep_config(path)
    # rates × replicas × host defaults × (vllm settings + sarathi settings)
    assert len(config.points) == 3 * 2 * 2 * (2 + 2)
    assert {p.host_defaults for p in config.points} == {None, "vllm"}
    assert sorted({p.chunk_size for p in config.points if p.scheduler == "sarathi"}) == [256, 512]
    assert config.slos == (Slo("chat", 500.0, 50.0, 0.9),) and config.duration_s == 600


# --- ranges: each point's figures with a 90% interval -----------------------------------------

RANGED = CONFIG.replace("rates_rps = [5.0, 40.0]\nreplicas = [1, 2]", "rates_rps = 40.0\nranges = 3\nscatter_cv = 0.2")
RANGED_POINTS = 3   # (vllm × 2 settings + sarathi) at one rate, one replica


def test_sweep_ranges_add_intervals_beside_the_plain_columns_and_round_trip_in_the_store(tmp_path, reference):
    path = tmp_path / "sweep.toml"
    path.write_text(RANGED)
    report = run_sweep(load_sweep_config(path), tmp_path / "out")
    frame = report.frame
    plain = reference[(reference["rate_rps"] == 40.0) & (reference["num_replicas"] == 1)].reset_index(drop=True)
    # the plain columns are the plain run's, as without ranges (only the index differs: a smaller grid)
    pd.testing.assert_frame_equal(frame[plain.columns].drop(columns="index"), plain.drop(columns="index"))
    for column in ("ttft_ms_p99", "throughput_rps", "slo_chat_attainment", "slo_chat_goodput_rps"):
        low, median, high = (frame[f"{column}.{k}"].to_numpy(dtype=float) for k in ("low", "median", "high"))
        assert (low <= median).all() and (median <= high).all(), column
    assert (frame["ttft_ms_p99.high"] > frame["ttft_ms_p99.low"]).all()      # the scatter moves every point
    again = run_sweep(load_sweep_config(path), tmp_path / "out")
    assert (again.num_reused, again.num_run) == (RANGED_POINTS, 0)
    pd.testing.assert_frame_equal(again.frame, frame)
    stored = pd.read_parquet(tmp_path / "out" / "summaries.parquet")
    pd.testing.assert_frame_equal(stored, frame.astype(stored.dtypes.to_dict()))


def test_sweep_ranges_without_spread_or_scatter_are_the_plain_run(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(RANGED.replace("scatter_cv = 0.2", "scatter_cv = 0.0"))
    frame = run_sweep(load_sweep_config(path), tmp_path / "out").frame
    for column in ("ttft_ms_p99", "e2e_ms_mean", "slo_chat_attainment"):
        for k in ("low", "median", "high"):
            assert frame[f"{column}.{k}"].tolist() == frame[column].tolist(), (column, k)


def test_a_point_done_without_ranges_is_a_new_point_with_them(tmp_path):
    path = tmp_path / "sweep.toml"
    plain = RANGED.replace("ranges = 3\nscatter_cv = 0.2", "")
    path.write_text(plain)
    first = run_sweep(load_sweep_config(path), tmp_path / "out")
    assert not any("." in column for column in first.frame.columns)
    path.write_text(RANGED)
    ranged = run_sweep(load_sweep_config(path), tmp_path / "out")
    assert (ranged.num_reused, ranged.num_run) == (0, RANGED_POINTS) and "ttft_ms_p99.low" in ranged.frame
    path.write_text(plain)      # back without ranges: the plain results are still there, unmixed
    back = run_sweep(load_sweep_config(path), tmp_path / "out")
    assert (back.num_reused, back.num_run) == (RANGED_POINTS, 0)
    pd.testing.assert_frame_equal(back.frame.drop(columns=WALL_COLUMN), first.frame.drop(columns=WALL_COLUMN))


@pytest.mark.parametrize("text,needle", [
    ("scatter_cv = 0.1\n" + CONFIG, "scatter_cv need(s) ranges = N"),
    (RANGED.replace("ranges = 3", "ranges = -1"), "ranges must be"),
    (RANGED.replace("scatter_cv = 0.2", "scatter_cv = 2.0"), "scatter_cv must be a finite number >= 0 and <= 1, got 2.0"),
    ("scatter_rho = 1.0\n" + RANGED, "scatter_rho must be below 1, got 1.0"),
])
def test_bad_ranges_config_is_one_line(tmp_path, capsys, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and not (tmp_path / "out").exists()


# --- host defaults: a serving engine's published host terms, an axis like the step models -------

HOSTED = CONFIG.replace("rates_rps = [5.0, 40.0]\nreplicas = [1, 2]", 'rates_rps = 40.0\nhost_defaults = ["none", "vllm"]')


def test_host_defaults_are_an_axis_whose_engine_terms_reach_the_simulation(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(HOSTED)
    frame = run_sweep(load_sweep_config(path), tmp_path / "out").frame
    assert len(frame) == 3 * 2 and frame["host_defaults"].tolist().count("vllm") == 3
    keys = ["scheduler", "max_num_seqs", "chunk_size"]
    none = frame[frame["host_defaults"].isna()].set_index(keys)
    vllm = frame[frame["host_defaults"] == "vllm"].set_index(keys)
    # vLLM's per-sequence host time lengthens every step, its per-prompt-token path every TTFT
    assert (vllm["tpot_ms_mean"] > none["tpot_ms_mean"]).all() and (vllm["ttft_ms_mean"] > none["ttft_ms_mean"]).all()
    assert all("+vllm" in point_label(row) for _, row in vllm.reset_index().iterrows())
    stored = pd.read_parquet(tmp_path / "out" / "summaries.parquet")
    assert stored["host_defaults"].tolist() == frame["host_defaults"].tolist()


def test_points_without_host_defaults_keep_their_stored_results(tmp_path):
    """A sweep stored before host defaults were an axis resumes: its points' keys are unchanged."""
    path = tmp_path / "sweep.toml"
    plain = HOSTED.replace('host_defaults = ["none", "vllm"]', "")
    path.write_text(plain)
    first = run_sweep(load_sweep_config(path), tmp_path / "out")
    path.write_text(HOSTED)
    hosted = run_sweep(load_sweep_config(path), tmp_path / "out")
    assert (hosted.num_reused, hosted.num_run) == (3, 3)
    reused = hosted.frame[hosted.frame["host_defaults"].isna()]
    assert reused[WALL_COLUMN].tolist() == first.frame[WALL_COLUMN].tolist()   # read back, not simulated again


def test_host_defaults_on_calibrated_tables_are_refused_in_one_line(tmp_path, capsys):
    cal = tmp_path / "cal"
    cal.mkdir()
    (cal / "meta.json").write_text(json.dumps({"kind": "builtin", "step_model": "const:5",
                                               "host_terms": {"per_step_ms": 0.5}}))
    path = tmp_path / "bad.toml"
    path.write_text(HOSTED.replace('step_models = ["linear:8,0.03,0.0002"]', 'step_models = ["cal"]'))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.toml" in err and "already has calibrated host terms" in err


@pytest.mark.parametrize("value,needle", [('"tgi"', "host_defaults must be one of none, vllm"),
                                          ('["vllm", "vllm"]', "lists an engine twice"),
                                          ("1", "host_defaults must be a string or a non-empty list of them, got 1")])
def test_bad_host_defaults_are_one_line(tmp_path, capsys, value, needle):
    path = tmp_path / "bad.toml"
    path.write_text(f"host_defaults = {value}\n" + CONFIG)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and not (tmp_path / "out").exists()
