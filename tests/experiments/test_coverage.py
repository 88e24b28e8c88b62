"""Coverage of predicted intervals: each repeat of a measured run is one run, compared on its own."""
import pytest

from stepcal.core.measured_run import METRICS, STATS, MetricStats, RunStats
from stepcal.experiments.validation.coverage import coverage_block


def _run(ttft_p50: float) -> RunStats:
    metrics = {m: MetricStats() for m in METRICS}
    metrics["ttft_ms"] = MetricStats(p50=ttft_p50)
    return RunStats(metrics)


def _stats(low: float, high: float) -> dict:
    return {"ttft_ms": {"p50": {"median": (low + high) / 2, "low": low, "high": high}}}


def test_each_repeat_is_compared_with_the_interval_on_its_own():
    # repeats at 8 and 12: their mean 10 lies inside [9, 11], neither repeat does
    block = coverage_block(_run(10.0), _stats(9.0, 11.0), [_run(8.0), _run(12.0)])
    assert (block["num_cells"], block["num_inside"], block["coverage"]) == (2, 0, 0.0)
    assert block["coverage_of_mean"] == {"coverage": 1.0, "num_cells": 1, "num_inside": 1}
    cell = block["cells"]["ttft_ms"]["p50"]
    assert cell["inside"] and cell["repeats_inside"] == [False, False]
    assert cell["relative_width"] == pytest.approx(0.2)
    assert block["num_repeats"] == 2


def test_one_repeat_inside_one_outside_counts_half():
    block = coverage_block(_run(10.5), _stats(9.0, 11.0), [_run(10.0), _run(11.5)])
    assert (block["num_inside"], block["num_cells"]) == (1, 2)


def test_without_repeats_the_measured_value_is_the_one_run():
    block = coverage_block(_run(10.0), _stats(9.0, 11.0))
    assert (block["num_inside"], block["num_cells"], block["num_repeats"]) == (1, 1, 1)
    assert block["coverage_of_mean"]["num_inside"] == 1


def test_cells_without_a_value_or_an_interval_are_left_out():
    block = coverage_block(_run(10.0), {}, [_run(10.0)])
    assert block["num_cells"] == 0 and block["coverage"] is None
    assert all(block["cells"][m][s] is None for m in METRICS for s in STATS)
