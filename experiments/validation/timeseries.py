"""The engine's queue over time, measured against simulated: a run imported from LLMServingSim's
bench keeps the engine's own once-a-tick record (timeseries.csv: running and waiting requests, KV
cache use in %), and the replay's step log and request log give the same series at the same ticks.

A tick at time t (seconds on the run's clock, whose zero is the first request's receipt) reads the
state the engine's logger would: running is the batch of the step in progress at t (the requests
scheduled and not finished), waiting the requests received by t that are neither finished nor in that
batch, KV use the step's cached and new tokens over the cache's capacity. The bench's ticks count from
its own start; `shift_s` moves them onto the run's clock (the import records both clocks).
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stepcal.core.errors import InputError
from stepcal.core.readers import one_line

if TYPE_CHECKING:
    import pandas as pd

SERIES = ("running", "waiting", "kv_cache_pct")   # the columns compared, where the measured one is recorded
TIMESERIES_COLUMNS = ("t", "running", "waiting", "kv_cache_pct")


def read_timeseries(path: Path) -> pd.DataFrame:
    """The bench's timeseries.csv: a tick time t (s) and the engine's counts at it."""
    import pandas as pd  # lazy: loads pandas
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read a bench's timeseries.csv: {one_line(exc)}") from None
    missing = [c for c in TIMESERIES_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    values = frame[list(TIMESERIES_COLUMNS)].apply(pd.to_numeric, errors="coerce")
    bad = ~np.isfinite(values.to_numpy(dtype=np.float64)).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{path}: line {i + 2}: t, running, waiting and kv_cache_pct must be numbers")
    return values


def simulated_series(ticks_s: np.ndarray, steps: pd.DataFrame, requests: pd.DataFrame,
                     kv_tokens: float | None) -> pd.DataFrame:
    """running, waiting and kv_cache_pct of the replay at each tick (s on the run's clock)."""
    import pandas as pd  # lazy: loads pandas
    starts = steps["start_s"].to_numpy(dtype=np.float64)
    ends = starts + steps["duration_ms"].to_numpy(dtype=np.float64) / 1e3
    current = np.searchsorted(starts, ticks_s, side="right") - 1       # the last step begun by t
    busy = (current >= 0) & (ticks_s < ends[np.maximum(current, 0)])  # ... and not yet ended
    running = np.where(busy, steps["num_seqs"].to_numpy(dtype=np.float64)[np.maximum(current, 0)], 0.0)
    arrived = np.searchsorted(np.sort(requests["arrival_s"].to_numpy(dtype=np.float64)), ticks_s, side="right")
    finish = requests["finish_s"].to_numpy(dtype=np.float64)
    finished = np.searchsorted(np.sort(finish[np.isfinite(finish)]), ticks_s, side="right")
    held = (steps["kv_sum"] + steps["num_tokens"]).to_numpy(dtype=np.float64)[np.maximum(current, 0)]
    kv_pct = np.where(busy, 100.0 * held / kv_tokens, 0.0) if kv_tokens else np.full(len(ticks_s), np.nan)
    return pd.DataFrame({"t": ticks_s, "running": running,
                         "waiting": np.maximum(arrived - finished - running, 0.0), "kv_cache_pct": kv_pct})


def compare_timeseries(measured: pd.DataFrame, simulated: pd.DataFrame) -> dict:
    """Per series recorded by the run (a column of zeros throughout counts as not recorded): the mean
    and peak of each side and the mean absolute difference per tick."""
    block = {"ticks": len(measured), "series": {}, "not_recorded": [], "not_simulated": []}
    for name in SERIES:
        ours, theirs = simulated[name].to_numpy(dtype=np.float64), measured[name].to_numpy(dtype=np.float64)
        if not np.any(theirs):
            block["not_recorded"].append(name)
            continue
        if not np.isfinite(ours).all():      # KV use of a replay without a KV capacity
            block["not_simulated"].append(name)
            continue
        block["series"][name] = {"measured_mean": float(theirs.mean()), "simulated_mean": float(ours.mean()),
                                 "measured_peak": float(theirs.max()), "simulated_peak": float(ours.max()),
                                 "mean_abs_diff": float(np.abs(ours - theirs).mean())}
    return block


def timeseries_block(run_dir: Path, meta: dict, steps: pd.DataFrame, requests: pd.DataFrame,
                     kv_blocks: int | None, block_size: int) -> tuple[dict, pd.DataFrame] | None:
    """validation.json's timeseries block and the per-tick table of both sides, for a run whose
    meta.json names a timeseries file; None for any other run."""
    name = meta.get("timeseries")
    if not name:
        return None
    measured = read_timeseries(Path(run_dir) / name)
    shift_s = bench_clock_shift_s(meta)
    ticks = measured["t"].to_numpy(dtype=np.float64) - shift_s
    simulated = simulated_series(ticks, steps, requests, kv_blocks * block_size if kv_blocks else None)
    block = {**compare_timeseries(measured, simulated), "file": name, "shift_s": shift_s}
    table = measured.add_prefix("measured_").assign(t_s=ticks, **simulated.drop(columns="t").add_prefix("simulated_"))
    return block, table


def bench_clock_shift_s(meta: dict) -> float:
    """Seconds from the bench's start (its ticks' zero) to the first request's receipt (the run's
    zero), from the two clocks the import recorded; 0 where either is missing."""
    started = (meta.get("bench_totals") or {}).get("started_at")
    clocks = meta.get("clock_alignment") or {}
    if not started or "epoch_minus_monotonic_s" not in clocks or "first_queued_monotonic_s" not in clocks:
        return 0.0
    start_epoch = datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    return clocks["first_queued_monotonic_s"] + clocks["epoch_minus_monotonic_s"] - start_epoch

