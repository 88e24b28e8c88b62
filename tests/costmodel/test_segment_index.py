"""The precomputed segment index (costmodel.grid.SegmentIndex) gives the binary search's segment, so
the tables' lookups give the same bits with it and without it: on random counts, at and around every
knot, beyond both ends, on non-integers, negatives and NaN, and on knots that are not integers."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stepcal.core.batch import FEATURE_NAMES, StepFeatures
from stepcal.costmodel import grid
from stepcal.costmodel.tables import TableStepModel, load_step_model


def probes(knots: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random counts inside and beyond the axis, every knot and its neighbours, fractions, odd values."""
    top = knots[-1]
    return np.concatenate([
        rng.integers(0, int(top * 1.5) + 2, 5000).astype(np.float64),
        knots, knots - 1.0, knots + 1.0, knots - 0.5, knots + 0.25, np.nextafter(knots, -np.inf),
        rng.uniform(-3.0, top * 2.0, 2000),
        [-1e9, -1.0, -0.5, 0.0, top, top + 1.0, 2.0 * grid.INDEX_MAX_INTEGERS, 1e12, np.nan, np.inf, -np.inf],
    ])


KNOTS = {
    "log grid": grid.axis(1, 65536, 72),
    "data axis": np.unique(np.r_[grid.axis(1, 65536, 72), np.arange(8.0, 1025.0, 8.0), [129.0, 257.0, 513.0]]),
    "fractional knots": np.array([0.5, 1.0, 2.25, 2.75, 3.0, 10.5, 100.0, 100.4, 1000.0]),
    "beyond the index": np.array([1.0, 16.0, 1000.0, 3.0 * grid.INDEX_MAX_INTEGERS]),
    "two knots": np.array([4.0, 8.0]),
}


@pytest.mark.parametrize("name", KNOTS)
def test_the_index_finds_the_searched_segment(name):
    knots = KNOTS[name]
    x = probes(knots, np.random.default_rng(0))
    index = grid.segment_index(knots)
    searched = np.clip(np.searchsorted(knots, x, side="right") - 1, 0, len(knots) - 2)
    np.testing.assert_array_equal(index.find(x), searched)
    # all-inside batches take the fast path: the same answer there
    inside = x[(x >= 0) & (x < index.limit)]
    np.testing.assert_array_equal(index.find(inside), searched[(x >= 0) & (x < index.limit)])
    square = x[: len(x) // 2 * 2].reshape(2, -1)
    np.testing.assert_array_equal(index.find(square), searched[: square.size].reshape(square.shape))


@pytest.mark.parametrize("name", KNOTS)
def test_indexed_interpolation_is_bit_identical(name):
    knots = KNOTS[name]
    rng = np.random.default_rng(1)
    values = rng.uniform(0.0, 10.0, len(knots))
    x = probes(knots, rng)
    index = grid.segment_index(knots)
    np.testing.assert_array_equal(grid.interp1(x, knots, values, index), grid.interp1(x, knots, values))
    rows, k, v = index.rows, knots.tolist(), values.tolist()
    for value in x[::7]:
        a, b = grid.interp1_at(float(value), k, v, rows), grid.interp1_at(float(value), k, v)
        assert a == b or (np.isnan(a) and np.isnan(b))


def test_indexed_bilinear_is_bit_identical():
    rng = np.random.default_rng(2)
    xk, yk = KNOTS["data axis"][:60], KNOTS["fractional knots"]
    values = rng.uniform(0.0, 5.0, (len(xk), len(yk)))
    x, y = rng.uniform(-5, 1500, 3000), rng.uniform(-5, 1500, 3000)
    indexes = (grid.segment_index(xk), grid.segment_index(yk))
    np.testing.assert_array_equal(grid.interp2(x, y, xk, yk, values, indexes), grid.interp2(x, y, xk, yk, values))
    rows = tuple(i.rows for i in indexes)
    for a, b in zip(x[:300], y[:300]):
        assert (grid.interp2_at(float(a), float(b), xk.tolist(), yk.tolist(), values.tolist(), rows)
                == grid.interp2_at(float(a), float(b), xk.tolist(), yk.tolist(), values.tolist()))


def test_tables_give_the_same_bits_with_and_without_the_index(fitted_tables):
    """A fitted table directory (composed terms: 1-D curves and 2-D attention grids) on random
    batches, vectorised and one at a time."""
    model = load_step_model(fitted_tables)
    searched = TableStepModel([dataclasses.replace(t, indexed=False) for t in model.terms], model.meta)
    assert all(t._index is None for t in searched.terms if hasattr(t, "_index"))
    rng = np.random.default_rng(3)
    n = 4000
    seqs = rng.integers(1, 300, n).astype(np.float64)
    columns = {name: np.zeros(n) for name in FEATURE_NAMES}
    columns.update(num_seqs=seqs, num_decode=np.floor(seqs * rng.uniform(0, 1, n)),
                   num_tokens=seqs + rng.integers(0, 70000, n), decode_kv_sum=seqs * rng.integers(1, 9000, n),
                   prefill_tokens=rng.integers(0, 5000, n).astype(np.float64))
    columns["prefill_attn_work"] = columns["prefill_tokens"] * rng.uniform(1, 20000, n)
    features = StepFeatures.from_columns(columns)
    np.testing.assert_array_equal(model.features_ms(features), searched.features_ms(features))
    for i in range(0, n, 13):
        row = tuple(float(columns[name][i]) for name in FEATURE_NAMES)
        assert model.row_ms(row) == searched.row_ms(row)


def test_a_pickled_model_ships_no_index_and_rebuilds_it(fitted_tables):
    """Replications in worker processes receive the model pickled: the indexes (megabytes on the data's
    axes) are rebuilt there, and the lookups give the same bits."""
    import pickle
    model = load_step_model(fitted_tables)
    shipped = pickle.dumps(model)
    assert any(getattr(t, "_index", None) is not None for t in model.terms)
    assert b"SegmentIndex" not in shipped
    assert len(shipped) < sum(len(pickle.dumps(t.__dict__)) for t in model.terms)
    back = pickle.loads(shipped)
    assert all(getattr(t, "_index", None) is not None for t in back.terms if hasattr(t, "_index"))
    features = StepFeatures.from_columns({name: np.full(50, 7.0) for name in FEATURE_NAMES})
    np.testing.assert_array_equal(back.features_ms(features), model.features_ms(features))
    biased = [t.biased(1.5) for t in back.terms]
    assert all(b._row_knots == t._row_knots for b, t in zip(biased, back.terms) if hasattr(t, "_row_knots"))
