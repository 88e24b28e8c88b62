"""`stepcal tables export --format vidur` against what Vidur reads (costmodel.vidur_models): its row
filters and required columns, for every preset Vidur can express and for Vidur's own model configs,
so that a key Vidur would filter every row out on (vocab_size 32000 for 32768) fails here without
Vidur installed; the num_tokens sweep; attention.csv or a one-line refusal; the KV-cache-save column.

Most table directories are the tiny synthetic fit relabelled as another model (meta.json's model
spec): the regressors then predict far outside their data, which is no matter for keys, columns and
sweeps. The filter-keys-from-data tests fit a small synthetic Vidur mlp.csv.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stepcal.core.batch import batch_row
from stepcal.core.model_spec import PRESETS, ModelSpec, Parallelism
from stepcal.costmodel.export import DEFAULT_HBM_GBPS, attention_features
from stepcal.costmodel.vidur_keys import STORED_KEYS
from stepcal.costmodel.vidur_models import (
    MLP_REQUIRED,
    STATS,
    VIDUR_MODELS,
    VidurModel,
    as_vidur_model,
    attention_inputs,
    contract_problems,
    like_spec,
    mlp_rows,
    num_tokens_sweep,
)
from stepcal.experiments.cli import main
from stepcal.experiments.commands.tables import DEFAULT_HBM_GBPS as FLAG_DEFAULT
from tests.costmodel.conftest import make_profile

LLAMA2_7B_KEYS = dict(n_head=32, n_kv_head=32, n_embd=4096, n_expanded_embd=11008, use_gated_mlp=True)


def relabelled(tables: Path, spec: ModelSpec, tmp_path: Path) -> Path:
    """A copy of `tables` whose meta.json names `spec` as the model."""
    out = tmp_path / f"tables-{spec.name}"
    shutil.copytree(tables, out)
    meta = json.loads((out / "meta.json").read_text())
    meta.update(model_spec=spec.to_dict(), num_layers=spec.num_layers)
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def export(tables: Path, out: Path, capsys, *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["tables", "export", str(tables), "--format", "vidur", "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_export(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    return pd.read_csv(out / "mlp.csv"), pd.read_csv(out / "attention.csv")


def assert_refused(code: int, out: str, err: str, where: Path, *needles: str) -> None:
    assert code == 2 and out == "", out
    assert err.startswith("stepcal: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    assert not where.exists()


def test_the_sweep_written_out_is_vidurs():
    expected = ([1, 2, 4] + list(range(8, 1025, 8)) + list(range(1040, 2049, 16)) + list(range(2080, 4097, 32))
                + list(range(4160, 8193, 64)) + list(range(8320, 16385, 128)) + list(range(16640, 32769, 256))
                + list(range(33280, 65537, 512)))
    assert num_tokens_sweep(65536).tolist() == expected
    assert num_tokens_sweep(4096).tolist() == expected[:259]     # the 259 points of Vidur's Llama-2 profiles
    assert {2 ** i for i in range(17)} <= set(expected)


def test_export_at_vidurs_sweep_from_the_regressors(fitted_tables, tmp_path, capsys):
    """num_tokens is Vidur's sweep to the tables' range; the regressors give the same times as
    ops.parquet at its own points (the same columns); attention.csv at Vidur's attention points; the
    KV-cache-save column is the stated estimate."""
    code, printed, err = export(fitted_tables, tmp_path / "v", capsys, "--hbm-gbps", "1000")
    assert code == 0, err
    assert printed.count("\n") == 1 and "from the regressors" in printed and "1000 GB/s (--hbm-gbps" in printed
    mlp, attention = read_export(tmp_path / "v")
    ops = pd.read_parquet(fitted_tables / "ops.parquet")
    assert mlp["num_tokens"].tolist() == num_tokens_sweep(int(ops["num_tokens"].max())).tolist()
    for ours, theirs in (("qkv_proj", "attn_pre_proj"), ("down_proj", "mlp_down_proj")):
        grid = ops[ops["op"] == ours].set_index("num_tokens")
        at = mlp.set_index("num_tokens").reindex(grid.index)[f"time_stats.{theirs}.median"].dropna()
        assert len(at) >= 5
        np.testing.assert_allclose(at, grid.loc[at.index, "time_ms"], rtol=1e-9)
    # tiny fits GEMMs only: the small operators are zeros, and the line says so
    assert (mlp["time_stats.mlp_act.median"] == 0).all() and "mlp_act" in printed and "zero (no data)" in printed
    spec = PRESETS["tiny"]
    new_tokens = np.maximum(attention["prefill_chunk_size"], attention["batch_size"])
    expected = new_tokens * 2 * spec.num_kv_heads * spec.head_dim * spec.kv_dtype_bytes / 1e12 * 1e3
    np.testing.assert_allclose(attention["time_stats.attn_kv_cache_save.median"], expected, rtol=1e-12)
    assert contract_problems(mlp, attention, as_vidur_model(spec), 1) == []
    assert DEFAULT_HBM_GBPS == FLAG_DEFAULT


def test_attention_features_are_the_batches_vidur_times():
    points = attention_inputs(512, 8)
    features = attention_features(points)
    for i in (0, len(points) // 2, len(points) - 1):
        row = points.iloc[i]
        q = [int(row["prefill_chunk_size"])] if row["is_prefill"] else [1] * int(row["batch_size"])
        expected = batch_row(q, [int(row["kv_cache_size"])] * len(q))
        assert {k: v[i] for k, v in features.items()} == pytest.approx(expected)


# tiny: test_export_at_vidurs_sweep_from_the_regressors checks its contract.
EXPRESSIBLE = [name for name, s in PRESETS.items() if not (s.is_moe or s.is_mla) and name != "tiny"]
NOT_EXPRESSIBLE = {name: ("mixture of experts" if s.is_moe else "multi-head latent attention")
                   for name, s in PRESETS.items() if s.is_moe or s.is_mla}


@pytest.mark.parametrize("name", EXPRESSIBLE)
def test_every_dense_gqa_preset_passes_vidurs_filters(name, fitted_tables, tmp_path, capsys):
    """Vidur's row filters, with the keys of its own config of the preset (Llama-2-7B: vocab 32768),
    or of the config a person would add for a model Vidur lacks, leave rows for every predictor."""
    spec = PRESETS[name]
    code, printed, err = export(relabelled(fitted_tables, spec, tmp_path), tmp_path / "v", capsys)
    assert code == 0, err
    mlp, attention = read_export(tmp_path / "v")
    assert contract_problems(mlp, attention, as_vidur_model(spec), 1) == []
    like = like_spec(spec)
    if like is not None and like.vocab_size != spec.vocab_size:
        assert f"vocab_size {like.vocab_size} as Vidur's {like.name}" in printed
    # Qwen3's per-head norms have no column in Vidur's mlp.csv: the export says what it did with them
    # (here, tables without element-wise work, that it has no estimate of them)
    assert ("(this model's per-head query and key norms)" in printed) is spec.qk_norm


@pytest.mark.parametrize("name", NOT_EXPRESSIBLE, ids=[f"{n}-{why}" for n, why in NOT_EXPRESSIBLE.items()])
def test_presets_vidur_cannot_express_are_refused(name, fitted_tables, tmp_path, capsys):
    """Vidur's mlp.csv times one dense FFN per layer and its attention.csv is GQA: MoE and MLA
    models are refused in one line (not exported with a silent gap)."""
    code, printed, err = export(relabelled(fitted_tables, PRESETS[name], tmp_path), tmp_path / "v", capsys)
    assert_refused(code, printed, err, tmp_path / "v", NOT_EXPRESSIBLE[name], "Vidur cannot express it")


def _spec_of(model: VidurModel) -> ModelSpec:
    """Our spec of a Vidur model, with Hugging Face's vocabulary where Vidur pads it (Llama-2: 32000)."""
    vocab = 32000 if model.vocab_size == 32768 else model.vocab_size
    return ModelSpec(model.name.split("/")[-1].lower(), model.num_layers, model.embedding_dim, model.num_q_heads,
                     model.num_kv_heads, model.embedding_dim // model.num_q_heads, model.mlp_hidden_dim, vocab)


GATED = [name for name, m in VIDUR_MODELS.items() if m.use_gated_mlp]
# Exported through --vidur-model: the configs the Vidur export names (the others: the convention test below).
NAMED = ["meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf", "meta-llama/Meta-Llama-3-8B",
         "codellama/CodeLlama-34b-Instruct-hf", "Qwen/Qwen-72B"]


@pytest.mark.parametrize("name", NAMED)
def test_vidur_model_configs_pass_vidurs_filters(name, fitted_tables, tmp_path, capsys):
    model = VIDUR_MODELS[name]
    spec = _spec_of(model)
    tables = relabelled(fitted_tables, spec, tmp_path)
    code, printed, err = export(tables, tmp_path / "v", capsys, "--vidur-model", name)
    assert code == 0, err
    assert contract_problems(*read_export(tmp_path / "v"), model, 1) == []
    assert f"filter keys of Vidur's {name} config" in printed
    if spec.vocab_size != model.vocab_size:
        assert f"overrode vocab_size {spec.vocab_size} -> {model.vocab_size}" in printed


@pytest.mark.parametrize("name", GATED)
def test_without_the_option_a_spec_gets_vidurs_own_config(name):
    """Vidur's convention for a spec of a Vidur model's shape (what the export writes without
    --vidur-model): that model's config, Llama-2-70B and Llama-3-70B told apart by vocabulary."""
    assert like_spec(_spec_of(VIDUR_MODELS[name])) == VIDUR_MODELS[name]


def test_a_mismatched_vidur_model_is_refused_in_one_line(fitted_tables, tmp_path, capsys):
    tables = relabelled(fitted_tables, PRESETS["llama-2-7b"], tmp_path)
    code, printed, err = export(tables, tmp_path / "v", capsys, "--vidur-model", "meta-llama/Meta-Llama-3-8B")
    assert_refused(code, printed, err, tmp_path / "v", "--vidur-model meta-llama/Meta-Llama-3-8B",
                   "n_kv_head 32", "n_kv_head 8", "n_expanded_embd 14336")
    code, printed, err = export(tables, tmp_path / "v", capsys, "--vidur-model", "microsoft/phi-2")
    assert_refused(code, printed, err, tmp_path / "v", "use_gated_mlp")
    code, printed, err = export(tables, tmp_path / "v", capsys, "--vidur-model", "llama-2-7b")
    assert_refused(code, printed, err, tmp_path / "v", "unknown Vidur model 'llama-2-7b'", "meta-llama/Llama-2-7b-hf")
    capsys.readouterr()
    code = main(["tables", "export", str(tables), "--format", "csv", "--vidur-model", "meta-llama/Llama-2-7b-hf",
                 "--out", str(tmp_path / "c")])
    captured = capsys.readouterr()
    assert_refused(code, captured.out, captured.err, tmp_path / "c", "--format vidur only")


# ---- tables fitted from a Vidur profile ----

def vidur_mlp_csv(path: Path, vocab_size: int) -> Path:
    """A small mlp.csv of Llama-2-7B's shape in Vidur's layout, its four GEMMs only (times of a
    made-up device; one regressor to fit, where the small operators would add six)."""
    rows = []
    for tokens in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048):
        row = {**LLAMA2_7B_KEYS, "vocab_size": vocab_size, "num_tokens": tokens, "num_tensor_parallel_workers": 1}
        for i, op in enumerate(("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")):
            ms = 0.005 + 1e-5 * (1 + i) * tokens
            row.update({f"time_stats.{op}.{stat}": ms for stat in STATS})
        rows.append(row)
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def vidur_fits(tmp_path_factory) -> dict[str, Path]:
    """Llama-2-7B tables fitted from a Vidur mlp.csv (vocab 32016: neither ours nor Vidur's config's),
    with and without attention profiles. The fit with attention is given paths relative to the
    profiles' directory, run from there (as a person fits in their data directory)."""
    base = tmp_path_factory.mktemp("vidur_fit")
    mlp = vidur_mlp_csv(base / "mlp.csv", 32016)
    attention = make_profile()
    attention = attention[attention["op"].isin(["attn_decode", "attn_prefill"])].assign(
        dtype="bfloat16", model_spec="llama-2-7b", num_heads=32, num_kv_heads=32, head_dim=128)
    attention.to_parquet(base / "attention.parquet", index=False)
    fits = {"with_attention": base / "with_attention", "mlp_only": base / "mlp_only"}
    fit = ["fit", "--model-spec", "llama-2-7b", "--regressor", "rf", "--no-mlflow", "--out"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(base)
        assert main([*fit, str(fits["with_attention"]), "--profile", "mlp.csv", "attention.parquet"]) == 0
    assert main([*fit, str(fits["mlp_only"]), "--profile", str(mlp)]) == 0
    # mlp.csv times no small operator: --device-spec makes the element-wise term a memory roofline
    fits["roofline"] = base / "roofline"
    assert main([*fit, str(fits["roofline"]), "--profile", str(mlp), str(base / "attention.parquet"),
                 "--device-spec", "A100"]) == 0
    fits["mlp"] = mlp
    return fits


def without_stored_keys(tables: Path, tmp_path: Path, mlp_path: str) -> Path:
    """A copy of `tables` as tables fitted before the Vidur keys were stored in meta.json, whose
    provenance names the mlp.csv by `mlp_path`."""
    out = tmp_path / "older"
    shutil.copytree(tables, out)
    meta = json.loads((out / "meta.json").read_text())
    del meta[STORED_KEYS]
    meta["provenance"]["files"] = [mlp_path if f.endswith("mlp.csv") else f for f in meta["provenance"]["files"]]
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def test_filter_keys_come_from_the_vidur_profile(vidur_fits, tmp_path, capsys, monkeypatch):
    """The keys are stored at fit time: an export from another directory, where the relative path
    the fit was given does not resolve, still writes the input's keys (vocab 32016)."""
    monkeypatch.chdir(tmp_path)
    assert not Path("mlp.csv").exists()
    stored = json.loads((vidur_fits["with_attention"] / "meta.json").read_text())[STORED_KEYS]
    assert stored == [{"file": "mlp.csv", "num_tensor_parallel_workers": 1,
                       "keys": {**LLAMA2_7B_KEYS, "vocab_size": 32016}}]
    code, printed, err = export(vidur_fits["with_attention"], tmp_path / "v", capsys)
    assert code == 0, err
    assert "filter keys from the Vidur profile mlp.csv (stored in meta.json at fit time)" in printed
    mlp, attention = read_export(tmp_path / "v")
    assert set(MLP_REQUIRED) <= set(mlp.columns) and (mlp["vocab_size"] == 32016).all()
    from_data = VidurModel("from-data", 32, 32, 32, 4096, 11008, True, 32016)
    assert contract_problems(mlp, attention, from_data, 1) == []
    # Vidur's own Llama-2-7B config filters these rows out: the option names the override
    assert mlp_rows(mlp, VIDUR_MODELS["meta-llama/Llama-2-7b-hf"], 1).empty
    code, printed, err = export(vidur_fits["with_attention"], tmp_path / "w", capsys,
                                "--vidur-model", "meta-llama/Llama-2-7b-hf")
    assert code == 0 and "overrode vocab_size 32016 -> 32768" in printed, err
    assert contract_problems(*read_export(tmp_path / "w"), VIDUR_MODELS["meta-llama/Llama-2-7b-hf"], 1) == []


def test_a_fit_without_a_vidur_profile_stores_no_keys(vidur_fits, fitted_tables):
    assert json.loads((fitted_tables / "meta.json").read_text())[STORED_KEYS] == []
    # the mlp-only fit was given an absolute path: it is stored as given
    stored = json.loads((vidur_fits["mlp_only"] / "meta.json").read_text())[STORED_KEYS]
    assert [entry["file"] for entry in stored] == [str(vidur_fits["mlp"])]


def test_older_tables_read_the_profile_back_from_its_path(vidur_fits, tmp_path, capsys):
    tables = without_stored_keys(vidur_fits["with_attention"], tmp_path, str(vidur_fits["mlp"]))
    code, printed, err = export(tables, tmp_path / "v", capsys)
    assert code == 0, err
    assert f"filter keys from the Vidur profile {vidur_fits['mlp']} (read back from the path meta.json names" in printed
    assert (read_export(tmp_path / "v")[0]["vocab_size"] == 32016).all()


def test_older_tables_whose_profile_moved_fall_back_to_vidurs_convention(vidur_fits, tmp_path, capsys):
    moved = str(tmp_path / "elsewhere" / "mlp.csv")
    code, printed, err = export(without_stored_keys(vidur_fits["with_attention"], tmp_path, moved), tmp_path / "v", capsys)
    assert code == 0, err
    assert f"the Vidur profile {moved} named in meta.json is not readable here" in printed
    assert "vocab_size 32768 as Vidur's meta-llama/Llama-2-7b-hf" in printed
    assert contract_problems(*read_export(tmp_path / "v"), VIDUR_MODELS["meta-llama/Llama-2-7b-hf"], 1) == []


def test_damaged_stored_keys_are_refused_in_one_line(vidur_fits, tmp_path, capsys):
    tables = tmp_path / "t"
    shutil.copytree(vidur_fits["with_attention"], tables)
    meta = json.loads((tables / "meta.json").read_text())
    meta[STORED_KEYS][0]["keys"]["n_embd"] = "4096.5"
    (tables / "meta.json").write_text(json.dumps(meta))
    code, printed, err = export(tables, tmp_path / "v", capsys)
    assert_refused(code, printed, err, tmp_path / "v", f"{STORED_KEYS}", "'n_embd' must hold whole numbers")


def test_roofline_elementwise_ops_are_exported_per_call(vidur_fits, tmp_path, capsys):
    """Where the tables' element-wise term is the memory roofline, mlp.csv's small-operator columns
    hold its time of one call per layer (not zeros), and the line says so with the device: one layer's
    two norms, RoPE, activation and two residual adds, times the layers, plus the embedding and the
    final norm (a norm of the same width), is the T_step term itself at every num_tokens."""
    tables = vidur_fits["roofline"]
    meta = json.loads((tables / "meta.json").read_text())
    source = meta["term_sources"]["elementwise"]
    assert source["source"] == "roofline"
    code, printed, err = export(tables, tmp_path / "v", capsys)
    assert code == 0, err
    assert (f"emb, input_layernorm, attn_rope, post_attention_layernorm, mlp_act, add roofline estimates on "
            f"{source['device_title']}") in printed and "zero (no data)" not in printed
    mlp = read_export(tmp_path / "v")[0]
    per_call = {op: mlp[f"time_stats.{op}.median"].to_numpy() for op in
                ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")}
    assert all((v > 0).all() and (np.diff(v) >= 0).all() for v in per_call.values())
    layers = PRESETS["llama-2-7b"].num_layers
    summed = (layers * (per_call["input_layernorm"] + per_call["attn_rope"] + per_call["post_attention_layernorm"]
                        + per_call["mlp_act"] + 2 * per_call["add"]) + per_call["emb"] + per_call["input_layernorm"])
    term = pd.read_parquet(tables / "elementwise.parquet")
    np.testing.assert_allclose(summed, np.interp(mlp["num_tokens"], term["num_tokens"], term["time_ms"]), rtol=1e-9)
    spread = mlp["time_stats.add.std"].to_numpy()
    assert (spread > 0).all() and (spread < per_call["add"]).all()


def test_head_norms_ride_in_the_first_norms_column(vidur_fits, tmp_path, capsys):
    """Vidur sums a layer's operators and has no column for a Qwen3 layer's per-head norms: their
    roofline time per call is added to input_layernorm's, and the line says so."""
    from dataclasses import replace

    from stepcal.costmodel.compose_elementwise import roofline_call_ms, roofline_ops
    from stepcal.costmodel.devices import find_device
    tables = vidur_fits["roofline"]
    plain_spec = PRESETS["llama-2-7b"]
    with_norms = relabelled(tables, replace(plain_spec, name="llama-2-7b-qk", qk_norm=True), tmp_path)
    columns = {}
    for name, directory in (("plain", tables), ("qk", with_norms)):
        code, printed, err = export(directory, tmp_path / name, capsys)
        assert code == 0, err
        columns[name] = read_export(tmp_path / name)[0]
    assert "q_norm (roofline) and k_norm (roofline) (this model's per-head query and key norms) added into input_layernorm" in printed
    device = find_device(json.loads((tables / "meta.json").read_text())["term_sources"]["elementwise"]["device"])
    tokens = columns["qk"]["num_tokens"].to_numpy(dtype=float)
    norms = {op.name: op for op in roofline_ops(replace(plain_spec, qk_norm=True), Parallelism())}
    extra = sum(roofline_call_ms(plain_spec, device, norms[n], tokens) for n in ("q_norm", "k_norm"))
    col = "time_stats.input_layernorm.median"
    np.testing.assert_allclose(columns["qk"][col], columns["plain"][col] + extra, rtol=1e-9)
    assert columns["qk"]["time_stats.attn_rope.median"].equals(columns["plain"]["time_stats.attn_rope.median"])


def test_tables_without_attention_data_are_refused(vidur_fits, tmp_path, capsys):
    """A fit from mlp.csv alone: Vidur would stop with FileNotFoundError on attention.csv."""
    code, printed, err = export(vidur_fits["mlp_only"], tmp_path / "v", capsys)
    assert_refused(code, printed, err, tmp_path / "v", "tables fitted without attention data",
                   "decode", "prefill", "or Vidur cannot run")


def test_missing_regressors_fall_back_to_the_grids(fitted_tables, tmp_path, capsys):
    tables = tmp_path / "t"
    shutil.copytree(fitted_tables, tables)
    (tables / "models" / "gemm.joblib").unlink()
    (tables / "models" / "attn_decode.joblib").unlink()
    code, printed, err = export(tables, tmp_path / "v", capsys)
    assert code == 0, err
    assert "attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj interpolated in ops.parquet" in printed
    assert "the decode_attn grid (no regressor)" in printed and "the attn_prefill regressor" in printed
    mlp, attention = read_export(tmp_path / "v")
    ops = pd.read_parquet(fitted_tables / "ops.parquet")
    grid = ops[ops["op"] == "gate_up_proj"].set_index("num_tokens")
    at = mlp.set_index("num_tokens").reindex(grid.index)["time_stats.mlp_up_proj.median"].dropna()
    np.testing.assert_allclose(at, grid.loc[at.index, "time_ms"], rtol=1e-9)
    assert contract_problems(mlp, attention, as_vidur_model(PRESETS["tiny"]), 1) == []


def test_kv_cache_save_comes_from_our_profilers_kv_store_where_the_tables_have_it(tmp_path, capsys):
    """Tables fitted with the `elementwise` op's kv_store rows: attention.csv's attn_kv_cache_save is
    that regressor's time per layer, by the batch's sequences (one for a prefill chunk)."""
    rows = [{"point_key": f"kv{b}", "op": "elementwise", "name": "kv_store", "num_tokens": b, "width": 256, "tp": 1,
             "dtype": "float32", "status": "ok", "time_ms": 0.01 + 0.02 * b} for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    profile = tmp_path / "profile.parquet"
    pd.concat([make_profile(), pd.DataFrame(rows)], ignore_index=True).to_parquet(profile, index=False)
    assert main(["fit", "--profile", str(profile), "--model-spec", "tiny", "--regressor", "rf", "--no-mlflow",
                 "--out", str(tmp_path / "t")]) == 0
    code, printed, err = export(tmp_path / "t", tmp_path / "v", capsys)
    assert code == 0, err
    assert "attn_kv_cache_save from the elementwise:kv_store regressor" in printed and "GB/s" not in printed
    _, attention = read_export(tmp_path / "v")
    save = attention["time_stats.attn_kv_cache_save.median"]
    prefill = attention["is_prefill"].astype(bool)
    assert save[prefill].nunique() == 1                       # one sequence, whatever its chunk
    by_batch = save[~prefill].groupby(attention.loc[~prefill, "batch_size"]).first()
    assert by_batch.is_monotonic_increasing
    # the same regressor as the tables' kv_store term (layers x one store) at that term's knots
    term = pd.read_parquet(tmp_path / "t" / "kv_store.parquet").set_index("num_seqs")["time_ms"]
    common = sorted(set(term.index) & set(by_batch.index))
    assert len(common) >= 3
    np.testing.assert_allclose(by_batch.loc[common], term.loc[common] / PRESETS["tiny"].num_layers, rtol=1e-9)


def test_a_calibrated_directory_exports_its_base_scale_and_says_what_it_leaves_out(fitted_tables, tmp_path, capsys):
    """`stepcal calibrate` writes host terms into meta.json: the base's scale prices every operator, so
    every time is scaled by it; the other terms are not operator times and the line says they are left out."""
    code, _, err = export(fitted_tables, tmp_path / "plain", capsys)
    assert code == 0, err
    calibrated = tmp_path / "calibrated"
    shutil.copytree(fitted_tables, calibrated)
    meta = json.loads((calibrated / "meta.json").read_text())
    meta["host_terms"] = {"per_step_ms": 0.4, "per_request_ms": 2.0, "base_scale": 0.5}
    (calibrated / "meta.json").write_text(json.dumps(meta))
    code, printed, err = export(calibrated, tmp_path / "v", capsys)
    assert code == 0, err
    assert "every time times the calibration's base_scale 0.5" in printed
    assert "calibrated host terms left out (per_request_ms, per_step_ms): Vidur's files time operators only" in printed
    for plain, scaled in zip(read_export(tmp_path / "plain"), read_export(tmp_path / "v")):
        times = [c for c in plain.columns if c.startswith("time_stats.")]
        assert times and scaled.drop(columns=times).equals(plain.drop(columns=times))
        np.testing.assert_allclose(scaled[times], 0.5 * plain[times], rtol=1e-12)
    # a host_terms block that is no object is refused in one line, nothing written
    meta["host_terms"] = [0.4]
    (calibrated / "meta.json").write_text(json.dumps(meta))
    assert_refused(*export(calibrated, tmp_path / "bad", capsys), tmp_path / "bad", "host_terms must be an object")
