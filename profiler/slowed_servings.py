"""Servings the machine slowed: a served workload (profiler.serve) timed in several profiles, one
serving's steps far slower than another serving's, once the profiles' common drift is taken out.

A workload forms the same batches in every serving, so two servings compare step by step. On this
project's shared 2-core VM the machine slowed stretches of several seconds, and with them whole
servings: in five quickstarts, 6 to 13 of the 23 workloads served in both profile halves were slowed
1.25-1.85x by the rule below, while the halves as a whole drifted 0.87-1.32x apart. Measured runs serve
a slowed repeat again (profiler.engine.slowdown); the profile kept its slowed servings, and the tables
fitted on both halves priced those campaigns' runs 7% slow on average, up to 35%; without them, 4% and
25%.

A serving i is one pass of a profile over a workload W (a grid's [serve] rounds make several passes;
profiler.sweep pools their samples per step, in order). x_i(W) is the median over W's steps of t_i / m,
where m is the step's median time over the servings; x_i(W) is then divided by pass i's drift, the
median of x_i over every workload that pass served. A serving is slowed when its x_i(W) exceeds
SLOWED_RATIO (the measured runs' threshold) times the smallest x_j(W) of that workload. Dividing by the
drift keeps a profile taken while the whole machine ran slower: averaging such profiles is what
profiling before and after the measurements is for (experiments.campaign).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from profiler.serve import SERVED

# The measured runs' threshold (profiler.engine.slowdown.SLOWED_RATIO, which imports the engine and
# torch with it; a test keeps the two equal).
SLOWED_RATIO = 1.25
MIN_STEPS = 8          # steps a workload's servings must share to be compared
COLUMNS = ["point_key", "op", "name", "q_lens", "kv_lens", "time_ms", "samples_ms"]


@dataclass(frozen=True)
class SlowedServing:
    file: str                # the profile that holds the slowed serving
    workload: str            # its point key (serve/SCHEDULER/cC/nN/pA-B/oA-B/mC/HASH)
    round: int               # which of that profile's passes over the workload (0-based)
    num_rounds: int          # the profile's passes over it (a grid's [serve] rounds)
    ratio: float             # x over the workload's fastest serving, the drift taken out
    rows: tuple[int, ...]    # the workload's step and host rows in that file (0-based)

    def to_dict(self) -> dict:
        return {"file": self.file, "workload": self.workload, "round": self.round, "num_rounds": self.num_rounds,
                "ratio": round(self.ratio, 3), "num_rows": len(self.rows)}


def served_steps(frame: pd.DataFrame) -> pd.DataFrame:
    """The served rows of one profile table, a row per pass (round) of the workload: its step key,
    batch, op, round, the workload's rounds in this profile, the time and the row number. A row pooled
    over fewer passes than its workload's others (its batch changed in between) has no round: -1."""
    out = ["workload", "step", "batch", "op", "round", "num_rounds", "time_ms", "row"]
    if not {"point_key", "op", "name", "time_ms"} <= set(frame.columns):
        return pd.DataFrame(columns=out)
    served = frame[frame["name"].eq(SERVED).fillna(False).to_numpy() & frame["op"].isin(("step", "host")).to_numpy()]
    step = served["point_key"].astype(str).str.rsplit("/", n=1).str[0]     # .../HASH/00012 (op dropped)
    samples = [_samples(row) for row in served.itertuples(index=False)]
    rows = pd.DataFrame({"workload": step.str.rsplit("/", n=1).str[0].to_numpy(), "step": step.to_numpy(),
                         "batch": [f"{_list(r, 'q_lens')}|{_list(r, 'kv_lens')}" for r in served.itertuples(index=False)],
                         "op": served["op"].to_numpy(), "samples": samples, "row": served.index.to_numpy()})
    rows["num_rounds"] = rows["samples"].map(len).groupby(rows["workload"]).transform("max")
    rows["round"] = [list(range(len(v))) if len(v) == n else [-1] for v, n in zip(rows["samples"], rows["num_rounds"])]
    rows = rows.explode("round", ignore_index=True)
    rows["round"] = rows["round"].astype(int)
    rows["time_ms"] = [v[k] if k >= 0 else np.nan for v, k in zip(rows["samples"], rows["round"])]
    return rows[out]


def _samples(row) -> list[float]:
    """A row's samples, one per pass (profiler.sweep.served_rows pools them); time_ms without them."""
    values = getattr(row, "samples_ms", None)
    if values is None or (np.ndim(values) == 0 and pd.isna(values)) or len(values) == 0:
        return [float(row.time_ms)]
    return [float(v) for v in values]


def _list(row, column: str) -> list | None:
    value = getattr(row, column, None)
    return None if value is None or np.ndim(value) == 0 else [int(v) for v in value]


def find_slowed(frames: dict[str, pd.DataFrame], ratio: float = SLOWED_RATIO) -> list[SlowedServing]:
    """The slowed servings among profile tables {file: frame} (the rule in the module docstring; a
    serving is one pass of a profile over a workload): none where no workload was served twice."""
    steps = {f: served_steps(frame) for f, frame in frames.items()}
    device = pd.concat([s[s["op"].eq("step") & s["round"].ge(0)].assign(file=f) for f, s in steps.items()],
                       ignore_index=True)
    device = device[device["time_ms"] > 0]
    if device.empty:
        return []
    device["serving"] = device["file"] + "#" + device["round"].astype(str)
    # a step compares only where every serving formed the same batch (a workload's seed fixes it)
    by_step = device.groupby("step")
    shared = device[by_step["batch"].transform("nunique").eq(1) & by_step["serving"].transform("nunique").ge(2)]
    if shared.empty:
        return []
    rel = shared["time_ms"] / shared.groupby("step")["time_ms"].transform("median")
    per = (shared.assign(rel=rel).groupby(["workload", "file", "round", "serving", "num_rounds"])
           .agg(x=("rel", "median"), n=("rel", "size")).reset_index())
    per = per[per["n"] >= MIN_STEPS].copy()
    per["x"] /= per.groupby("serving")["x"].transform("median")      # each pass's drift taken out
    per["over"] = per["x"] / per.groupby("workload")["x"].transform("min")
    slowed = per[per["over"] > ratio].sort_values(["file", "workload", "round"])
    return [SlowedServing(r.file, r.workload, int(r.round), int(r.num_rounds), float(r.over),
                          tuple(int(i) for i in _rows(steps[r.file], r.workload))) for r in slowed.itertuples()]


def _rows(steps: pd.DataFrame, workload: str) -> np.ndarray:
    return np.unique(steps.loc[steps["workload"].eq(workload), "row"].to_numpy())


def kept_times(frames: dict[str, pd.DataFrame], slowed: list[SlowedServing]) -> dict[str, dict[int, float | None]]:
    """{file: {row: its time over the passes kept, or None to leave the row out}} for the rows of
    every workload with a slowed serving: the median of its other passes' samples, or None where the
    profile has no other pass (or the row was pooled over fewer passes than its workload)."""
    out: dict[str, dict[int, float | None]] = {}
    by_workload: dict[tuple[str, str], list[SlowedServing]] = {}
    for s in slowed:
        by_workload.setdefault((s.file, s.workload), []).append(s)
    for (file, _), passes in by_workload.items():
        num_rounds, rows = passes[0].num_rounds, list(passes[0].rows)
        left = sorted(set(range(num_rounds)) - {s.round for s in passes})
        for row in frames[file].loc[rows].itertuples():
            samples = _samples(row)
            kept = [samples[k] for k in left] if len(samples) == num_rounds else []
            out.setdefault(file, {})[int(row.Index)] = float(np.median(kept)) if kept else None
    return out


def read_served(path: str) -> pd.DataFrame:
    """A profile table's columns that find_slowed reads (a table without served rows: none)."""
    import pyarrow.parquet as pq
    names = set(pq.read_schema(path).names)
    return pd.read_parquet(path, columns=[c for c in COLUMNS if c in names])


def describe(slowed: list[SlowedServing], limit: int = 3) -> str:
    """One line for `stepcal fit`'s output."""
    shown = ", ".join(label(s.workload, s.file, s.ratio, s.round, s.num_rounds) for s in slowed[:limit])
    more = f" and {len(slowed) - limit} more (meta.json: slowed_servings)" if len(slowed) > limit else ""
    return (f"left out {len(slowed)} serving(s) the machine slowed (over {SLOWED_RATIO}x another serving of the "
            f"same workload, step for step, each profile's drift taken out): {shown}{more}")


def label(workload: str, file: str, ratio: float, round_: int = 0, num_rounds: int = 1) -> str:
    """A slowed serving in a line: continuous/c2/n8/p16-1024/o4-128 in profile_late (1.52x), with its
    pass where the profile served the workload more than once (pass 2 of 2)."""
    where = Path(file).parent.name or file
    passes = f", pass {round_ + 1} of {num_rounds}" if num_rounds > 1 else ""
    return f"{'/'.join(workload.split('/')[1:6])} in {where}{passes} ({ratio:.2f}x)"


__all__ = ["SlowedServing", "describe", "find_slowed", "kept_times", "label", "read_served", "served_steps"]
