"""The data rule's all-reduce axes (costmodel.axes, costmodel.compose.measured_axes) and `stepcal fit
--axes data|fixed`.

An all-reduce profile whose time steps up 30% past 700 tokens' messages (NCCL switching protocol)
composes, at TP 2, into an all_reduce term that reproduces its regressor at every integer around the
step; the message sizes are measured values of num_tokens in meta.json."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from stepcal.core.model_spec import PRESETS, Parallelism
from stepcal.costmodel.axes import DATA_RULE, FIXED_RULE, Axes
from stepcal.costmodel.build import build_tables
from stepcal.costmodel.compose_comm import all_reduce_ms, all_reduce_tokens
from stepcal.costmodel.fitting import FitConfig, fit_all
from stepcal.costmodel.records import make_records
from stepcal.costmodel.resolution import resolution_of_fit, summary
from stepcal.costmodel.tables import load_step_model
from stepcal.experiments.cli import main
from stepcal.experiments.fitting import FitOptions

SPEC = PRESETS["tiny"]
TP2 = Parallelism(tp=2)
GEMM_M = np.r_[1.0, 2.0, 4.0, np.arange(8.0, 2049.0, 8.0)]
ALL_REDUCE_TOKENS = np.arange(4.0, 2049.0, 4.0)
STEP_TOKENS = 700


def all_reduce_time_ms(tokens: np.ndarray) -> np.ndarray:
    """Latency + bytes at 100 GB/s, 30% slower past STEP_TOKENS tokens' messages."""
    message_bytes = tokens * SPEC.hidden_size * 4          # tiny is float32
    return (0.01 + message_bytes / 1e8) * np.where(tokens > STEP_TOKENS, 1.3, 1.0)


def _records() -> pd.DataFrame:
    parts = []
    for name, (n, k) in SPEC.gemm_shapes(TP2).items():
        parts.append(make_records(dict(row=np.arange(len(GEMM_M)), op="gemm", name=name, m=GEMM_M,
                                       n=np.full(len(GEMM_M), n), k=np.full(len(GEMM_M), k), dtype=SPEC.dtype,
                                       time_ms=0.004 + 2.0 * GEMM_M * n * k / 2e9), source="test", file="gemm"))
    # Messages recorded in elements (width 1), as the Vidur and AIConfigurator importers record them.
    elements = ALL_REDUCE_TOKENS * SPEC.hidden_size
    parts.append(make_records(dict(row=np.arange(len(elements)), op="all_reduce", name="nccl",
                                   tp=np.full(len(elements), 2.0), num_tokens=elements,
                                   width=np.ones(len(elements)), dtype=SPEC.dtype,
                                   time_ms=all_reduce_time_ms(ALL_REDUCE_TOKENS)), source="test", file="ar"))
    return pd.concat(parts, ignore_index=True)


@pytest.fixture(scope="module")
def fitted():
    return fit_all(_records(), FitConfig(regressor="rf"))


@pytest.fixture(scope="module")
def tables(fitted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("all_reduce_axes")
    build_tables(fitted, directory, spec=SPEC, parallelism=TP2)
    return directory


def _all_reduce_table(directory):
    return next(t for t in load_step_model(directory).terms if t.name == "all_reduce")


def test_message_sizes_are_measured_token_counts(fitted, tables):
    np.testing.assert_allclose(all_reduce_tokens(fitted, SPEC, TP2), ALL_REDUCE_TOKENS)
    assert all_reduce_tokens(fitted, SPEC, Parallelism()).size == 0       # no TP: no all-reduce term
    meta = json.loads((tables / "meta.json").read_text())
    assert set(ALL_REDUCE_TOKENS) <= set(meta["axes"]["measured"]["num_tokens"])
    assert set(ALL_REDUCE_TOKENS) <= set(meta["axes"]["num_tokens"])
    assert meta["axes"]["rule"] == DATA_RULE


def test_the_all_reduce_table_follows_its_step(fitted, tables):
    """Every integer around the step, knots or not: within 1% of the regressor (the step stays a
    step), where the fixed grid's table misses it by far more."""
    x = np.arange(600.0, 801.0)
    regressor = all_reduce_ms(fitted, SPEC, TP2, x, with_spread=False)[0]
    assert regressor[x > STEP_TOKENS + 4].min() > 1.2 * regressor[x < STEP_TOKENS - 4].max()   # the premise
    term = _all_reduce_table(tables)
    assert np.abs(np.interp(x, term.knots, term.time_ms) / regressor - 1).max() <= 0.01
    fixed = np.interp(x, Axes.default().num_tokens, all_reduce_ms(fitted, SPEC, TP2, Axes.default().num_tokens)[0])
    assert np.abs(fixed / regressor - 1).max() > 0.05


def test_resolution_compares_the_all_reduce_term(fitted):
    stats = summary(resolution_of_fit(fitted, SPEC, TP2))
    assert stats["all_reduce"]["n"] >= len(ALL_REDUCE_TOKENS)
    assert stats["all_reduce"]["max_pct"] <= 1.0


def test_fit_axes_flag(tmp_path, capsys):
    """--axes fixed: the old log grid, said in meta.json's axes.rule; the default is the data rule."""
    assert FitOptions(profile=[], out="").axes == "data"
    profile = tmp_path / "profile.parquet"
    _records().to_parquet(profile, index=False)
    out = tmp_path / "fixed"
    assert main(["fit", "--profile", str(profile), "--model-spec", "tiny", "--tp", "2", "--regressor", "rf",
                 "--no-mlflow", "--axes", "fixed", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["axes"]["rule"] == FIXED_RULE and meta["axes"]["rule"].startswith("fixed:")
    assert meta["axes"]["num_tokens"] == Axes.default().num_tokens.tolist()
    assert _all_reduce_table(out).knots.tolist() == Axes.default().num_tokens.tolist()
    capsys.readouterr()
    assert main(["fit", "--profile", str(profile), "--axes", "fine", "--out", str(tmp_path / "x")]) == 2
    assert "--axes: invalid choice: 'fine'" in capsys.readouterr().err
