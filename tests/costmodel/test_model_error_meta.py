"""What `stepcal fit` stores of its held-out error for --ranges (meta.json model_error): the held-out
log errors' quantiles, the profile's repeat scatter, and which targets price each T_step term."""
import json

import numpy as np
import pandas as pd
import pytest

from stepcal.costmodel.evaluation import RESIDUAL_QUANTILES, Z_P10_P90, log_residual_quantiles, repeat_cv
from stepcal.costmodel.table_meta import TableMeta


def test_residual_quantiles_keep_a_fits_bias_and_spread():
    measured = np.linspace(1.0, 50.0, 101)
    biased = log_residual_quantiles(measured, 1.25 * measured)
    assert biased["n"] == 101 and len(biased["log_ratio"]) == len(RESIDUAL_QUANTILES)
    np.testing.assert_allclose(biased["log_ratio"], np.log(1.25), atol=1e-5)
    errors = np.linspace(-0.2, 0.2, 101)
    spread = log_residual_quantiles(measured, measured * np.exp(errors))
    np.testing.assert_allclose(spread["log_ratio"], np.quantile(errors, RESIDUAL_QUANTILES), atol=1e-5)


def test_residual_quantiles_skip_unusable_rows_and_say_none_without_any():
    assert log_residual_quantiles([0.0, -1.0], [1.0, 1.0]) is None
    kept = log_residual_quantiles([2.0, 0.0, 4.0], [4.0, 1.0, 8.0])
    assert kept["n"] == 2 and kept["log_ratio"] == pytest.approx([np.log(2.0)] * len(RESIDUAL_QUANTILES), abs=1e-5)


def test_repeat_cv_from_percentiles_or_from_points_timed_again():
    timed = pd.DataFrame({"time_ms": [10.0, 20.0, 5.0], "time_ms_p10": [9.0, 18.0, 5.0],
                          "time_ms_p90": [11.0, 22.0, 5.0]})
    # the point timed once (p10 == p90) says nothing; the others span 20% of their median
    assert repeat_cv(timed) == pytest.approx(0.2 / Z_P10_P90, abs=1e-5)
    once = pd.DataFrame({"num_tokens": [8, 8, 8, 16], "time_ms": [1.0, 2.0, 4.0, 3.0]})
    once["time_ms_p10"] = once["time_ms_p90"] = once["time_ms"]
    assert repeat_cv(once, ("num_tokens",)) == pytest.approx(np.std(np.log([1.0, 2.0, 4.0]), ddof=1), abs=1e-5)
    assert repeat_cv(once) is None
    assert repeat_cv(pd.DataFrame({"time_ms": [1.0]})) is None


def test_fit_stores_the_held_out_error_of_every_target_and_maps_the_terms(fitted_tables):
    raw = json.loads((fitted_tables / "meta.json").read_text())
    meta = TableMeta.read(fitted_tables)
    stored = raw["model_error"]["targets"]
    assert set(stored) == set(meta.targets)
    for target, entry in stored.items():
        assert set(entry["splits"]) == set(meta.held_out_errors[target]) - {"holdout"}, target
        assert entry["timed_once"] is None or 0.0 <= entry["timed_once"] <= 1.0
        for held in entry["splits"].values():
            assert held["log_ratio"] == sorted(held["log_ratio"]) and held["n"] >= 1
            assert len(held["log_ratio"]) == len(raw["model_error"]["quantiles"])
    mapping = meta.term_targets()
    assert set(mapping) == set(meta.t_step_terms)
    assert all(set(targets) <= set(meta.targets) for targets in mapping.values())
    if "linear" in mapping:
        assert mapping["linear"] == ["gemm"]


def test_term_targets_of_old_tables_come_from_their_composition():
    meta = TableMeta(t_step_terms=["linear", "decode_attn", "elementwise", "overhead"],
                     term_sources={"elementwise": {"source": "data", "ops": ["add", "rope"]}},
                     composition={"decode_target": "attn_decode"},
                     targets={"gemm": {}, "attn_decode": {}, "elementwise:add": {}, "elementwise:rope": {}})
    assert meta.term_targets() == {"linear": ["gemm"], "decode_attn": ["attn_decode"],
                                   "elementwise": ["elementwise:add", "elementwise:rope"], "overhead": []}
    roofline = TableMeta(t_step_terms=["elementwise"], term_sources={"elementwise": {"source": "roofline"}})
    assert roofline.term_targets() == {"elementwise": []}
