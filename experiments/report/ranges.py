"""The report's view of ranges (validate --ranges, simulate --ranges): CDF bands from the replications'
latency quantiles (ranges_percentiles.parquet), each error-table cell's interval, and a simulation's
statistics as median and interval.

A CDF band is the envelope of the replications' CDFs: at each cumulative share q (0, 0.01, ..., 1) the
5th and 95th percentiles over the replications of their q-quantile, so the band holds 90% of the
replications' curves at every height, and the median curve runs through its middle.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepcal.experiments.replications import scatter_text
from stepcal.experiments.validation.error_sources import sources_text
from stepcal.simulator.ranges import INTERVAL


@dataclass(frozen=True)
class CdfBand:
    """One metric's band: at each share `quantiles[j]`, the replications' latencies (ms) low, median, high."""
    quantiles: np.ndarray
    low_ms: np.ndarray
    median_ms: np.ndarray
    high_ms: np.ndarray
    num_replications: int


def cdf_bands(table) -> dict[str, CdfBand]:
    """Per metric, the band of the replications in `table` (columns replication, metric, quantile, value_ms);
    a metric without a value in some replication at some share is left out (no band to draw)."""
    bands = {}
    for metric, rows in table.groupby("metric", sort=False):
        grid = rows.pivot_table(index="replication", columns="quantile", values="value_ms", aggfunc="first",
                                dropna=False)
        values = grid.to_numpy(dtype=np.float64)
        if values.size == 0 or not np.isfinite(values).all():
            continue
        low, median, high = np.percentile(values, [INTERVAL[0], 50.0, INTERVAL[1]], axis=0)
        bands[str(metric)] = CdfBand(grid.columns.to_numpy(dtype=np.float64), low, median, high, len(grid))
    return bands


def interval_cells(ranges: dict | None, metric: str, stat: str, measured: float | None) -> list[str]:
    """The error table's two extra cells: the 90% interval of the statistic, and whether the measured
    value lies inside it ('-' where either is missing)."""
    stats = (ranges or {}).get("stats") or {}
    cell = stats.get(metric) if not stat else (stats.get(metric) or {}).get(stat)
    if not cell or cell.get("low") is None or cell.get("high") is None:
        return ["-", "-"]
    inside = "-" if measured is None else ("yes" if cell["low"] <= measured <= cell["high"] else "no")
    return [f"{cell['low']:.4g} to {cell['high']:.4g}", inside]


def simulation_rows(summary: dict, ranges: dict, cells: tuple[tuple[str, str], ...]) -> list[list[str]]:
    """Per (metric, stat) of `cells`, and throughput: the plain run's value, the replications' median and
    their 90% interval ('-' where missing)."""
    stats = ranges.get("stats") or {}

    def row(metric: str, stat: str, plain, cell) -> list[str]:
        interval = "-" if not cell or cell.get("low") is None else f"{cell['low']:.4g} to {cell['high']:.4g}"
        median = "-" if not cell or cell.get("median") is None else f"{cell['median']:.4g}"
        return [metric, stat, "-" if plain is None else f"{plain:.4g}", median, interval]
    rows = [row(metric, stat, (summary.get(metric) or {}).get(stat), (stats.get(metric) or {}).get(stat))
            for metric, stat in cells]
    rows.append(row("throughput_rps", "", summary.get("throughput_rps"), stats.get("throughput_rps")))
    return rows


def ranges_text(ranges: dict) -> str:
    """One line: how many replications drew what, and how often the measured values fell inside."""
    coverage = ranges.get("coverage") or {}
    drawn = ", ".join(ranges.get("drawn_terms") or []) or "no term spread"
    lo, hi = ranges.get("interval_percentiles") or INTERVAL
    text = (f"Ranges: {ranges.get('num_replications')} replications (drawn: {drawn}; {scatter_text(ranges)}); "
            f"intervals are their {lo:g}th-{hi:g}th percentiles.")
    if coverage.get("num_cells"):
        width = coverage.get("median_relative_width")
        text += (f" The measured value lies inside in {coverage['num_inside']} of {coverage['num_cells']} cells "
                 f"(coverage {100 * coverage['coverage']:.0f}%)"
                 + (f"; median width {100 * width:.1f}% of the measured value." if width is not None else "."))
    if ranges.get("sources"):   # blocks written before the sources were listed have none
        line = sources_text(ranges["sources"])
        text += f" {line[0].upper()}{line[1:]}."
    return text
