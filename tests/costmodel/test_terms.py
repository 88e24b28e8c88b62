"""Each kind of T_step term writes what it reads, reads its feature columns by name, and gives
the same bits on the simulator's one-step path as on the vectorised one."""
import json

import numpy as np
import pytest

from stepcal.core.batch import FEATURE_NAMES, StepBatch, StepFeatures, feature_row
from stepcal.core.errors import InputError
from stepcal.costmodel.table_meta import TableMeta
from stepcal.costmodel.tables import load_step_model
from stepcal.costmodel.terms import TERM_KINDS, AdditiveStep, DecodeAttention, FeatureCurve, PrefillAttention


def write_tables(directory, terms) -> None:
    entries = {t.name: t.write(directory) for t in terms}
    TableMeta(t_step_terms=[t.name for t in terms], terms=entries).write(directory)


def plane(x, y):
    return 0.5 + 0.01 * x + 0.002 * y


def grid_terms():
    """One term of each kind, each exactly linear in its inputs so that lookups are exact."""
    by_decodes = np.array([1.0, 4.0, 16.0])
    curve = FeatureCurve("overhead", "num_decode", by_decodes, 0.1 + 0.05 * by_decodes,
                         0.01 * by_decodes, "host overhead by decodes")
    b, kv = np.array([1.0, 8.0, 64.0]), np.array([16.0, 256.0, 4096.0])
    decode = DecodeAttention("decode_attn", (b, kv), plane(*np.meshgrid(b, kv, indexing="ij")),
                             np.full((3, 3), 0.02), "decode attention")
    t, ctx = np.array([16.0, 512.0]), np.array([8.0, 1024.0, 8192.0])
    prefill = PrefillAttention("prefill_attn", (t, ctx), plane(*np.meshgrid(t, ctx, indexing="ij")),
                               np.full((2, 3), 0.03), "prefill attention")
    return [curve, decode, prefill]


def batches():
    return [StepBatch.of(range(3), [1, 1, 1], [100, 200, 300]),          # decodes only
            StepBatch.of(range(2), [300, 1], [50, 900]),                 # a prefill and a decode
            StepBatch.of(range(1), [40], [0])]                           # a prompt from scratch


def test_each_kind_reads_back_what_it_wrote_and_its_named_columns(tmp_path):
    write_tables(tmp_path, grid_terms())
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["terms"]["overhead"] == {"file": "overhead.parquet", "axes": ["num_decode"],
                                         "unit": "ms", "description": "host overhead by decodes"}
    model = load_step_model(tmp_path)
    assert [type(t) for t in model.terms] == [FeatureCurve, DecodeAttention, PrefillAttention]
    f = StepFeatures.from_batches(batches())
    terms = model.term_ms(f)
    # The curve reads num_decode (3, 1, 0 decodes), not num_seqs (3, 2, 1).
    np.testing.assert_allclose(terms["overhead"], [0.25, 0.15, 0.1])
    np.testing.assert_allclose(terms["decode_attn"], [plane(3, 200), plane(1, 900), 0.0])
    # Prefill: 300 new tokens over 50 cached attend to 50 + 301/2 on average; 40 from scratch to 41/2.
    np.testing.assert_allclose(terms["prefill_attn"], [0.0, plane(300, 50 + 301 / 2), plane(40, 41 / 2)])
    spread = model.features_spread_ms(f)
    np.testing.assert_allclose(spread, np.sqrt([0.03**2 + 0.02**2, 0.01**2 + 0.02**2 + 0.03**2,
                                                0.03**2]))


def test_the_one_step_path_gives_the_vectorised_bits(tmp_path):
    write_tables(tmp_path, grid_terms())
    model = load_step_model(tmp_path)
    rng = np.random.default_rng(1)
    many = [StepBatch.of(range(n), rng.integers(1, 3, n) ** rng.integers(0, 9, n), rng.integers(0, 9000, n))
            for n in rng.integers(1, 70, 50)]
    f = StepFeatures.from_batches(many)
    for term in model.terms:
        vectorised = term.evaluate(f)
        one_by_one = [term.row_ms(feature_row(b.q_lens, b.kv_lens)) for b in many]
        np.testing.assert_array_equal(vectorised, one_by_one, err_msg=term.name)


def test_the_whole_step_term_is_an_intercept_plus_one_curve_per_feature(tmp_path):
    knots = tuple(np.array([0.0, 10.0, 100.0]) for _ in FEATURE_NAMES)
    slopes = np.arange(1, len(FEATURE_NAMES) + 1) * 1e-3
    values = tuple(s * k for s, k in zip(slopes, knots))
    step = AdditiveStep("step", FEATURE_NAMES, knots, values, tuple(0.1 * v for v in values), 0.25,
                        "whole step")
    write_tables(tmp_path, [step])
    assert json.loads((tmp_path / "meta.json").read_text())["terms"]["step"]["intercept_ms"] == 0.25
    model = load_step_model(tmp_path)
    batch = StepBatch.of(range(3), [1, 1, 50], [100, 20, 0])
    row = feature_row(batch.q_lens, batch.kv_lens)
    assert model.step_ms(batch) == pytest.approx(0.25 + float(np.dot(slopes, row)), rel=1e-12)
    assert model.step_ms_spread(batch) == pytest.approx(0.1 * float(np.dot(slopes, row)), rel=1e-12)
    assert model.row_ms(row) == model.features_ms(batch.features())[0]


def test_a_curve_on_an_axis_that_is_not_a_batch_feature_is_refused(tmp_path):
    write_tables(tmp_path, grid_terms())
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta["terms"]["overhead"]["axes"] = ["kv_mean"]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match=r"overhead.parquet: axis 'kv_mean' is not a batch feature"):
        load_step_model(tmp_path)


def test_unknown_terms_and_mislabelled_grids_are_refused(tmp_path):
    write_tables(tmp_path, grid_terms())
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta["t_step_terms"] = ["decode_attn"]
    meta["terms"]["decode_attn"]["axes"] = ["num_seqs", "kv_mean"]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match=r"decode_attn.parquet: term 'decode_attn' has axes "
                                         r"\['num_decode', 'kv_mean'\], meta.json lists"):
        load_step_model(tmp_path)
    meta["t_step_terms"] = ["speculation"]
    meta["terms"]["speculation"] = {**meta["terms"]["overhead"]}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match=f"unknown term 'speculation'; known: {', '.join(TERM_KINDS)}"):
        load_step_model(tmp_path)


def test_a_term_is_written_only_under_a_name_of_its_kind(tmp_path):
    curve = grid_terms()[0]
    curve.name = "decode_attn"           # would load back as a 2-D grid
    with pytest.raises(ValueError, match="'decode_attn' is not a FeatureCurve"):
        curve.write(tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_biased_term_moves_by_z_spreads_and_keeps_its_fast_path():
    """simulator.ranges draws a term's error by moving its grid: evaluate(time) + z x evaluate(spread),
    on the vectorised path and the one-step path alike."""
    additive = AdditiveStep("step", ("num_tokens", "num_seqs"), (np.array([1.0, 100.0]), np.array([1.0, 8.0])),
                            (np.array([0.5, 2.0]), np.array([0.1, 0.4])), (np.array([0.1, 0.3]), np.array([0.0, 0.2])),
                            1.0, "whole step")
    f = StepFeatures.from_batches(batches())
    for term in grid_terms() + [additive]:
        moved = term.biased(-1.5)
        np.testing.assert_allclose(moved.evaluate(f), term.evaluate(f) - 1.5 * term.evaluate(f, "spread_ms"))
        np.testing.assert_array_equal(moved.evaluate(f, "spread_ms"), term.evaluate(f, "spread_ms"))
        assert [moved.row_ms(feature_row(b.q_lens, b.kv_lens)) for b in batches()] == moved.evaluate(f).tolist()


def test_drawn_tables_keep_the_tables_path_and_move_each_term_by_its_spread(tmp_path):
    from stepcal.simulator.ranges import with_bias
    write_tables(tmp_path, grid_terms())
    model = load_step_model(tmp_path)
    z = {"overhead": 0.7, "decode_attn": -2.0, "prefill_attn": 1.1}
    f = StepFeatures.from_batches(batches())
    before = model.features_ms(f).tolist()
    drawn = with_bias(model, z)
    assert type(drawn) is type(model) and drawn.terms is not model.terms
    moved = sum(np.maximum(t.evaluate(f) + z[t.name] * t.evaluate(f, "spread_ms"), 0.0) for t in model.terms)
    np.testing.assert_allclose(drawn.features_ms(f), moved)
    assert drawn.features_ms(f).tolist() != before and model.features_ms(f).tolist() == before
