import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest

from stepcal.core.batch import StepBatch, StepFeatures
from stepcal.core.errors import InputError
from stepcal.costmodel.tables import TableStepModel, load_step_model
from stepcal.simulator.step_model import FeatureStepModel
from tests.costmodel.conftest import SPEC, decode_ms, gemm_ms, prefill_ms


def test_loaded_tables_are_a_feature_step_model(fitted_tables):
    model = load_step_model(fitted_tables)
    assert isinstance(model, FeatureStepModel) and isinstance(model, TableStepModel)
    meta = json.loads((fitted_tables / "meta.json").read_text())
    assert meta["mode"] == "composed"
    assert meta["t_step_terms"] == ["linear", "lm_head", "decode_attn", "prefill_attn"]
    # The synthetic profile's device ('Test CPU') has no datasheet: no roofline terms.
    assert meta["missing_terms"] == ["elementwise", "overhead", "sampling"]
    assert meta["host_terms"] is None and meta["model_spec"]["name"] == "tiny"
    assert meta["held_out_errors"]["gemm"]["random"]["mape"] < 10


def test_composed_decode_step_matches_the_synthetic_device(fitted_tables):
    model = load_step_model(fitted_tables)
    b, s = 8, 1000
    batch = StepBatch.of(range(b), [1] * b, [s] * b)
    layers = SPEC.num_layers
    shapes = SPEC.gemm_shapes()
    expected = (layers * sum(gemm_ms(b, *shapes[g]) for g in ("qkv_proj", "o_proj",
                                                              "gate_up_proj", "down_proj"))
                + gemm_ms(b, *shapes["lm_head"]) + layers * decode_ms(b * s))
    assert model.step_ms(batch) == pytest.approx(expected, rel=0.08)
    # One standard deviation of the step: the terms' spreads added in quadrature.
    spreads = [t.evaluate(batch.features(), "spread_ms")[0] for t in model.terms]
    assert model.step_ms_spread(batch) == pytest.approx(math.hypot(*spreads), rel=1e-12)
    assert max(spreads) <= model.step_ms_spread(batch) < sum(spreads)


def test_vectorised_and_single_step_paths_agree(fitted_tables):
    model = load_step_model(fitted_tables)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(30):
        b = int(rng.integers(1, 40))
        q = rng.integers(1, 600, b) * (rng.random(b) < 0.2) + 1
        batches.append(StepBatch.of(range(b), q, rng.integers(0, 3000, b)))
    f = StepFeatures.from_batches(batches)
    many = model.features_ms(f)
    one_by_one = np.array([model.step_ms(b) for b in batches])
    np.testing.assert_array_equal(many, one_by_one)
    # The synthetic device's law, term by term. Loose: these batches reach 3,229 new tokens and
    # 3,207 prefill tokens, past the profiled 2,048 and 1,024, where the forests go flat.
    shapes = SPEC.gemm_shapes()
    device_ms = (SPEC.num_layers * sum(gemm_ms(f.num_tokens, *shapes[g])
                                       for g in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
                 + gemm_ms(f.num_seqs, *shapes["lm_head"])
                 + SPEC.num_layers * np.where(f.num_decode > 0, decode_ms(f.decode_kv_sum), 0.0)
                 + SPEC.num_layers * np.where(f.prefill_tokens > 0, prefill_ms(f.prefill_attn_work), 0.0))
    np.testing.assert_allclose(many, device_ms, rtol=0.5)
    run = model.decode_run_ms(np.array([100, 200, 300]), 5)
    steps = [model.step_ms(StepBatch.of(range(3), [1, 1, 1], np.array([100, 200, 300]) + j))
             for j in range(5)]
    np.testing.assert_allclose(run, steps, rtol=1e-12)
    assert (np.diff(run) >= 0).all()        # longer caches never make a step faster


def test_host_terms_in_meta_are_added_once(fitted_tables, tmp_path):
    from stepcal.experiments.step_models import resolve_step_model
    copy = tmp_path / "t"
    shutil.copytree(fitted_tables, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["host_terms"] = {"per_step_ms": 0.5, "per_seq_ms": 0.01, "per_token_ms": 0.001,
                          "per_request_ms": 3.0}
    (copy / "meta.json").write_text(json.dumps(meta))
    base, calibrated = resolve_step_model(str(fitted_tables)), resolve_step_model(str(copy))
    batch = StepBatch.of(range(4), [1, 1, 1, 20], [50, 60, 70, 0])
    assert calibrated.step_ms(batch) - base.step_ms(batch) == pytest.approx(0.5 + 0.04 + 0.023)
    assert calibrated.per_request_ms == 3.0
    assert load_step_model(copy).step_ms(batch) == base.step_ms(batch)   # the tables alone add nothing


def test_broken_table_directories_fail_with_a_message(fitted_tables, tmp_path):
    with pytest.raises(InputError, match="no meta.json"):
        load_step_model(tmp_path)
    copy = tmp_path / "t"
    shutil.copytree(fitted_tables, copy)
    (copy / "linear.parquet").unlink()
    with pytest.raises(InputError, match="linear.parquet: no such file"):
        load_step_model(copy)
    pd.DataFrame({"num_tokens": [1.0]}).to_parquet(copy / "linear.parquet")
    with pytest.raises(InputError, match="missing column"):
        load_step_model(copy)


def test_tensor_parallel_tables_add_two_all_reduces_per_layer(tmp_path):
    """TP > 1 with all-reduce data: a term on num_tokens, 2 x layers x the fitted all-reduce of
    num_tokens x hidden elements; TP > 1 without it: the term is listed as missing."""
    from stepcal.core.model_spec import PRESETS
    from stepcal.experiments.cli import main
    from tests.costmodel.conftest import make_profile
    spec = PRESETS["tiny"]
    make_profile().to_parquet(tmp_path / "profile.parquet", index=False)
    sizes = np.geomspace(64, 1 << 24, 30).round()
    comm = pd.DataFrame({"num_gpus": 2, "message_size": sizes, "allreduce_dtype": "float32",
                         "latency": 0.005 + sizes * 4 / 2e8, "backend": "graph"})   # 5 us + bytes / 200 GB/s
    comm.to_parquet(tmp_path / "custom_allreduce_perf.parquet")
    for name, inputs in (("with", ["profile.parquet", "custom_allreduce_perf.parquet"]), ("without", ["profile.parquet"])):
        assert main(["fit", "--profile", *[str(tmp_path / f) for f in inputs], "--model-spec", "tiny", "--tp", "2",
                     "--regressor", "rf", "--no-mlflow", "--out", str(tmp_path / name)]) == 0
    meta = json.loads((tmp_path / "with" / "meta.json").read_text())
    assert meta["tp"] == 2 and "all_reduce" in meta["t_step_terms"] and "all_reduce" not in meta["missing_terms"]
    assert "all_reduce" in json.loads((tmp_path / "without" / "meta.json").read_text())["missing_terms"]
    model = load_step_model(tmp_path / "with")
    tokens = [16.0, 1024.0]
    f = StepFeatures.from_columns({n: tokens if n in ("num_tokens", "prefill_tokens") else [1.0, 1.0]
                                   for n in StepFeatures.__dataclass_fields__})
    expected = [2 * spec.num_layers * (0.005 + t * spec.hidden_size * 4 / 2e8) for t in tokens]
    assert model.term_ms(f)["all_reduce"] == pytest.approx(expected, rel=0.15)
    tp1 = tmp_path / "tp1"
    assert main(["fit", "--profile", str(tmp_path / "profile.parquet"), str(tmp_path / "custom_allreduce_perf.parquet"),
                 "--model-spec", "tiny", "--regressor", "rf", "--no-mlflow", "--out", str(tp1)]) == 0
    assert "all_reduce" not in json.loads((tp1 / "meta.json").read_text())["t_step_terms"]
