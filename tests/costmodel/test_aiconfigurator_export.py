"""`stepcal tables export --format aiconfigurator`: the files against AIConfigurator's reader contract,
without installing it. The reference is AIConfigurator's own vLLM H100 tables (shared data), which its
loader reads: every column they have must be in the export with the same Parquet type, and every
shape they time for the fitted model's heads must be in the export's grid.

The tables are fitted on a slice of those same tables (Llama-3-8B's heads, a few GEMM widths), so
the export's measured rows can be checked against the file's own latencies.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from stepcal.core.model_spec import PRESETS
from stepcal.costmodel.aiconfigurator_contract import system_problems
from stepcal.experiments.cli import main
from tests.costmodel.conftest import PROFILES, require_shared

AIC_H100 = PROFILES / "aiconfigurator" / "h100_sxm"
VERSION_DIR = Path("vllm") / "0.14.0"
TABLE_FILES = {"gemm_perf": "gemm", "context_attention_perf": "attention", "generation_attention_perf": "attention"}
GEMM_WIDTHS = (1024, 4096, 8192)


def _slice(table: str, frame: pd.DataFrame) -> pd.DataFrame:
    if table == "gemm_perf":
        keep = frame["n"].isin(GEMM_WIDTHS) & frame["k"].isin(GEMM_WIDTHS) & (frame["gemm_dtype"] == "bfloat16")
    else:
        keep = ((frame["num_heads"] == 32) & (frame["num_key_value_heads"] == 8)
                & (frame["kv_cache_dtype"] == "bfloat16"))
    return frame[keep].reset_index(drop=True)


@pytest.fixture(scope="module")
def aic_fit(tmp_path_factory) -> dict[str, Path]:
    """A slice of AIConfigurator's H100 tables as a system directory, and Llama-3-8B tables fitted on it."""
    require_shared(AIC_H100)
    base = tmp_path_factory.mktemp("aic")
    profile = base / "h100_sxm"
    for table, family in TABLE_FILES.items():
        source = AIC_H100 / family / VERSION_DIR / f"{table}.parquet"
        target = profile / family / VERSION_DIR / f"{table}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        _slice(table, pd.read_parquet(source)).to_parquet(target, index=False)
    tables = base / "tables"
    assert main(["fit", "--profile", str(profile), "--model-spec", "llama-3-8b", "--regressor", "rf",
                 "--no-mlflow", "--out", str(tables)]) == 0
    return {"profile": profile, "tables": tables, "base": base}


def export(tables: Path, out: Path, capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["tables", "export", str(tables), "--format", "aiconfigurator", "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def exported(aic_fit, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "systems"
    assert main(["tables", "export", str(aic_fit["tables"]), "--format", "aiconfigurator",
                 "--aic-system", "h100_fit", "--out", str(out)]) == 0
    return out


def _exported_table(out: Path, table: str):
    return pq.read_table(out / "data" / "h100_fit" / TABLE_FILES[table] / VERSION_DIR / f"{table}.parquet")


def test_the_system_yaml_names_the_tables_and_the_datasheet(exported):
    spec = yaml.safe_load((exported / "h100_fit.yaml").read_text())
    assert system_problems(spec) == []
    assert spec["data_dir"] == "data/h100_fit"
    assert spec["gpu"]["mem_bw"] == 3_350_000_000_000          # H100 SXM datasheet
    assert spec["gpu"]["mem_capacity"] == 80 * 2 ** 30
    assert spec["gpu"]["bfloat16_tc_flops"] == 989 * 10 ** 12
    assert spec["gpu"]["fp8_tc_flops"] == 2 * 989 * 10 ** 12    # Hopper: FP8 at twice BF16
    assert spec["node"]["intra_node_bw"] == 450 * 10 ** 9       # NVLink 4, one direction


def test_the_contract_names_what_a_system_yaml_lacks():
    assert system_problems({"gpu": {"mem_bw": 1, "mem_capacity": 0}}) == [
        "system yaml: no data_dir", "system yaml: no gpu.bfloat16_tc_flops", "system yaml: no node section",
        "system yaml: no misc section", "system yaml: gpu.mem_capacity must be a positive number, got 0"]


@pytest.mark.parametrize("table", sorted(TABLE_FILES))
def test_every_column_aiconfigurator_reads_is_there_with_its_type(exported, table):
    ours = _exported_table(exported, table).schema
    theirs = pq.read_schema(AIC_H100 / TABLE_FILES[table] / VERSION_DIR / f"{table}.parquet")
    for field in theirs:
        assert field.name in ours.names, f"{table}: no column {field.name}"
        assert ours.field(field.name).type == field.type, f"{table}: {field.name} is {ours.field(field.name).type}"
    assert set(ours.names) - set(theirs.names) == {"stepcal_source"}


@pytest.mark.parametrize("table", sorted(TABLE_FILES))
def test_every_shape_aiconfigurator_times_for_the_model_is_exported(exported, table):
    ours = _exported_table(exported, table).to_pandas()
    theirs = pd.read_parquet(AIC_H100 / TABLE_FILES[table] / VERSION_DIR / f"{table}.parquet")
    theirs = theirs[theirs["kv_cache_dtype" if table != "gemm_perf" else "gemm_dtype"] == "bfloat16"]
    if table != "gemm_perf":
        theirs = theirs[(theirs["num_heads"] == 32) & (theirs["num_key_value_heads"] == 8)]
    key = {"gemm_perf": ["m", "n", "k"], "context_attention_perf": ["batch_size", "isl"],
           "generation_attention_perf": ["batch_size", "step"]}[table]
    wanted = set(theirs[key].itertuples(index=False, name=None))
    have = set(ours[ours.get("num_heads", 32) == 32][key].itertuples(index=False, name=None)) \
        if table != "gemm_perf" else set(ours[key].itertuples(index=False, name=None))
    assert wanted - have == set()
    assert not ours.duplicated([c for c in ours.columns if c not in ("latency", "stepcal_source")]).any()
    assert (ours["latency"] > 0).all()


def test_measured_shapes_keep_the_profiles_time_and_the_rest_are_marked_predicted(aic_fit, exported):
    ours = _exported_table(exported, "gemm_perf").to_pandas()
    profile = pd.read_parquet(aic_fit["profile"] / "gemm" / VERSION_DIR / "gemm_perf.parquet")
    joined = ours.merge(profile[["m", "n", "k", "latency"]], on=["m", "n", "k"], how="left",
                        suffixes=("", "_profile"))
    measured = joined["stepcal_source"] == "measured"
    assert measured.sum() == len(profile)
    assert (joined.loc[measured, "latency"] == joined.loc[measured, "latency_profile"]).all()
    assert (joined.loc[~measured, "stepcal_source"] == "predicted").all()
    assert joined.loc[~measured, "latency_profile"].isna().all()


def test_predict_all_times_every_shape_from_the_fit(aic_fit, tmp_path, capsys):
    code, printed, err = export(aic_fit["tables"], tmp_path / "p", capsys, "--aic-predict-all")
    assert code == 0, err
    assert "0 measured by the profile" in printed
    gemm = pq.read_table(next((tmp_path / "p").rglob("gemm_perf.parquet"))).to_pandas()
    assert set(gemm["stepcal_source"]) == {"predicted"}
    profile = pd.read_parquet(aic_fit["profile"] / "gemm" / VERSION_DIR / "gemm_perf.parquet")
    joined = gemm.merge(profile[["m", "n", "k", "latency"]], on=["m", "n", "k"], suffixes=("", "_profile"))
    # The forest reproduces the rows it was fitted on closely, but not bit for bit.
    ratio = joined["latency"] / joined["latency_profile"]
    assert 0.8 < ratio.median() < 1.25
    assert not (joined["latency"] == joined["latency_profile"]).all()


def _edited(tables: Path, tmp_path: Path, **changes) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(tables, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta.update(changes)
    (copy / "meta.json").write_text(json.dumps(meta))
    return copy


@pytest.mark.parametrize("changes, needle", [
    ({"mode": "step"}, "time whole steps"),
    ({"host_terms": {"per_step_ms": 1.0}}, "calibrated host terms"),
    ({"provenance": {"devices": ["Test CPU"]}}, "no datasheet"),
    ({"model_spec": None}, "--model-spec"),
])
def test_what_aiconfigurator_cannot_express_is_refused_in_one_line(aic_fit, tmp_path, capsys, changes, needle):
    tables = _edited(aic_fit["tables"], tmp_path, **changes)
    code, printed, err = export(tables, tmp_path / "out", capsys)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_tables_without_attention_are_refused(aic_fit, tmp_path, capsys):
    meta = json.loads((aic_fit["tables"] / "meta.json").read_text())
    targets = {k: v for k, v in meta["targets"].items() if k != "attn_decode"}
    code, _, err = export(_edited(aic_fit["tables"], tmp_path, targets=targets), tmp_path / "out", capsys)
    assert code == 2 and "no fitted attn_decode regressor" in err


def test_a_system_name_that_is_not_a_file_name_is_refused(aic_fit, tmp_path, capsys):
    code, _, err = export(aic_fit["tables"], tmp_path / "out", capsys, "--aic-system", "../up")
    assert code == 2 and "--aic-system" in err


def test_aiconfigurator_flags_belong_to_its_format(aic_fit, tmp_path, capsys):
    code = main(["tables", "export", str(aic_fit["tables"]), "--format", "csv", "--aic-predict-all",
                 "--out", str(tmp_path / "c")])
    assert code == 2 and "--aic-predict-all" in capsys.readouterr().err


# ---- a mixture of experts under tensor parallelism: the MoE and all-reduce tables ----

MOE_FILES = {"moe_perf": "moe", "custom_allreduce_perf": "comm"}


def _moe_slice(table: str, frame: pd.DataFrame) -> pd.DataFrame:
    """Qwen3-30B-A3B at TP 2: 16 query and 2 KV heads on a GPU, its experts split in two."""
    if table == "moe_perf":
        keep = ((frame["hidden_size"] == 2048) & (frame["inter_size"] == 768) & (frame["moe_dtype"] == "bfloat16")
                & (frame["moe_tp_size"] == 2) & (frame["distribution"] == "balanced"))
    elif table == "custom_allreduce_perf":
        keep = frame["backend"] == "vllm_graph"
    elif table == "gemm_perf":
        keep = frame["n"].isin((2048, 4096)) & frame["k"].isin((2048, 4096)) & (frame["gemm_dtype"] == "bfloat16")
    else:
        keep = ((frame["num_heads"] == 16) & (frame["num_key_value_heads"] == 2)
                & (frame["kv_cache_dtype"] == "bfloat16"))
    return frame[keep].reset_index(drop=True)


@pytest.fixture(scope="module")
def moe_export(tmp_path_factory) -> dict[str, Path]:
    require_shared(AIC_H100)
    base = tmp_path_factory.mktemp("aic_moe")
    profile = base / "h100_sxm"
    for table, family in {**TABLE_FILES, **MOE_FILES}.items():
        target = profile / family / VERSION_DIR / f"{table}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        _moe_slice(table, pd.read_parquet(AIC_H100 / family / VERSION_DIR / f"{table}.parquet")).to_parquet(
            target, index=False)
    tables, out = base / "tables", base / "systems"
    assert main(["fit", "--profile", str(profile), "--model-spec", "qwen3-30b-a3b", "--tp", "2",
                 "--regressor", "rf", "--no-mlflow", "--out", str(tables)]) == 0
    assert main(["tables", "export", str(tables), "--format", "aiconfigurator", "--out", str(out)]) == 0
    return {"profile": profile, "out": out}


@pytest.mark.parametrize("table", sorted(MOE_FILES))
def test_moe_and_all_reduce_tables_meet_the_contract(moe_export, table):
    family = MOE_FILES[table]
    ours = pq.read_table(moe_export["out"] / "data" / "stepcal_h100_sxm" / family / VERSION_DIR / f"{table}.parquet")
    theirs_path = AIC_H100 / family / VERSION_DIR / f"{table}.parquet"
    for field in pq.read_schema(theirs_path):
        assert ours.schema.field(field.name).type == field.type, f"{table}: {field.name}"
    ours, profile = ours.to_pandas(), pd.read_parquet(moe_export["profile"] / family / VERSION_DIR / f"{table}.parquet")
    key = {"moe_perf": ["num_tokens", "moe_tp_size", "moe_ep_size", "distribution"],
           "custom_allreduce_perf": ["num_gpus", "message_size", "backend"]}[table]
    joined = profile[key + ["latency"]].merge(ours, on=key, how="left", suffixes=("_profile", ""))
    # Every shape the profile timed is in the export, with the profile's own time.
    assert joined["latency"].notna().all()
    assert (joined["stepcal_source"] == "measured").all()
    assert (joined["latency"] == joined["latency_profile"]).all()
    assert not ours.duplicated([c for c in ours.columns if c not in ("latency", "stepcal_source")]).any()


def test_an_mla_fit_without_gqa_attention_is_refused(aic_fit, tmp_path, capsys):
    """AIConfigurator's loader stops without context-attention rows, for DeepSeek-V3 too."""
    code, _, err = export(_edited(aic_fit["tables"], tmp_path, model_spec=PRESETS["deepseek-v3"].to_dict()),
                          tmp_path / "out", capsys)
    assert code == 2 and "mla_prefill, mla_decode" in err and "GQA attention tables" in err
