import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stepcal.experiments.cli import main
from stepcal.experiments.report.build import heldout_table
from stepcal.experiments.report.inputs import load_validation
from stepcal.experiments.report.plots import decode_grid_ms
from stepcal.simulator.step_model import LinearStepModel

BENCH = Path(__file__).resolve().parents[1] / "data" / "vllm_bench_tiny.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LINEAR = "linear:2,0.05,0.001"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """An engine validation (with a step log), an imported-bench validation (without) and a tables dir."""
    root = tmp_path_factory.mktemp("report_inputs")
    assert main(["measure", "--trace", "poisson:rate=40,n=16,prompt=uniform:4:60,output=uniform:2:12",
                 "--scheduler", "sarathi", "--chunk-size", "32", "--quiet", "--out", str(root / "engine")]) == 0
    assert main(["validate", "--measured", str(root / "engine"), "--step-model", LINEAR, "--quiet"]) == 0
    assert main(["import", "vllm-bench", str(BENCH), "--model-spec", "tiny", "--scheduler", "continuous",
                 "--quiet", "--out", str(root / "bench")]) == 0
    assert main(["validate", "--measured", str(root / "bench"), "--step-model", LINEAR, "--quiet"]) == 0
    tables = root / "tables"
    tables.mkdir()
    (tables / "meta.json").write_text(json.dumps(
        {"kind": "stepcal.t_step_tables", "mode": "operators", "t_step_terms": [], "terms": {},
         "heldout": {"mape": 0.034, "per_op": {"gemm": 0.02}}, "features": ["num_tokens"]}))
    return root


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "r"
    assert main(["report", str(inputs / "engine" / "validation"), str(inputs / "bench" / "validation"),
                 str(inputs / "tables"), "--step-model", LINEAR, "--quiet", "--out", str(out)]) == 0
    return out


def test_report_files_and_self_contained_html(report):
    pngs = sorted(p.name for p in report.glob("*.png"))
    # engine: CDFs + step scatter; bench: CDFs only (no step log); tables: operators only; linear: heatmap
    assert pngs == ["bench_validation_latency_cdf.png", "engine_validation_latency_cdf.png",
                    "engine_validation_step_time.png", "heatmap_linear_2_0.05_0.001.png"]
    for name in pngs:
        assert (report / name).read_bytes()[:8] == PNG_MAGIC
    markdown = (report / "report.md").read_text()
    assert all(f"]({name})" in markdown for name in pngs)
    html = (report / "report.html").read_text()
    assert len(re.findall(r'src="data:image/png;base64,', html)) == len(pngs)
    assert not re.search(r'src="(?!data:)', html)        # nothing fetched from outside the page


def test_error_table_matches_validation_json(inputs, report):
    record = json.loads((inputs / "engine" / "validation" / "validation.json").read_text())
    cell = record["metrics"]["ttft_ms"]["p90"]
    row = (f"| ttft_ms | p90 | {cell['measured']:.4g} | {cell['simulated']:.4g} | {100 * cell['error']:+.1f}% | - |")
    markdown = (report / "report.md").read_text()
    assert row in markdown
    assert f"Step level: MAPE {100 * record['step_level']['mape']:.1f}%" in markdown
    assert f"total step time {100 * record['step_level']['total_error']:+.1f}%" in markdown
    matched = record["step_matched"]["metrics"]["e2e_ms"]
    assert (f"| e2e_ms | {100 * matched['p50']:+.1f}% | {100 * matched['p90']:+.1f}% | "
            f"{100 * matched['p99']:+.1f}% |") in markdown
    lines = markdown.splitlines()
    # validation.md's line on the machine's speed (the run's probes; linear: has no profile to set them against)
    assert ("Machine speed during each repeat (one fixed decode step, timed before and after it): "
            + " / ".join(f"{v:.3f}" for v in record["speed_probe_ms"]) + " ms") in lines
    # the imported bench has no step log
    assert "Step level: no measured step log (e.g. an imported vLLM bench), so no step-level error." in lines
    assert "| heldout | 0.034 | - |" in lines and "| heldout.per_op | - | 0.02 |" in lines
    assert any(line.startswith("note: could not load the tables as a step model") for line in lines)
    # two validation runs: a headline table, a row each
    headline = lines[lines.index("## Headline errors") + 6:][:2]
    step = record["step_level"]
    errors = [record["metrics"][m][s]["error"] for m in ("ttft_ms", "tpot_ms", "e2e_ms") for s in ("p50", "p90", "p99")]
    assert headline[0] == ("| engine_validation | " + " | ".join(f"{100 * e:+.1f}%" for e in errors)
                           + f" | {100 * step['mape']:.1f}% | {100 * step['total_error']:+.1f}% |")
    assert headline[1].startswith("| bench_validation | ") and headline[1].endswith(" | - | - |")


def test_decode_grid_is_the_model_on_pure_decode_batches():
    model = LinearStepModel(2.0, 0.05, 0.001)
    grid = decode_grid_ms(model, batch_sizes=(1, 8), kv_lens=(64, 1024))
    # A + B·b + C·b·(kv + 1): each of b sequences brings 1 token over kv cached ones
    expected = [[2 + 0.05 * b + 0.001 * b * (kv + 1) for b in (1, 8)] for kv in (64, 1024)]
    np.testing.assert_allclose(grid, expected)

    class Bounded:
        def step_ms(self, batch):
            if batch.num_seqs > 4:
                raise ValueError("outside the table")
            return 1.0
    assert np.isnan(decode_grid_ms(Bounded(), batch_sizes=(1, 8), kv_lens=(64,))).tolist() == [[False, True]]


def test_heldout_table_pivots_error_keys_only():
    meta = {"axes": {"num_seqs": [1, 2]}, "error_note": "errors in %",
            "held_out_errors": {"gemm": {"random": {"mape": 4.5, "n": 10}, "extrapolation": {"mape": 26.7, "n": 3}},
                                "overall": {"random": {"mape": 4.3}}}}
    header, rows, texts = heldout_table(meta)
    assert header == ["held-out", "mape", "n"]
    assert rows == [["held_out_errors.gemm.random", "4.5", "10"], ["held_out_errors.gemm.extrapolation", "26.7", "3"],
                    ["held_out_errors.overall.random", "4.3", "-"]]
    assert texts == ["error_note: errors in %"]


def test_measured_run_is_found_beside_a_moved_validation(inputs, tmp_path):
    moved = tmp_path / "engine"
    shutil.copytree(inputs / "engine", moved)
    record = json.loads((moved / "validation" / "validation.json").read_text())
    record["measured_run"] = "somewhere/else"
    (moved / "validation" / "validation.json").write_text(json.dumps(record))
    loaded = load_validation(moved / "validation")
    assert loaded.measured_requests is not None and len(loaded.measured_requests) == 16 and not loaded.notes


def test_report_rejects_a_directory_it_does_not_know(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "neither a validation directory" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_report_logs_its_files_to_mlflow(inputs, tmp_path, capsys):
    from mlflow.tracking import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("reports", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    out = tmp_path / "r"
    assert main(["report", str(inputs / "bench" / "validation"), "--mlflow-run-id", run_id,
                 "--tracking-uri", uri, "--quiet", "--out", str(out)]) == 0
    logged = sorted(Path(a.path).name for a in client.list_artifacts(run_id, "report"))
    assert logged == ["bench_validation_latency_cdf.png", "report.html", "report.md"]
    assert main(["report", str(inputs / "bench" / "validation"), "--mlflow-run-id", "f" * 32,
                 "--tracking-uri", uri, "--out", str(tmp_path / "r2")]) == 2
    assert "--mlflow-run-id" in capsys.readouterr().err and not (tmp_path / "r2").exists()


def test_cli_help_loads_no_plotting_or_tracking():
    code = ("import sys; from stepcal.experiments.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('matplotlib', 'mlflow', 'torch', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


def test_measured_requests_pool_every_repeat(inputs, tmp_path):
    run = tmp_path / "engine"
    shutil.copytree(inputs / "engine", run)
    shutil.copytree(run / "repeat_0", run / "repeat_1")
    record = json.loads((run / "validation" / "validation.json").read_text())
    (run / "validation" / "validation.json").write_text(json.dumps({**record, "measured_run": str(run)}))
    loaded = load_validation(run / "validation")
    assert len(loaded.measured_requests) == 32 and not loaded.notes


def test_report_names_tell_validations_of_the_same_run_apart(tmp_path):
    from stepcal.experiments.report.build import _unique_names
    a, b = tmp_path / "tables" / "continuous" / "load_30", tmp_path / "calibrated" / "continuous" / "load_30"
    c, tables = tmp_path / "tables" / "sarathi" / "load_30", tmp_path / "campaign" / "tables"
    names = _unique_names([a, b, c, tables])
    assert names == {a: "tables_continuous_load_30", b: "calibrated_continuous_load_30", c: "sarathi_load_30",
                     tables: "campaign_tables"}
    assert _unique_names([a, c]) == {a: "continuous_load_30", c: "sarathi_load_30"}   # two components suffice
    assert list(_unique_names([a, a]).values()) == ["continuous_load_30"]             # one path, one name


# --- ranges: CDF bands and each cell's interval ------------------------------------------------

@pytest.fixture(scope="module")
def ranged(inputs, tmp_path_factory):
    """A validation with ranges of the engine run, and its report."""
    root = tmp_path_factory.mktemp("ranged")
    assert main(["validate", "--measured", str(inputs / "engine"), "--step-model", LINEAR, "--ranges", "5",
                 "--scatter-cv", "0.2", "--quiet", "--out", str(root / "validation")]) == 0
    assert main(["report", str(root / "validation"), "--quiet", "--out", str(root / "report")]) == 0
    return root


def test_validate_ranges_store_each_replications_latency_quantiles(ranged):
    import pandas as pd
    table = pd.read_parquet(ranged / "validation" / "ranges_percentiles.parquet")
    record = json.loads((ranged / "validation" / "validation.json").read_text())
    assert record["ranges"]["replica_quantiles_file"] == "ranges_percentiles.parquet"
    assert sorted(table["replication"].unique()) == [0, 1, 2, 3, 4] and set(table["metric"]) == {"ttft_ms", "tpot_ms", "e2e_ms"}
    # each replication's median TTFT; the ranges block's interval of P50 TTFT is their 5th-95th percentile
    medians = table[(table["metric"] == "ttft_ms") & (table["quantile"] == 0.5)]["value_ms"].to_numpy()
    cell = record["ranges"]["stats"]["ttft_ms"]["p50"]
    assert (cell["low"], cell["high"]) == pytest.approx(tuple(np.percentile(medians, [5, 95])))


def test_report_error_table_shows_each_interval_and_whether_the_measured_value_is_inside(ranged):
    record = json.loads((ranged / "validation" / "validation.json").read_text())
    markdown = (ranged / "report" / "report.md").read_text()
    assert "| metric | stat | measured | simulated | error | noise floor | 90% interval | measured inside |" in markdown
    for metric, stat in (("ttft_ms", "p90"), ("e2e_ms", "p50"), ("tpot_ms", "mean")):
        cell = record["metrics"][metric][stat]
        interval = record["ranges"]["stats"][metric][stat]
        inside = record["ranges"]["coverage"]["cells"][metric][stat]["inside"]
        row = (f"| {metric} | {stat} | {cell['measured']:.4g} | {cell['simulated']:.4g} | {100 * cell['error']:+.1f}% | - "
               f"| {interval['low']:.4g} to {interval['high']:.4g} | {'yes' if inside else 'no'} |")
        assert row in markdown
    coverage = record["ranges"]["coverage"]
    assert f"inside in {coverage['num_inside']} of {coverage['num_cells']} cells" in markdown
    assert "with the 90% band of 5 simulated replications" in markdown


def test_report_cdfs_draw_the_band_of_the_replications(ranged):
    import pandas as pd
    from matplotlib.collections import PolyCollection

    from stepcal.experiments.report.plots import latency_cdf_figure
    from stepcal.experiments.report.ranges import cdf_bands
    loaded = load_validation(ranged / "validation")
    bands = cdf_bands(loaded.replica_quantiles)
    table = pd.read_parquet(ranged / "validation" / "ranges_percentiles.parquet")
    e2e = table[table["metric"] == "e2e_ms"].pivot(index="replication", columns="quantile", values="value_ms")
    np.testing.assert_allclose(bands["e2e_ms"].low_ms, np.percentile(e2e.to_numpy(), 5, axis=0))
    np.testing.assert_allclose(bands["e2e_ms"].high_ms, np.percentile(e2e.to_numpy(), 95, axis=0))
    assert (bands["e2e_ms"].high_ms > bands["e2e_ms"].low_ms).any()
    fig = latency_cdf_figure({"measured": loaded.measured_requests, "simulated": loaded.simulated_requests},
                             "t", bands)
    for ax, metric in zip(fig.axes, ("ttft_ms", "tpot_ms", "e2e_ms")):
        (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
        xs = band.get_paths()[0].vertices[:, 0]
        assert xs.min() == pytest.approx(bands[metric].low_ms.min())
        assert xs.max() == pytest.approx(bands[metric].high_ms.max())
    # without ranges nothing is shaded
    plain = latency_cdf_figure({"simulated": loaded.simulated_requests}, "t")
    assert not any(isinstance(c, PolyCollection) for ax in plain.axes for c in ax.collections)


# --- simulate outputs: the CDFs with the replications' band --------------------------------------

@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """A simulation with ranges, one without, and their report."""
    root = tmp_path_factory.mktemp("simulated")
    run = ["simulate", "--trace", "poisson:rate=30,n=60,prompt=uniform:20:300,output=uniform:4:40", "--step-model",
           LINEAR, "--quiet"]
    assert main([*run, "--ranges", "5", "--scatter-cv", "0.2", "--out", str(root / "ranged")]) == 0
    assert main([*run, "--out", str(root / "plain")]) == 0
    assert main(["report", str(root / "ranged"), str(root / "plain"), "--quiet", "--out", str(root / "report")]) == 0
    return root


def test_report_on_a_simulation_tabulates_each_interval_and_draws_the_band(simulated):
    from stepcal.experiments.report.inputs import SimulationInput, load_input
    from stepcal.experiments.report.ranges import cdf_bands
    summary = json.loads((simulated / "ranged" / "summary.json").read_text())
    markdown = (simulated / "report" / "report.md").read_text()
    assert "| metric | stat | plain run | median of the replications | 90% interval |" in markdown
    for metric, stat in (("ttft_ms", "p99"), ("tpot_ms", "p50"), ("e2e_ms", "p90")):
        cell = summary["ranges"]["stats"][metric][stat]
        assert (f"| {metric} | {stat} | {summary[metric][stat]:.4g} | {cell['median']:.4g} | "
                f"{cell['low']:.4g} to {cell['high']:.4g} |") in markdown
    assert "ranged: CDFs of TTFT, TPOT and E2E, simulated, with the 90% band of 5 simulated replications" in markdown
    assert "note: no ranges (simulate without --ranges)" in markdown
    prefix = simulated.name   # names are the directories' last two components
    assert sorted(p.name for p in (simulated / "report").glob("*.png")) == [f"{prefix}_plain_latency_cdf.png",
                                                                           f"{prefix}_ranged_latency_cdf.png"]
    loaded = load_input(simulated / "ranged")
    assert isinstance(loaded, SimulationInput) and set(cdf_bands(loaded.replica_quantiles)) == {"ttft_ms", "tpot_ms", "e2e_ms"}


def test_a_measured_runs_repeat_is_not_read_as_a_simulation(inputs, tmp_path, capsys):
    """A repeat of a measured run also holds summary.json and requests.parquet, but no simulate config.json."""
    repeat = next(p for p in (inputs / "engine").iterdir() if (p / "requests.parquet").exists())
    assert main(["report", str(repeat), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "neither a validation directory" in err and err.count("\n") == 1
