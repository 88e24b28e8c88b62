"""How often the measured values fall inside the simulator's predicted intervals (issue 17).

An interval that holds the truth as often as it claims is worth as much as a narrow one: with 90%
intervals, about 9 measured cells in 10 should fall inside.
"""
from __future__ import annotations

import numpy as np

from simulator.measured_run import METRICS, STATS, RunStats


def coverage_block(measured: RunStats, stats: dict) -> dict:
    """Per metric and statistic: the interval, whether the measured value is inside, and its width
    relative to the measured value; then the share of cells inside (`coverage`) and the median
    relative width over the cells where both exist."""
    cells, inside, widths = {}, [], []
    for metric in METRICS:
        cells[metric] = {}
        for stat in STATS:
            value = measured.stat(metric, stat)
            interval = (stats.get(metric) or {}).get(stat)
            if value is None or not interval:
                cells[metric][stat] = None
                continue
            hit = interval["low"] <= value <= interval["high"]
            width = (interval["high"] - interval["low"]) / value if value else None
            cells[metric][stat] = {"measured": value, "low": interval["low"], "high": interval["high"],
                                   "inside": hit, "relative_width": width}
            inside.append(hit)
            if width is not None:
                widths.append(width)
    return {"coverage": float(np.mean(inside)) if inside else None, "num_cells": len(inside),
            "num_inside": int(np.sum(inside)), "median_relative_width": float(np.median(widths)) if widths else None,
            "cells": cells}
