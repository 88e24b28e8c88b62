"""experiments.validation.model_error and error_sources: --ranges draws the fit's held-out error per
term and region, widens with it, says which sources it drew and which are not known, and is seeded."""
import numpy as np
import pytest

from stepcal.core.batch import StepFeatures, feature_row
from stepcal.costmodel.table_meta import TableMeta
from stepcal.costmodel.tables import load_step_model
from stepcal.costmodel.terms import FeatureCurve
from stepcal.experiments.replications import RangesSettings, ReplicaPool, keep_summary, replicate_ranges
from stepcal.experiments.validation.error_sources import sources_text
from stepcal.experiments.validation.model_error import DrawnErrorTerm, model_error_of, with_model_error
from stepcal.simulator.ranges import ranges_block, replication_seeds
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.simulation import SimConfig
from tests.simulator.factories import random_trace

TRACE = random_trace(60, seed=4, rate=5.0, max_prompt=400, max_output=60)
CONFIG = SimConfig(kv_blocks=400, scatter=Scatter(0.0))
KNOTS = np.array([1.0, 64.0, 256.0, 1024.0])
FITTED_MAX = 256.0


def model_error(inside: float, beyond: float | None = None) -> dict:
    """meta.json model_error of one target (gemm) whose held-out log errors spread evenly over
    +-`inside` (random split) and +-`beyond` (extrapolation split), stored at 5 quantiles."""
    def split(half):
        return {"n": 40, "log_ratio": list(np.linspace(-half, half, 5))}
    splits = {"random": split(inside)} | ({"extrapolation": split(beyond)} if beyond is not None else {})
    return {"targets": {"gemm": {"splits": splits, "repeat_cv": None}}}


def write_tables(directory, error: dict | None, mape: float | None = None, missing: tuple = ()):
    """A one-term table directory (linear, by num_tokens), fitted on num_tokens up to FITTED_MAX;
    `missing`: the terms it says it lacks."""
    directory.mkdir(parents=True, exist_ok=True)
    curve = FeatureCurve("linear", "num_tokens", KNOTS, 2.0 + 0.02 * KNOTS, np.zeros(len(KNOTS)), "GEMMs")
    held = {"gemm": {"random": {"mape": mape}, "extrapolation": {"mape": 3 * mape}}} if mape else {}
    TableMeta(t_step_terms=["linear"], terms={"linear": curve.write(directory)},
              term_sources={"linear": {"source": "data"}}, targets={"gemm": {}} if (error or mape) else {},
              held_out_errors=held, model_error=error, missing_terms=list(missing),
              axes={"measured": {"num_tokens": [1.0, 16.0, FITTED_MAX]}}).write(directory)
    return directory


def widths(directory, replications: int = 12) -> float:
    """The median relative width of the TTFT and E2E intervals over `replications`."""
    model = load_step_model(directory)
    error = model_error_of(model.meta)
    with ReplicaPool(TRACE, model, CONFIG, model_error=error) as pool:
        block = ranges_block(pool.map(keep_summary, replication_seeds(replications, 0)))
    cells = [block[m][s] for m in ("ttft_ms", "e2e_ms") for s in ("mean", "p50", "p90")]
    return float(np.median([(c["high"] - c["low"]) / c["median"] for c in cells]))


def test_the_interval_grows_with_the_held_out_error(tmp_path):
    narrow = widths(write_tables(tmp_path / "narrow", model_error(0.05, 0.05)))
    wide = widths(write_tables(tmp_path / "wide", model_error(0.3, 0.3)))
    assert 0.0 < narrow < wide
    assert wide > 2.5 * narrow


def test_old_tables_fall_back_on_the_recorded_mape_and_grow_with_it(tmp_path):
    small = model_error_of(TableMeta.read(write_tables(tmp_path / "small", None, mape=2.0)))
    assert [t.kind for t in small.terms] == ["residuals not known: widened by the recorded MAPE"]
    assert widths(tmp_path / "small") < widths(write_tables(tmp_path / "large", None, mape=20.0))
    block = replicate_ranges(RangesSettings(2), str(tmp_path / "small"), TRACE, load_step_model(tmp_path / "small"),
                             CONFIG, quiet=True)
    # the MAPE widens the tables' spread rather than replace it
    assert block["sources"]["tables_spread"]["terms"] == ["linear"]
    drawn = with_model_error(load_step_model(tmp_path / "small"), small, seed=0).terms[0]
    assert drawn.keeps_spread and drawn.biased(1.0) is not drawn


def test_tables_with_no_held_out_error_draw_none_and_say_it_is_not_known(tmp_path):
    directory = write_tables(tmp_path / "none", None)
    error = model_error_of(TableMeta.read(directory))
    assert [t.kind for t in error.terms] == ["not known"] and not error.is_known
    assert widths(directory) == 0.0
    block = replicate_ranges(RangesSettings(3), str(directory), TRACE, load_step_model(directory), CONFIG, quiet=True)
    sources = block["sources"]
    assert sources["model_error"] == {"drawn": False, "from": "not known"}
    assert not sources["run_to_run"]["drawn"] and sources["run_to_run"]["from"] == "not known"
    assert "not known (not in the interval): model error, step scatter, run-to-run spread" in sources_text(sources)


def test_the_sources_block_lists_each_drawn_source_with_its_size(tmp_path):
    directory = write_tables(tmp_path / "known", model_error(0.1, 0.4))
    settings = RangesSettings(3)
    block = replicate_ranges(settings, str(directory), TRACE, load_step_model(directory), CONFIG, quiet=True)
    model = block["sources"]["model_error"]
    assert model["drawn"] and model["from"] == "held-out residuals"
    assert model["terms"]["linear"]["targets"] == ["gemm"]
    assert model["terms"]["linear"]["log_half_width_inside"] == pytest.approx(0.09)    # 5th-95th of +-0.1
    assert model["terms"]["linear"]["log_half_width_beyond"] == pytest.approx(0.36)
    assert block["sources"]["tables_spread"]["terms"] == []   # replaced by the held-out error
    assert sources_text(block["sources"]).startswith("error sources drawn: model error (held-out residuals, 1 terms)")


def test_the_draw_is_seeded(tmp_path):
    directory = write_tables(tmp_path / "seeded", model_error(0.2, 0.2))
    model = load_step_model(directory)
    error = model_error_of(model.meta)
    assert error.draw(5) == error.draw(5) and error.draw(5) != error.draw(6)
    with ReplicaPool(TRACE, model, CONFIG, model_error=error) as pool:
        first = pool.map(keep_summary, [3, 4])
        assert pool.map(keep_summary, [3, 4]) == first and first[0] != first[1]


def test_a_batch_past_the_fitted_range_draws_the_extrapolation_error(tmp_path):
    model = load_step_model(write_tables(tmp_path / "regions", model_error(0.0, 0.5)))
    drawn = with_model_error(model, model_error_of(model.meta), seed=1)
    term = drawn.terms[0]
    assert isinstance(term, DrawnErrorTerm) and term.inside == 1.0 and term.beyond != 1.0
    q_lens = [np.array([100]), np.array([600])]   # within and past the fitted 256 tokens
    rows = [feature_row(q, np.zeros(1, dtype=np.int64)) for q in q_lens]
    plain = [model.terms[0].row_ms(row) for row in rows]
    assert term.row_ms(rows[0]) == plain[0]
    assert term.row_ms(rows[1]) == pytest.approx(plain[1] * term.beyond)
    vector = term.evaluate(StepFeatures(*np.array(rows, dtype=np.float64).T))
    np.testing.assert_allclose(vector, [term.row_ms(row) for row in rows])


def test_terms_the_tables_lack_are_named_as_not_known(tmp_path):
    directory = write_tables(tmp_path / "missing", model_error(0.1), missing=("all_reduce", "overhead"))
    block = replicate_ranges(RangesSettings(2), str(directory), TRACE, load_step_model(directory), CONFIG, quiet=True)
    assert block["sources"]["missing_terms"] == {"drawn": False, "from": "not known",
                                                 "terms": ["all_reduce", "overhead"]}
    assert "not known (not in the interval): terms the tables lack (all_reduce, overhead)" in \
        sources_text(block["sources"])


def test_the_noise_of_points_timed_once_is_taken_out_of_their_residuals():
    """Residuals of a normal spread 0.5, of points all timed once with a repeat scatter whose log
    variance is 0.09: the bias left has a spread of 0.4, about the same median."""
    from stepcal.experiments.validation.model_error import without_timing_noise
    levels = np.linspace(0.0005, 0.9995, 201)   # a fine grid, stored as if at 0, 1/200, ..., 1
    normal = np.array([float(np.sqrt(2.0) * 0.5 * _erfinv(2 * q - 1)) for q in levels]) + 0.1
    cv = float(np.sqrt(np.expm1(0.09)))
    pulled = np.asarray(without_timing_noise(normal, {"timed_once": 1.0, "repeat_cv": cv}))
    assert np.median(pulled) == pytest.approx(0.1, abs=1e-9)
    assert (pulled[-1] - 0.1) / (normal[-1] - 0.1) == pytest.approx(0.8, rel=0.05)
    assert without_timing_noise(normal, {"timed_once": None, "repeat_cv": cv}) == tuple(normal)
    assert without_timing_noise(normal, {"timed_once": 0.5, "repeat_cv": None}) == tuple(normal)
    all_noise = without_timing_noise(normal, {"timed_once": 1.0, "repeat_cv": 2.0})
    assert all_noise == pytest.approx([0.1] * len(normal))


def _erfinv(y: float) -> float:
    """The inverse error function, by bisection (no SciPy in these tests)."""
    import math
    low, high = -6.0, 6.0
    for _ in range(80):
        mid = (low + high) / 2.0
        low, high = (mid, high) if math.erf(mid) < y else (low, mid)
    return (low + high) / 2.0


def test_the_report_line_of_ranges_says_which_sources_were_drawn(tmp_path):
    from stepcal.experiments.report.ranges import ranges_text
    directory = write_tables(tmp_path / "report", model_error(0.1), missing=("overhead",))
    block = replicate_ranges(RangesSettings(2), str(directory), TRACE, load_step_model(directory), CONFIG, quiet=True)
    text = ranges_text(block)
    assert "Error sources drawn: model error (held-out residuals, 1 terms)" in text
    assert "terms the tables lack (overhead)" in text
    assert "Error sources" not in ranges_text({k: v for k, v in block.items() if k != "sources"})


def test_a_pool_of_workers_draws_the_same_model_error(tmp_path):
    directory = write_tables(tmp_path / "pool", model_error(0.2, 0.4))
    model = load_step_model(directory)
    error = model_error_of(model.meta)
    with ReplicaPool(TRACE, model, CONFIG, model_error=error) as alone:
        expected = alone.map(keep_summary, [0, 1, 2])
    with ReplicaPool(TRACE, model, CONFIG, workers=2, model_error=error) as pool:
        assert pool.map(keep_summary, [0, 1, 2]) == expected
