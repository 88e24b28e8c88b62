"""Ranges: replications drawing the cost model's error and step scatter."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepcal.core.batch import StepFeatures
from stepcal.core.errors import InputError
from stepcal.simulator.ranges import draw_bias, ranges_block, replicate, term_names, with_bias
from stepcal.simulator.scatter import Scatter, ScatterSeries, run_level
from stepcal.simulator.simulation import SimConfig, simulate
from stepcal.simulator.step_model import FeatureStepModel, HostTerms, HostTermsModel, LinearStepModel
from tests.simulator.factories import random_trace


class FakeTerm:
    """A T_step term: time = a + b x num_tokens ms, spread = rel x that; `biased` moves the time
    by `shift` spreads, as costmodel's grid terms do."""

    def __init__(self, name: str, a: float, b: float, rel: float, shift: float = 0.0) -> None:
        self.name, self.a, self.b, self.rel, self.shift = name, a, b, rel, shift

    def evaluate(self, features, which: str = "time_ms") -> np.ndarray:
        time = self.a + self.b * np.asarray(features.num_tokens, dtype=np.float64)
        return time * self.rel if which == "spread_ms" else time * (1 + self.shift * self.rel)

    def biased(self, z: float) -> "FakeTerm":
        return FakeTerm(self.name, self.a, self.b, self.rel, self.shift + z)


class FakeTables(FeatureStepModel):
    def __init__(self, rel: float = 0.1) -> None:
        self.terms = [FakeTerm("linear", 2.0, 0.01, rel), FakeTerm("attn", 1.0, 0.002, rel)]

    def features_ms(self, features):
        return sum(np.maximum(t.evaluate(features), 0.0) for t in self.terms) * np.ones(len(features))

    def describe(self) -> str:
        return "fake"


TRACE = random_trace(150, seed=3, rate=4.0, max_prompt=800, max_output=120)


def test_with_nothing_drawn_every_replication_is_the_plain_run():
    tables = FakeTables()
    plain = simulate(TRACE, tables, SimConfig(kv_blocks=400, record_batches=False)).summary
    summaries = replicate(TRACE, tables, SimConfig(kv_blocks=400, scatter=Scatter(0.0)), 4, seed=7, spread_scale=0.0)
    assert all(s == plain for s in summaries)
    block = ranges_block(summaries)
    assert block["ttft_ms"]["p99"] == {"median": plain["ttft_ms"]["p99"], "low": plain["ttft_ms"]["p99"],
                                       "high": plain["ttft_ms"]["p99"]}


def test_the_interval_widens_with_the_spread():
    widths = []
    for scale in (0.0, 0.5, 1.0, 2.0):
        block = ranges_block(replicate(TRACE, FakeTables(), SimConfig(kv_blocks=400), 12, seed=1, spread_scale=scale))
        cell = block["tpot_ms"]["p50"]
        widths.append(cell["high"] - cell["low"])
    assert widths[0] == 0.0 and widths == sorted(widths) and widths[-1] > widths[1] > 0


def test_a_drawn_bias_moves_each_term_by_its_spread():
    tables = FakeTables(rel=0.2)
    biased = with_bias(tables, {"linear": 1.5, "attn": -1.0})
    assert type(biased) is FakeTables and biased.terms is not tables.terms
    features = StepFeatures.from_row((1, 100, 0, 0, 0, 100, 0, 0))   # one 100-token prefill
    linear, attn = (t.evaluate(features)[0] for t in tables.terms)
    assert biased.features_ms(features)[0] == pytest.approx(linear * (1 + 1.5 * 0.2) + attn * (1 - 0.2))
    # host terms stay on top of the drawn tables; const:/linear: models have nothing to draw
    hosted = with_bias(HostTermsModel(tables, HostTerms(per_step_ms=1.0)), {"linear": 1.0})
    assert isinstance(hosted, HostTermsModel) and type(hosted.base) is FakeTables and hosted.base is not tables
    linear_model = LinearStepModel(1.0, 0.1, 0.0)
    assert term_names(linear_model) == [] and with_bias(linear_model, draw_bias(linear_model, 0)) is linear_model
    assert draw_bias(tables, 3) == draw_bias(tables, 3) != draw_bias(tables, 4)


def test_scatter_series_has_the_asked_spread_and_autocorrelation():
    factors = ScatterSeries(Scatter(cv=0.1, rho=0.6), seed=0, replica=0).take(0, 40_000)
    e = factors - 1.0
    assert e.std() == pytest.approx(0.1, rel=0.05)
    assert np.corrcoef(e[:-1], e[1:])[0, 1] == pytest.approx(0.6, abs=0.03)
    again = ScatterSeries(Scatter(cv=0.1, rho=0.6), seed=0, replica=0)
    assert np.array_equal(again.take(100, 50), factors[100:150])   # the same factor for the same step
    assert not np.array_equal(ScatterSeries(Scatter(0.1, 0.6), 0, 1).take(0, 50), factors[:50])


def test_a_runs_speed_level_scales_every_step_alike_with_mean_one():
    levels = [ScatterSeries(Scatter(run_cv=0.2), seed=s, replica=0).take(0, 64) for s in range(2000)]
    for factors in levels[:5]:
        assert np.all(factors == factors[0]) and factors[0] != 1.0   # one level for the whole run
    first = np.array([f[0] for f in levels])
    assert first.mean() == pytest.approx(1.0, abs=0.02) and first.std() == pytest.approx(0.2, rel=0.1)
    steps = ScatterSeries(Scatter(0.1, 0.6), seed=3, replica=0).take(0, 100)
    both = ScatterSeries(Scatter(0.1, 0.6, run_cv=0.2), seed=3, replica=0)
    np.testing.assert_allclose(both.take(0, 100), steps * both.level)   # the step factors do not move


def log_levels(scatter: Scatter, num_seeds: int) -> np.ndarray:
    """log(level) + sigma^2 / 2 of replica 0 at seeds 0 .. num_seeds - 1: sigma times the drawn z."""
    sigma = scatter.level_sigma
    return np.array([np.log(run_level(scatter, seed, 0)) for seed in range(num_seeds)]) + sigma * sigma / 2


def test_an_estimated_run_cv_draws_the_level_from_students_t():
    """run_cv from n pairs of runs: the level's z is Student's t of n degrees of freedom (its 95th
    percentile 2.35 sigma for three pairs, against 1.64 for an exact run_cv), from the same normal z."""
    exact, three, many = (log_levels(Scatter(run_cv=0.1, run_cv_pairs=n), 6000) for n in (0, 3, 1_000_000))
    sigma = Scatter(run_cv=0.1).level_sigma
    assert np.percentile(np.abs(exact), 90) / sigma == pytest.approx(1.645, rel=0.06)
    assert np.percentile(np.abs(three), 90) / sigma == pytest.approx(2.353, rel=0.08)
    np.testing.assert_allclose(many, exact, rtol=0.05, atol=1e-3)    # t of many pairs: the normal again
    assert np.all(np.sign(three) == np.sign(exact))                    # z divided by a chi's mean


def test_a_model_calibrated_on_a_run_carries_its_speed():
    """A model fitted to a run of k repeats carries that run's level: a new run's level relative to
    it spreads by sqrt(1 + 1/k) times run_cv's, draw by draw."""
    plain, two = (log_levels(Scatter(run_cv=0.1, model_level_repeats=k), 50) for k in (0, 2))
    np.testing.assert_allclose(two, plain * np.sqrt(1.5))
    assert Scatter(run_cv=0.0, run_cv_pairs=3, model_level_repeats=2).is_zero   # no spread, nothing drawn


@pytest.mark.parametrize("cv, rho, run_cv", [(-0.1, 0.0, 0.0), (0.1, 1.0, 0.0), (float("nan"), 0.0, 0.0),
                                             (0.1, 0.0, -0.2)])
def test_bad_scatter_is_refused(cv, rho, run_cv):
    with pytest.raises(InputError):
        Scatter(cv, rho, run_cv)


@pytest.mark.parametrize("pairs, repeats", [(-1, 0), (2.5, 0), (0, -2), (True, 0)])
def test_bad_level_counts_are_refused(pairs, repeats):
    with pytest.raises(InputError, match="whole number"):
        Scatter(0.1, 0.0, 0.1, pairs, repeats)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 30), st.floats(0.0, 0.3), st.floats(-0.5, 0.9), st.integers(0, 100),
       st.sampled_from(["vllm", "sarathi", "continuous", "static"]), st.integers(1, 2))
def test_scatter_keeps_the_fast_path_exact(n, cv, rho, seed, scheduler, replicas):
    trace = random_trace(n, seed=seed, rate=20.0, max_prompt=300, max_output=80)
    config = SimConfig(scheduler=scheduler, scatter=Scatter(cv, rho), scatter_seed=seed, num_replicas=replicas)
    model = LinearStepModel(3.0, 0.01, 0.0005)
    fast = simulate(trace, model, config)
    slow = simulate(trace, model, SimConfig(**{**config.__dict__, "fast_path": False}))
    assert fast.requests.equals(slow.requests) and fast.steps.equals(slow.steps)


def test_ranges_block_keeps_the_summary_shape():
    summaries = [{"a": 1.0, "b": {"p50": 2.0, "p99": None}, "name": "x", "flag": True},
                 {"a": 3.0, "b": {"p50": 4.0, "p99": None}, "name": "x", "flag": True}]
    block = ranges_block(summaries)
    assert block == {"a": {"median": 2.0, "low": 1.1, "high": 2.9},
                     "b": {"p50": {"median": 3.0, "low": 2.1, "high": 3.9}, "p99": None}}


def test_a_process_pool_gives_the_same_replications():
    config = SimConfig(kv_blocks=400, scatter=Scatter(0.05, 0.3))
    alone = replicate(TRACE, FakeTables(), config, 3, seed=5)
    pooled = replicate(TRACE, FakeTables(), config, 3, seed=5, workers=2)
    assert pooled == alone and alone[0] != alone[1]
