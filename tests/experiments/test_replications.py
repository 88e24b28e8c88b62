"""experiments.replications: the replications that capacity, sweeps and validate's CDF bands run must
draw what simulator.ranges.replicate draws, in this process or in a pool."""
import numpy as np
import pytest

from stepcal.core.workload import rescale_rate
from stepcal.experiments.replications import (
    CDF_METRICS,
    CDF_QUANTILES,
    ReplicaPool,
    keep_summary,
    keep_summary_and_quantiles,
    quantile_frame,
    scatter_text,
)
from stepcal.simulator.frontend import FrontEnd
from stepcal.simulator.ranges import replicate, replication_seeds
from stepcal.simulator.ranges import run_replication as run_replica
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.simulation import SimConfig
from tests.experiments.ray_cluster import ray_cluster  # noqa: F401  (a fixture)
from tests.simulator.factories import random_trace
from tests.simulator.test_ranges import FakeTables

TRACE = random_trace(80, seed=5, rate=6.0, max_prompt=600, max_output=90)
CONFIG = SimConfig(kv_blocks=400, scatter=Scatter(0.1, 0.4), front_end=FrontEnd(median_ms=5.0, sigma=0.5))


@pytest.mark.parametrize("seed", [0, 7])
def test_a_replica_draws_what_simulator_ranges_replicate_draws(seed):
    """Term error, scatter and front end all drawn: the same summary as replicate's replication."""
    ours = run_replica(TRACE, FakeTables(rel=0.2), CONFIG, seed).summary
    assert ours == replicate(TRACE, FakeTables(rel=0.2), CONFIG, 1, seed=seed)[0]
    assert ours != run_replica(TRACE, FakeTables(rel=0.2), CONFIG, seed + 1).summary


def test_a_pool_shares_the_trace_and_gives_the_same_replications_at_any_rate():
    seeds = replication_seeds(3, seed=10)
    assert seeds == [10, 11, 12]
    with ReplicaPool(TRACE, FakeTables(), CONFIG, workers=1) as alone:
        expected = alone.map(keep_summary, seeds, rate_rps=12.0)
    with ReplicaPool(TRACE, FakeTables(), CONFIG, workers=2) as pool:
        assert pool.map(keep_summary, seeds, rate_rps=12.0) == expected
        assert pool.num_simulations == 3
    assert expected == replicate(rescale_rate(TRACE, 12.0), FakeTables(), CONFIG, 3, seed=10)


def test_kept_quantiles_are_the_replications_latency_quantiles():
    result = run_replica(TRACE, FakeTables(), CONFIG, 3)
    summary, quantiles = keep_summary_and_quantiles(result)
    assert summary == result.summary and set(quantiles) == set(CDF_METRICS)
    ttft = result.requests["ttft_ms"].dropna().to_numpy()
    np.testing.assert_allclose(quantiles["ttft_ms"], np.quantile(ttft, CDF_QUANTILES))
    assert quantiles["ttft_ms"][0] == ttft.min() and quantiles["ttft_ms"][-1] == ttft.max()
    assert quantiles["ttft_ms"][50] == pytest.approx(summary["ttft_ms"]["p50"])
    frame = quantile_frame([3, 4], [quantiles, quantiles])
    assert len(frame) == 2 * len(CDF_METRICS) * len(CDF_QUANTILES)
    assert frame.groupby("replication")["seed"].first().tolist() == [3, 4]
    first = frame[(frame["replication"] == 0) & (frame["metric"] == "ttft_ms")]
    np.testing.assert_allclose(first["value_ms"], quantiles["ttft_ms"])


def pooled_summaries(backend: str, workers: int) -> tuple[list[dict], int]:
    """The replications' summaries at two rates on `backend`, and how many times on_done was called."""
    done = []
    with ReplicaPool(TRACE, FakeTables(rel=0.2), CONFIG, workers, backend=backend) as pool:
        summaries = (pool.map(keep_summary, replication_seeds(4, seed=3), on_done=lambda: done.append(1))
                     + pool.map(keep_summary, [9, 8], 12.0, on_done=lambda: done.append(1)))
    return summaries, len(done)


def test_a_pool_calls_back_once_per_replication():
    assert pooled_summaries("local", 2) == pooled_summaries("local", 1)
    assert pooled_summaries("local", 1)[1] == 6


@pytest.mark.slow   # a local Ray cluster
def test_ray_gives_the_same_replications_in_the_same_order(ray_cluster):  # noqa: F811
    summaries, num_done = pooled_summaries("ray", 2)
    assert (summaries, num_done) == pooled_summaries("local", 1)
    assert len({s["e2e_ms"]["mean"] for s in summaries}) == len(summaries)   # each seed its own: the order shows


def test_scatter_text_says_how_the_runs_level_was_drawn():
    block = {"scatter_cv": 0.14, "scatter_rho": 0.84, "scatter_run_cv": 0.067}
    assert scatter_text(block) == "scatter cv 0.14, rho 0.84, run cv 0.067"
    assert scatter_text({**block, "scatter_run_cv_pairs": 3, "scatter_model_repeats": 2}) == (
        "scatter cv 0.14, rho 0.84, run cv 0.067 (3 pairs: Student's t; the model carries a 2-repeat run's speed)")
    assert scatter_text({**block, "scatter_run_cv_pairs": 1}).endswith("(1 pair: Student's t)")


def test_ranges_settings_default_to_the_ranges_flags():
    """The campaign replicates with RangesSettings' defaults: they must be what the --ranges flags default to."""
    from stepcal.experiments.cli import build_parser
    from stepcal.experiments.commands.flags import ranges_settings_from_args
    from stepcal.experiments.replications import RangesSettings
    for command in (["validate", "--measured", "m"], ["simulate", "--trace", "t", "--out", "o"]):
        args = build_parser().parse_args([*command, "--step-model", "const:5"])
        assert ranges_settings_from_args(args) == RangesSettings()
