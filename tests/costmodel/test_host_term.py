"""The host term: the profiler's `host` op fitted additively and added to T_step where the whole
steps are the profiler's own (device time only), not where engine step logs trained them."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from stepcal.core.batch import StepFeatures, batch_row
from stepcal.costmodel.tables import load_step_model
from stepcal.experiments.cli import main
from tests.costmodel.conftest import _row, make_profile, make_step_log, step_ms


def host_ms(num_seqs, num_tokens):
    return 0.1 + 0.01 * num_seqs + 0.0004 * num_tokens


def _host_and_step_rows() -> list[dict]:
    rows = []
    batches = [([1] * b, [256] * b) for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    batches += [([q], [0]) for q in (16, 64, 256, 1024)]
    batches += [([256] + [1] * 16, [0] + [256] * 16), ([128, 128] + [1] * 4, [0, 0] + [256] * 4)]
    for q, kv in batches:
        f = batch_row(q, kv)
        rows.append(_row("host", "case", host_ms(f["num_seqs"], f["num_tokens"]), q_lens=q, kv_lens=kv, **f))
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        q, kv = [1] * b, [512] * b
        f = batch_row(q, kv)
        rows.append(_row("step", "decode", step_ms(f), q_lens=q, kv_lens=kv, **f))
    for q in (64, 256, 1024):
        f = batch_row([q], [0])
        rows.append(_row("step", "prefill", step_ms(f), q_lens=[q], kv_lens=[0], **f))
    return rows


def _profile(tmp_path, with_kernels: bool = False):
    frame = pd.DataFrame(_host_and_step_rows())
    if with_kernels:
        frame = pd.concat([make_profile(), frame], ignore_index=True)
    path = tmp_path / "profile.parquet"
    frame.to_parquet(path, index=False)
    return path


def _fit(tmp_path, *inputs, ops=None, name="tables"):
    out = tmp_path / name
    args = ["fit", "--model-spec", "tiny", "--regressor", "rf", "--out", str(out), "--profile", *map(str, inputs)]
    if ops:
        args += ["--ops", ops]
    assert main(args) == 0
    return out, json.loads((out / "meta.json").read_text())


def _features(batches) -> StepFeatures:
    return StepFeatures.from_columns(pd.DataFrame([batch_row(q, kv) for q, kv in batches]))


def test_profiled_steps_get_the_host_term_added(tmp_path):
    out, meta = _fit(tmp_path, _profile(tmp_path), ops="step,host")
    assert meta["mode"] == "step" and meta["t_step_terms"] == ["step", "host"]
    assert meta["terms"]["host"]["axes"] == ["num_seqs", "num_tokens", "num_decode", "prefill_tokens", "kv_sum"]
    model = load_step_model(out)
    batches = [([1] * 8, [512] * 8), ([1] * 48, [300] * 48), ([512], [0])]
    parts = model.term_ms(_features(batches))
    np.testing.assert_allclose(model.features_ms(_features(batches)), parts["step"] + parts["host"])
    # the additive fit of a law additive in num_seqs and num_tokens, at batches it did not see
    expected = [host_ms(8, 8), host_ms(48, 48), host_ms(1, 512)]
    np.testing.assert_allclose(parts["host"], expected, rtol=0.05)


def test_the_host_term_prices_the_kv_it_addresses(tmp_path):
    """Served steps of long contexts cost more host time than short ones of as many sequences (block
    tables, read copies): the fit puts it on kv_sum, not on num_seqs."""
    def law(f):
        return host_ms(f["num_seqs"], f["num_tokens"]) + 0.00002 * f["kv_sum"]
    rows = [r for r in _host_and_step_rows() if r["op"] == "step"]
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        for kv in (64, 1024):     # short contexts at every size, long ones too: not one with the other
            f = batch_row([1] * b, [kv] * b)
            rows.append(_row("host", "case", law(f), q_lens=[1] * b, kv_lens=[kv] * b, **f))
    path = tmp_path / "profile.parquet"
    pd.DataFrame(rows).to_parquet(path, index=False)
    out, _ = _fit(tmp_path, path, ops="step,host")
    batches = [([1] * 48, [100] * 48), ([1] * 48, [900] * 48)]
    parts = load_step_model(out).term_ms(_features(batches))
    np.testing.assert_allclose(parts["host"], [law(batch_row(q, kv)) for q, kv in batches], rtol=0.05)


def test_step_logs_hold_the_host_time_already(tmp_path):
    log = tmp_path / "steps.parquet"
    make_step_log().to_parquet(log, index=False)
    _, meta = _fit(tmp_path, _profile(tmp_path), log, ops="step,host")
    assert meta["t_step_terms"] == ["step"] and "host" in meta["terms"]


def test_composed_tables_take_host_instead_of_overhead(tmp_path):
    out, meta = _fit(tmp_path, _profile(tmp_path, with_kernels=True), ops="gemm,attn_decode,attn_prefill,overhead,host")
    assert meta["mode"] == "composed"
    assert "host" in meta["t_step_terms"] and "overhead" not in meta["t_step_terms"]
    assert "overhead" not in meta["missing_terms"]     # the host term is the host time
    parts = load_step_model(out).term_ms(_features([([1] * 4, [256] * 4)]))
    np.testing.assert_allclose(parts["host"], [host_ms(4, 4)], rtol=0.05)


def test_additive_terms_carry_the_spread_of_their_fit_and_a_drawn_bias_moves_the_whole_term(tmp_path):
    """A bootstrap of the fit's rows gives each additive term one relative spread: wide for a profile's
    dozen points, and what --ranges draws (the curves move together, never apart)."""
    out, meta = _fit(tmp_path, _profile(tmp_path), ops="step,host")
    spreads = {name: meta["terms"][name]["relative_spread"] for name in ("step", "host")}
    assert all(0 < s < 0.5 for s in spreads.values()), spreads
    model = load_step_model(out)
    features = _features([([1] * 8, [512] * 8), ([512], [0])])
    for term in model.terms:
        np.testing.assert_allclose(term.evaluate(features, "spread_ms"), spreads[term.name] * term.evaluate(features))
        np.testing.assert_allclose(term.biased(2.0).evaluate(features), (1 + 2.0 * spreads[term.name]) * term.evaluate(features))
    noisy = tmp_path / "noisy.parquet"
    rows = pd.DataFrame(_host_and_step_rows())
    rows["time_ms"] *= np.exp(np.random.default_rng(0).normal(0, 0.2, len(rows)))
    rows.to_parquet(noisy, index=False)
    _, noisy_meta = _fit(tmp_path, noisy, ops="step,host", name="noisy")
    assert noisy_meta["terms"]["host"]["relative_spread"] > spreads["host"]   # a noisier fit is less sure


def test_a_bad_relative_spread_is_refused_naming_the_file(tmp_path):
    import pytest

    from stepcal.core.errors import InputError
    out, meta = _fit(tmp_path, _profile(tmp_path), ops="step,host")
    meta["terms"]["step"]["relative_spread"] = "wide"
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match=r"relative_spread must be a non-negative number, got 'wide'"):
        load_step_model(out)
