import json
import subprocess
import sys

import pandas as pd
import pytest

from stepcal.core.batch import StepFeatures
from stepcal.core.model_spec import Parallelism
from stepcal.costmodel.tables import load_step_model
from stepcal.experiments.cli import main
from tests.costmodel.conftest import PROFILES, make_step_log, require_shared, step_ms


def test_fit_logs_an_mlflow_run_and_registers_a_model(step_log_file, tmp_path, tracking_uri, monkeypatch):
    import mlflow
    monkeypatch.chdir(tmp_path)   # with --tracking-uri, MLflow puts artifacts under ./mlruns: not in the checkout
    out = tmp_path / "tables"
    assert main(["fit", "--profile", str(step_log_file), "--regressor", "tuned", "--trials", "3",
                 "--tracking-uri", tracking_uri, "--register", "stepcal-test", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["mode"] == "step" and meta["t_step_terms"] == ["step"]
    run = mlflow.MlflowClient(tracking_uri).get_run(meta["mlflow_run_id"])
    assert run.data.tags["training_data_hash"] == meta["training_data_hash"]
    assert run.data.metrics["random.mape"] == pytest.approx(meta["held_out_errors"]["overall"]["random"]["mape"])
    children = mlflow.MlflowClient(tracking_uri).search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    assert len(children) == 3                          # one nested run per Optuna trial
    versions = mlflow.MlflowClient(tracking_uri).search_model_versions("name = 'stepcal-test'")
    assert [v.run_id for v in versions] == [run.info.run_id]
    # the registered pyfunc gives the tables' T_step
    log = make_step_log(10, seed=3)
    pyfunc = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/t_step")
    got = pyfunc.predict(log)["t_step_ms"].to_numpy()
    expected = load_step_model(out).features_ms(StepFeatures.from_columns(log))
    assert got.tolist() == pytest.approx(expected.tolist())
    assert got == pytest.approx(log.apply(step_ms, axis=1).to_numpy(), rel=0.05)


def test_predict_writes_one_row_per_timed_row(fitted_tables, profile_file, tmp_path, capsys):
    out = tmp_path / "pred.csv"
    assert main(["predict", "--tables", str(fitted_tables), "--input", str(profile_file),
                 "--out", str(out)]) == 0
    pred = pd.read_csv(out)
    src = pd.read_parquet(profile_file)
    assert len(pred) == (src["status"] == "ok").sum()
    assert {"row", "op", "measured_ms", "predicted_ms", "spread_ms", "m", "num_seqs"} <= set(pred.columns)
    gemm = pred[pred["op"] == "gemm"]
    assert gemm["predicted_ms"].notna().all() and gemm["ape_percent"].mean() < 10
    # overhead had too few rows to fit: no prediction rather than a made-up one
    overhead = pred["op"] == "overhead"
    assert pred.loc[overhead, "predicted_ms"].isna().all() and pred.loc[~overhead, "predicted_ms"].notna().all()
    done = int((~overhead).sum())
    assert capsys.readouterr().out == (f"wrote {out}: {done} of {len(pred)} rows predicted; MAPE "
                                       f"{pred['ape_percent'].mean():.2f}% on {done} timed rows\n")


def test_export_vidur_csv_json(fitted_tables, tmp_path):
    assert main(["tables", "export", str(fitted_tables), "--format", "vidur",
                 "--out", str(tmp_path / "v")]) == 0
    mlp = pd.read_csv(tmp_path / "v" / "mlp.csv")
    assert {"time_stats.attn_pre_proj.median", "time_stats.mlp_down_proj.std", "num_tokens",
            "n_embd", "num_tensor_parallel_workers"} <= set(mlp.columns)
    assert (mlp["n_embd"] == 256).all() and (mlp["num_tensor_parallel_workers"] == 1).all()
    # Vidur's sweep, attention.csv and the filter contract: tests/costmodel/test_vidur_export.py
    attention = pd.read_csv(tmp_path / "v" / "attention.csv")
    assert attention["is_prefill"].any() and not attention["is_prefill"].all()
    assert main(["tables", "export", str(fitted_tables), "--format", "csv",
                 "--out", str(tmp_path / "c")]) == 0
    linear = pd.read_csv(tmp_path / "c" / "linear.csv")
    assert list(linear.columns) == ["num_tokens", "time_ms", "spread_ms"]
    assert main(["tables", "export", str(fitted_tables), "--format", "json",
                 "--out", str(tmp_path / "j")]) == 0
    data = json.loads((tmp_path / "j" / "tables.json").read_text())
    assert set(data["tables"]) >= {"linear", "decode_attn", "ops"}


def test_operator_profiles_fit_and_predict_without_a_model_spec(tmp_path, capsys, profile_file):
    """Per-operator regressors need no model; composing T_step does, and simulate says so."""
    out = tmp_path / "ops_only"
    assert main(["fit", "--profile", str(profile_file), "--no-mlflow", "--regressor", "rf", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["mode"] == "operators" and meta["t_step_terms"] == [] and meta["terms"] == {}
    assert "gemm" in meta["targets"] and (out / "models" / "gemm.joblib").exists()
    assert main(["predict", "--tables", str(out), "--input", str(profile_file), "--out", str(tmp_path / "p.csv")]) == 0
    predicted = pd.read_csv(tmp_path / "p.csv")
    fitted = predicted[predicted["op"].isin(meta["targets"])]    # overhead: too few rows to fit
    assert set(fitted["op"]) == {"gemm", "attn_prefill", "attn_decode"} and (fitted["predicted_ms"] > 0).all()
    assert fitted["ape_percent"].median() < 50
    capsys.readouterr()
    assert main(["simulate", "--trace", "poisson:rate=5,n=5,prompt=fixed:8,output=fixed:2",
                 "--step-model", str(out), "--out", str(tmp_path / "sim")]) == 2
    err = capsys.readouterr().err
    assert "per-operator regressors only" in err and len(err.strip().splitlines()) == 1


def test_user_errors_exit_2_with_one_line(tmp_path, capsys, profile_file):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"op": ["gemm"], "time_ms": [-1.0], "m": [1], "n": [2], "k": [3]}).to_csv(bad, index=False)
    assert main(["fit", "--profile", str(bad), "--no-mlflow", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepcal: ") and "row 0" in err and "'time_ms'" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    assert main(["predict", "--tables", str(tmp_path), "--input", str(profile_file),
                 "--out", str(tmp_path / "p.csv")]) == 2
    assert capsys.readouterr().err == (f"stepcal: {tmp_path}: not a T_step table directory (no meta.json; "
                                         "expected the output of `stepcal fit`)\n")
    assert main(["fit", "--profile", str(profile_file), "--ops", "gemmm", "--model-spec", "tiny", "--no-mlflow",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--ops gemmm: no rows" in err and "gemm" in err and len(err.strip().splitlines()) == 1


def test_fit_says_which_targets_had_too_few_rows(tmp_path, capsys):
    rows = [{"op": "gemm", "name": "o_proj", "m": m, "n": 256, "k": 256, "time_ms": 0.01 * m} for m in range(1, 13)]
    rows += [{"op": "elementwise", "name": "add", "num_tokens": t, "width": 512, "tp": 1, "time_ms": 0.01 * t}
             for t in (1, 2, 4)]
    path = tmp_path / "p.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    assert main(["fit", "--profile", str(path), "--model-spec", "tiny", "--regressor", "rf", "--no-mlflow",
                 "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "note: elementwise:add not fitted: only 3 rows (need 8)" in out
    assert "elementwise" in json.loads((tmp_path / "t" / "meta.json").read_text())["missing_terms"]


def test_fit_ops_keeps_only_the_named_ops(profile_file, tmp_path):
    out = tmp_path / "t"
    assert main(["fit", "--profile", str(profile_file), "--ops", "gemm", "--model-spec", "tiny",
                 "--regressor", "rf", "--no-mlflow", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    profile = pd.read_parquet(profile_file)
    assert set(meta["targets"]) == {"gemm"} and meta["provenance"]["rows"] == int(
        ((profile["op"] == "gemm") & (profile["status"] == "ok")).sum())     # failed points are skipped


def test_fit_on_real_vidur_profile_composes_a_model(tmp_path):
    path = require_shared(PROFILES / "vidur/a100/meta-llama/Llama-2-7b-hf/mlp.csv")
    out = tmp_path / "t"
    assert main(["fit", "--profile", str(path), "--model-spec", "llama-2-7b", "--regressor", "rf",
                 "--no-mlflow", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    # Vidur times the element-wise operators: they are data; sampling no profile times, and Vidur's
    # files name no device for a roofline.
    assert meta["missing_terms"] == ["decode_attn", "overhead", "prefill_attn", "sampling"]
    assert meta["term_sources"]["elementwise"]["source"] == "data" and meta["term_sources"]["linear"]["source"] == "data"
    assert any("lm_head" in note for note in meta["notes"]) and any("--device-spec" in note for note in meta["notes"])
    assert meta["held_out_errors"]["gemm"]["random"]["mape"] < 6
    model = load_step_model(out)
    ops = pd.read_parquet(out / "ops.parquet")
    tokens = float(sorted(ops["num_tokens"].unique())[40])     # a grid point
    f = StepFeatures.from_columns({n: [tokens] if n in ("num_tokens", "prefill_tokens") else [1.0]
                                   for n in StepFeatures.__dataclass_fields__})
    at = ops[ops["num_tokens"] == tokens].set_index("op")["time_ms"]
    small = ["emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add"]
    gemms = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    assert sorted(at.index) == sorted(small + gemms)
    # linear: 32 layers of the GEMMs; elementwise: 32 layers of the small operators plus the embedding
    # once. Their sum is what the linear term held before element-wise work had a term of its own.
    parts = model.term_ms(f)
    assert parts["linear"][0] == pytest.approx(32 * at[gemms].sum())
    assert parts["elementwise"][0] == pytest.approx(32 * at[small[1:]].sum() + at["emb"])
    assert parts["linear"][0] + parts["elementwise"][0] == pytest.approx(32 * at.drop("emb").sum() + at["emb"])


def test_device_spec_adds_roofline_terms_where_no_profile_times_them(profile_file, tmp_path, capsys):
    """The synthetic profile names no known device ('Test CPU'): --device-spec gives the roofline its
    bandwidth. A bad name, or one that contradicts the profiles' own device, is one line, exit 2."""
    from stepcal.core.model_spec import PRESETS
    from stepcal.costmodel.compose_elementwise import roofline_elementwise_ms, sampling_ms
    from stepcal.costmodel.devices import device_spec
    out = tmp_path / "t"
    assert main(["fit", "--profile", str(profile_file), "--model-spec", "tiny", "--device-spec", "H100",
                 "--regressor", "rf", "--no-mlflow", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert "elementwise" in meta["t_step_terms"] and "sampling" in meta["t_step_terms"]
    assert meta["missing_terms"] == ["overhead"]
    source = meta["term_sources"]["elementwise"]
    assert source["source"] == "roofline" and source["device"] == "h100_sxm"
    assert set(source["constants"]) == {"emb", "norm", "rope", "act", "add"}
    assert meta["term_sources"]["sampling"]["constants"].keys() == {"norm"}
    model = load_step_model(out)
    f = StepFeatures.from_columns({n: [300.0] if n in ("num_tokens", "prefill_tokens", "num_seqs") else [1.0]
                                   for n in StepFeatures.__dataclass_fields__})
    h100, tiny = device_spec("h100_sxm"), PRESETS["tiny"]
    parts = model.term_ms(f)
    assert parts["elementwise"][0] == pytest.approx(roofline_elementwise_ms(tiny, Parallelism(), h100, [300.0])[0][0])
    assert parts["sampling"][0] == pytest.approx(sampling_ms(tiny, h100, [300.0])[0][0])

    capsys.readouterr()
    assert main(["fit", "--profile", str(profile_file), "--model-spec", "tiny", "--device-spec", "H999",
                 "--no-mlflow", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepcal: --device-spec: unknown device 'H999'; known: h100_sxm,") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and not (tmp_path / "bad").exists()

    on_a100 = tmp_path / "a100.parquet"
    pd.read_parquet(profile_file).assign(device_name="NVIDIA A100-SXM4-80GB").to_parquet(on_a100)
    assert main(["fit", "--profile", str(on_a100), "--model-spec", "tiny", "--device-spec", "h100",
                 "--no-mlflow", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err == ("stepcal: --device-spec h100: the profiles were measured on NVIDIA A100-SXM4-80GB (a100_sxm), "
                   "not h100_sxm\n")


def test_import_costmodel_loads_no_torch():
    code = ("import sys, costmodel, costmodel.tables, costmodel.importers, costmodel.fitting; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_loading_tables_needs_no_sklearn(fitted_tables):
    code = ("import sys; from stepcal.costmodel.tables import load_step_model; "
            f"load_step_model({str(fitted_tables)!r}); "
            "print([m for m in ('sklearn', 'scipy', 'mlflow', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
