"""T_step tables keep the resolution of their data (costmodel.axes): a GEMM profile whose time
steps up 10% past m = 512 (tile quantisation) composes into a table that reproduces the
regressor at every measured m, at the chunk sizes users pick and between them."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from stepcal.core.model_spec import PRESETS, Parallelism
from stepcal.costmodel import axes as axes_rule
from stepcal.costmodel.axes import DATA_RULE, FIXED_RULE, MAX_2D_KNOTS, Axes, dense_multiples, refine_steps
from stepcal.costmodel.build import build_tables
from stepcal.costmodel.compose import per_token_terms_ms
from stepcal.costmodel.fitting import FitConfig, fit_all
from stepcal.costmodel.records import make_records
from stepcal.costmodel.resolution import CHUNK_SIZES, resolution_of_directory, resolution_of_fit, summary
from stepcal.costmodel.tables import load_step_model

SPEC = PRESETS["tiny"]
PARALLELISM = Parallelism()
TRAINING_M = np.r_[1.0, 2.0, 4.0, np.arange(8.0, 2049.0, 8.0)]     # Vidur's sweep: every 8 tokens
STEP_M = 512
KV_MEANS = np.arange(16.0, 16.0 * 201, 16.0)                          # 200 values: more than the cap


def gemm_ms(m: np.ndarray, n: int, k: int) -> np.ndarray:
    """Launch + FLOPs at 2 TFLOP/s, 10% slower past STEP_M (one more row of tiles)."""
    return (0.004 + 2.0 * m * n * k / 2e9) * np.where(m > STEP_M, 1.1, 1.0)


def _gemm_records() -> pd.DataFrame:
    parts = []
    for name, (n, k) in SPEC.gemm_shapes().items():
        m = TRAINING_M
        parts.append(make_records(dict(row=np.arange(len(m)), op="gemm", name=name, m=m, n=np.full(len(m), n),
                                       k=np.full(len(m), k), dtype=SPEC.dtype, time_ms=gemm_ms(m, n, k)),
                                  source="test", file="gemm"))
    return pd.concat(parts, ignore_index=True)


def _decode_records() -> pd.DataFrame:
    b, kv = (a.ravel() for a in np.meshgrid([1.0, 2.0, 4.0, 8.0], KV_MEANS, indexing="ij"))
    zeros = np.zeros(len(b))
    return make_records(dict(row=np.arange(len(b)), op="attn_decode", name="uniform", num_decode=b, num_seqs=b,
                             num_tokens=b, decode_kv_sum=b * kv, decode_kv_max=kv, kv_sum=b * kv,
                             prefill_tokens=zeros, prefill_attn_work=zeros, num_heads=np.full(len(b), 4.0),
                             num_kv_heads=np.full(len(b), 2.0), head_dim=np.full(len(b), 64.0),
                             dtype=SPEC.dtype, time_ms=0.004 + b * kv * 1e-6),
                        source="test", file="decode")


@pytest.fixture(scope="module")
def fitted():
    records = pd.concat([_gemm_records(), _decode_records()], ignore_index=True)
    return fit_all(records, FitConfig(regressor="rf"))


@pytest.fixture(scope="module")
def tables(fitted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("resolution")
    build_tables(fitted, directory, spec=SPEC, parallelism=PARALLELISM)
    return directory


def test_the_regressor_keeps_the_step(fitted):
    """The premise: what the tables must not smear is in the fitted regressor."""
    linear = per_token_terms_ms(fitted, SPEC, PARALLELISM, np.array([504.0, 512.0, 520.0]))["linear"]
    assert linear[2] / linear[1] > 1.05 > linear[1] / linear[0]


def test_table_matches_the_regressor_at_every_training_m_and_chunk_size(tables):
    frame = resolution_of_directory(tables)
    assert set(frame["term"]) == {"linear", "lm_head"}
    assert set(frame.loc[frame["point"] == "measured", "x"]) == set(TRAINING_M)
    assert set(frame.loc[frame["point"] == "chunk", "x"]) == set(CHUNK_SIZES)
    assert summary(frame)["all"]["max_pct"] <= 1.0


def test_table_follows_the_step_between_the_training_points(fitted, tables):
    """Every integer from 256 to 1,024 tokens, knots or not: the step stays a step."""
    x = np.arange(256.0, 1025.0)
    linear = next(t for t in load_step_model(tables).terms if t.name == "linear")
    regressor = per_token_terms_ms(fitted, SPEC, PARALLELISM, x)["linear"]
    table = np.interp(x, linear.knots, linear.time_ms)
    assert np.abs(table / regressor - 1).max() <= 0.01


def test_the_fixed_grid_misses_the_step(fitted):
    """What the data's axes fix: the old log grid interpolates across the step."""
    frame = resolution_of_fit(fitted, SPEC, PARALLELISM, axes=Axes.default())
    assert summary(frame)["measured"]["max_pct"] > 2.0


def test_axes_hold_every_training_m_and_the_chunk_sizes_and_state_their_rule(tables):
    meta = json.loads((tables / "meta.json").read_text())
    axes = meta["axes"]
    assert axes["rule"] == DATA_RULE
    assert set(TRAINING_M) | set(CHUNK_SIZES) <= set(axes["num_tokens"])
    assert set(TRAINING_M) <= set(axes["num_seqs"])
    assert axes["measured"]["num_tokens"] == TRAINING_M.tolist()
    assert set(Axes.default().num_tokens) <= set(axes["num_tokens"])    # still covers beyond the data


def test_two_d_axes_stay_under_the_cap(tables):
    meta = json.loads((tables / "meta.json").read_text())
    assert len(meta["axes"]["measured"]["kv_mean"]) == len(KV_MEANS) > MAX_2D_KNOTS
    decode = pd.read_parquet(tables / meta["terms"]["decode_attn"]["file"])
    assert decode["kv_mean"].nunique() <= MAX_2D_KNOTS
    assert decode["num_decode"].nunique() <= MAX_2D_KNOTS
    assert set(Axes.default().kv_mean) <= set(decode["kv_mean"])


def test_fixed_axes_say_so_in_meta(fitted, tmp_path):
    meta = build_tables(fitted, tmp_path, spec=SPEC, parallelism=PARALLELISM, axes=Axes.default())
    assert meta.axes["rule"] == FIXED_RULE
    assert meta.axes["num_tokens"] == Axes.default().num_tokens.tolist()


def test_dense_multiples_fill_dense_stretches_only():
    measured = np.r_[np.arange(10.0, 1011.0, 10.0), 4000.0]
    multiples = dense_multiples(measured)
    assert {16.0, 512.0, 1008.0} <= set(multiples)
    assert not set(multiples) & {1024.0, 2048.0}    # inside the 1,010..4,000 gap: not dense


def test_refine_steps_brackets_a_step_inside_a_wide_gap():
    """A step at 517 between knots 256 and 1,024: knots land on both sides of it."""
    def values_at(x):
        return np.where(x >= 517, 2.0, 1.0)[None, :]
    knots = refine_steps(np.array([1.0, 256.0, 1024.0]), np.array([1.0, 1024.0]), values_at)
    assert {516.0, 517.0} <= set(knots)
    assert len(knots) <= 3 + 2 * axes_rule.STEP_ROUNDS
