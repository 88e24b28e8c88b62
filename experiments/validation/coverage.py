"""How often the measured values fall inside the simulator's predicted intervals.

An interval that holds the truth as often as it claims is worth as much as a narrow one: with 90%
intervals, about 9 measured cells in 10 should fall inside.

A replication is one run: it draws one speed level of the device for the whole run, as one serving
of the workload meets one. So each repeat of a measured run is compared with the intervals on its
own (`coverage`: the share of repeat x cell pairs inside). The repeats' mean varies less than one run
does, so its share (`coverage_of_mean`) runs higher and is reported beside it, not instead.
"""
from __future__ import annotations

import numpy as np

from stepcal.core.measured_run import METRICS, STATS, RunStats


def coverage_block(measured: RunStats, stats: dict, repeats: list[RunStats] | None = None) -> dict:
    """Per metric and statistic: the interval, whether the measured value (the repeats' mean) is
    inside, its width relative to that value, and whether each repeat's own value is inside; then the
    share of repeat cells inside (`coverage`, over `num_cells` repeat x cell pairs), the same for the
    mean (`coverage_of_mean`) and the median relative width. Without `repeats`, `measured` is the one run."""
    repeats = list(repeats) if repeats else [measured]
    cells, inside_mean, inside_repeats, widths = {}, [], [], []
    for metric in METRICS:
        cells[metric] = {}
        for stat in STATS:
            cell = _cell(measured.stat(metric, stat), (stats.get(metric) or {}).get(stat),
                         [r.stat(metric, stat) for r in repeats])
            cells[metric][stat] = cell
            if cell is None:
                continue
            inside_mean.append(cell["inside"])
            inside_repeats += [hit for hit in cell["repeats_inside"] if hit is not None]
            if cell["relative_width"] is not None:
                widths.append(cell["relative_width"])
    return {**_share(inside_repeats), "num_repeats": len(repeats),
            "coverage_of_mean": _share(inside_mean),
            "median_relative_width": float(np.median(widths)) if widths else None, "cells": cells}


def _cell(value, interval, repeat_values: list) -> dict | None:
    if value is None or not interval:
        return None
    low, high = interval["low"], interval["high"]
    return {"measured": value, "low": low, "high": high, "inside": low <= value <= high,
            "relative_width": (high - low) / value if value else None,
            "repeats_inside": [None if v is None else bool(low <= v <= high) for v in repeat_values]}


def _share(hits: list) -> dict:
    return {"coverage": float(np.mean(hits)) if hits else None, "num_cells": len(hits),
            "num_inside": int(np.sum(hits))}
