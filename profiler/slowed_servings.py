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
profiler.sweep pools their samples per step, in order). Each step's time over its median over the
servings, t_i / m, is divided by pass i's drift: the median over every workload that pass served of
the serving's median t_i / m. A serving's steps are then compared the way measured repeats are, in
stretches of WINDOW_STEPS consecutive steps (all its steps where it has fewer): a stretch is slowed
where its median exceeds SLOWED_RATIO (both the runs' values) times the smallest median any serving of
W has over the same steps. The steps of its slowed stretches are left out of that serving (a stretch
is slowed once more than half its steps are, so up to half a stretch on either side goes too).
Stretches, not whole servings, because the machine slowed seconds of a serving as often as all of it:
over seven quickstarts, the stretch rule took the profiled tables' mean step-total error over the runs
from 8.9% to 7.8% where the whole-serving rule (a serving's median alone) had taken it from 11.2% to
8.9%. Dividing by the drift keeps a profile taken while the whole machine ran slower: averaging such
profiles is what profiling before and after the measurements is for (experiments.campaign).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

# the measured runs' threshold and stretch (profiler.engine.slowdown's): servings are judged alike
from stepcal.profiler.noise_policy import SLOWED_RATIO
from stepcal.profiler.noise_policy import SLOWED_WINDOW_STEPS as WINDOW_STEPS
from stepcal.profiler.serve import SERVED

MIN_STEPS = 8          # steps a workload's servings must share to be compared
COLUMNS = ["point_key", "op", "name", "q_lens", "kv_lens", "time_ms", "samples_ms"]


@dataclass(frozen=True)
class SlowedServing:
    file: str                # the profile that holds the slowed serving
    workload: str            # its point key (serve/SCHEDULER/cC/nN/pA-B/oA-B/mC/HASH)
    round: int               # which of that profile's passes over the workload (0-based)
    num_rounds: int          # the profile's passes over it (a grid's [serve] rounds)
    ratio: float             # its most slowed stretch over the workload's fastest serving there, drift out
    rows: tuple[int, ...]    # the slowed steps' step and host rows in that file (0-based)
    num_steps: int = 0       # the slowed steps
    of_steps: int = 0        # the steps its servings were compared on

    def to_dict(self) -> dict:
        return {"file": self.file, "workload": self.workload, "round": self.round, "num_rounds": self.num_rounds,
                "ratio": round(self.ratio, 3), "num_rows": len(self.rows), "num_steps": self.num_steps,
                "of_steps": self.of_steps}


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
    """The servings with slowed stretches among profile tables {file: frame} (the rule in the module
    docstring; a serving is one pass of a profile over a workload), one record per serving with its
    slowed steps: none where no workload was served twice."""
    steps = {f: served_steps(frame) for f, frame in frames.items()}
    shared = _shared_steps(steps)
    if shared.empty:
        return []
    out = []
    for workload, group in shared.groupby("workload", sort=True):
        table = group.pivot(index="step", columns="serving", values="rel").sort_index().dropna()
        if len(table) < MIN_STEPS or table.shape[1] < 2:
            continue
        excess = _stretch_excess(table.to_numpy())
        for j, serving in enumerate(table.columns):
            hit = excess[:, j] > ratio
            if not hit.any():
                continue
            file, round_ = serving.rsplit("#", 1)
            mine = steps[file]
            rows = mine.loc[mine["step"].isin(table.index[hit]), "row"].to_numpy()
            num_rounds = int(group.loc[group["serving"].eq(serving), "num_rounds"].iat[0])
            out.append(SlowedServing(file, workload, int(round_), num_rounds, float(excess[hit, j].max()),
                                     tuple(int(i) for i in np.unique(rows)), int(hit.sum()), len(table)))
    return sorted(out, key=lambda s: (s.file, s.workload, s.round))


def _shared_steps(steps: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The device rows of steps that two or more servings formed with the same batch (a workload's seed
    fixes it), each with rel: its time over the step's median over the servings, over its pass's drift."""
    device = pd.concat([s[s["op"].eq("step") & s["round"].ge(0)].assign(file=f) for f, s in steps.items()],
                       ignore_index=True)
    device = device[device["time_ms"] > 0]
    if device.empty:
        return device
    device["serving"] = device["file"] + "#" + device["round"].astype(str)
    by_step = device.groupby("step")
    shared = device[by_step["batch"].transform("nunique").eq(1) & by_step["serving"].transform("nunique").ge(2)].copy()
    if shared.empty:
        return shared
    shared["rel"] = shared["time_ms"] / shared.groupby("step")["time_ms"].transform("median")
    per = shared.groupby(["workload", "serving"]).agg(x=("rel", "median"), n=("rel", "size")).reset_index()
    drift = per[per["n"] >= MIN_STEPS].groupby("serving")["x"].median()
    shared["rel"] /= shared["serving"].map(drift)
    return shared.dropna(subset=["rel"])


def _stretch_excess(rel: np.ndarray) -> np.ndarray:
    """rel: a workload's steps (in order) x servings. Per step and serving, the largest excess of a
    stretch of WINDOW_STEPS steps holding it (all the steps where fewer): the stretch's median over
    the smallest median of any serving over the same steps."""
    num_steps = len(rel)
    width = min(WINDOW_STEPS, num_steps)
    medians = np.median(np.lib.stride_tricks.sliding_window_view(rel, width, axis=0), axis=-1)
    excess = medians / medians.min(axis=1, keepdims=True)
    # a step lies in stretches k-width+1 .. k: pad so that each step's stretches are one window
    padded = np.concatenate([np.full((width - 1, rel.shape[1]), -np.inf), excess,
                             np.full((width - 1, rel.shape[1]), -np.inf)])
    return np.lib.stride_tricks.sliding_window_view(padded, width, axis=0).max(axis=-1)[:num_steps]


def kept_times(frames: dict[str, pd.DataFrame], slowed: list[SlowedServing]) -> dict[str, dict[int, float | None]]:
    """{file: {row: its time over the passes kept, or None to leave the row out}} for the rows of
    every slowed step: the median of the samples of the passes not slowed there, or None where the
    profile has no such pass (or the row was pooled over fewer passes than its workload)."""
    passes: dict[str, dict[int, tuple[int, set]]] = {}
    for s in slowed:
        for row in s.rows:
            passes.setdefault(s.file, {}).setdefault(row, (s.num_rounds, set()))[1].add(s.round)
    out: dict[str, dict[int, float | None]] = {}
    for file, by_row in passes.items():
        for row in frames[file].loc[sorted(by_row)].itertuples():
            (num_rounds, rounds), samples = by_row[int(row.Index)], _samples(row)
            kept = [v for k, v in enumerate(samples) if k not in rounds] if len(samples) == num_rounds else []
            out.setdefault(file, {})[int(row.Index)] = float(np.median(kept)) if kept else None
    return out


def read_served(path: str) -> pd.DataFrame:
    """A profile table's columns that find_slowed reads (a table without served rows: none)."""
    import pyarrow.parquet as pq  # lazy: loads pyarrow
    names = set(pq.read_schema(path).names)
    return pd.read_parquet(path, columns=[c for c in COLUMNS if c in names])


def profiled_device(paths) -> str:
    """"cuda" where every one of these profile tables was timed on a GPU (their `device` column, the
    sweep's cpu or cuda), else "cpu": the device whose NoisePolicy says whether the fit drops slowed
    servings (a table without the column counts as the CPU's, as every profile was before GPUs)."""
    import pyarrow.parquet as pq  # lazy: loads pyarrow
    devices = set()
    for path in paths:
        if "device" not in pq.read_schema(path).names:
            return "cpu"
        devices |= {str(d) for d in pd.read_parquet(path, columns=["device"])["device"].dropna().unique()}
    return "cuda" if devices and all(d.startswith("cuda") for d in devices) else "cpu"


def describe(slowed: list[SlowedServing], limit: int = 3) -> str:
    """One line for `stepcal fit`'s output: how many steps, and the most slowed servings."""
    shown = ", ".join(labels([s.to_dict() for s in slowed])[:limit])
    more = f" and {len(slowed) - limit} more (meta.json: slowed_servings)" if len(slowed) > limit else ""
    return (f"left out {sum(s.num_steps for s in slowed)} served steps the machine slowed, in {len(slowed)} "
            f"serving(s) (a stretch of {WINDOW_STEPS} steps over {SLOWED_RATIO}x another serving's same steps, "
            f"each profile's drift taken out): {shown}{more}")


def labels(records: list[dict]) -> list[str]:
    """The slowed servings' records (SlowedServing.to_dict's, as meta.json keeps them) in lines, the
    most slowed first."""
    return [label(r) for r in sorted(records, key=lambda r: -r["ratio"])]


def label(record: dict) -> str:
    """A slowed serving (SlowedServing.to_dict's record, as meta.json keeps it) in a line:
    continuous/c2/n8/p16-1024/o4-128 in profile_late (1.52x, 40 of 96 steps), with its pass where the
    profile served the workload more than once (pass 2 of 2). Records written before stretches were
    compared have no step counts."""
    where = Path(record["file"]).parent.name or record["file"]
    num_rounds = record.get("num_rounds", 1)
    passes = f", pass {record.get('round', 0) + 1} of {num_rounds}" if num_rounds > 1 else ""
    count = f", {record['num_steps']} of {record['of_steps']} steps" if record.get("of_steps") else ""
    return f"{'/'.join(record['workload'].split('/')[1:6])} in {where}{passes} ({record['ratio']:.2f}x{count})"


__all__ = ["SlowedServing", "describe", "find_slowed", "kept_times", "label", "labels", "read_served",
           "served_steps"]
