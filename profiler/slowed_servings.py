"""Servings the machine slowed: a served workload (profiler.serve) timed in several profiles, one
serving's steps far slower than another serving's, once the profiles' common drift is taken out.

A workload forms the same batches in every serving, so two servings compare step by step. On this
project's shared 2-core VM the machine slowed stretches of several seconds, and with them whole
servings: in five quickstarts, 6 to 13 of the 23 workloads served in both profile halves were slowed
1.25-1.85x by the rule below, while the halves as a whole drifted 0.87-1.32x apart. Measured runs serve
a slowed repeat again (profiler.engine.slowdown); the profile kept its slowed servings, and the tables
fitted on both halves priced those campaigns' runs 7% slow on average, up to 35%; without them, 4% and
25%.

Per workload W and profile i, x_i(W) is the median over W's steps of t_i / m, where m is the step's
median time over the profiles that served it; x_i(W) is then divided by profile i's drift, the median
of x_i over every workload that profile served. A serving is slowed when its x_i(W) exceeds
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
COLUMNS = ["point_key", "op", "name", "q_lens", "kv_lens", "time_ms"]


@dataclass(frozen=True)
class SlowedServing:
    file: str                # the profile that holds the slowed serving
    workload: str            # its point key (serve/SCHEDULER/cC/nN/pA-B/oA-B/mC/HASH)
    ratio: float             # x_i(W) over the workload's fastest serving, the drift taken out
    rows: tuple[int, ...]    # its step and host rows in that file (0-based)

    def to_dict(self) -> dict:
        return {"file": self.file, "workload": self.workload, "ratio": round(self.ratio, 3),
                "num_rows": len(self.rows)}


def served_steps(frame: pd.DataFrame) -> pd.DataFrame:
    """The served rows of one profile table: workload, step key, batch, op, time and row number."""
    if not {"point_key", "op", "name", "time_ms"} <= set(frame.columns):
        return pd.DataFrame(columns=["workload", "step", "batch", "op", "time_ms", "row"])
    served = frame[frame["name"].eq(SERVED).fillna(False).to_numpy() & frame["op"].isin(("step", "host")).to_numpy()]
    keys = served["point_key"].astype(str)
    step = keys.str.rsplit("/", n=1).str[0]                    # .../HASH/00012 (the op's part dropped)
    batch = [f"{list(q)}|{list(s)}" for q, s in zip(served.get("q_lens", [None] * len(served)),
                                                     served.get("kv_lens", [None] * len(served)))]
    return pd.DataFrame({"workload": step.str.rsplit("/", n=1).str[0].to_numpy(), "step": step.to_numpy(),
                         "batch": batch, "op": served["op"].to_numpy(),
                         "time_ms": served["time_ms"].to_numpy(dtype=np.float64),
                         "row": served.index.to_numpy()})


def find_slowed(frames: dict[str, pd.DataFrame], ratio: float = SLOWED_RATIO) -> list[SlowedServing]:
    """The slowed servings among profile tables {file: frame} (the rule in the module docstring):
    none where no workload was served in two of them."""
    steps = {f: served_steps(frame) for f, frame in frames.items()}
    device = pd.concat([s[s["op"].eq("step")].assign(file=f) for f, s in steps.items()], ignore_index=True)
    if device.empty:
        return []
    # a step compares only where every serving formed the same batch (a workload's seed fixes it)
    same = device.groupby("step")["batch"].transform("nunique").eq(1)
    shared = device[same & device.groupby("step")["file"].transform("nunique").ge(2)]
    shared = shared[shared["time_ms"] > 0]
    if shared.empty:
        return []
    rel = shared["time_ms"] / shared.groupby("step")["time_ms"].transform("median")
    per = shared.assign(rel=rel).groupby(["workload", "file"]).agg(x=("rel", "median"), n=("rel", "size"))
    per = per[per["n"] >= MIN_STEPS].reset_index()
    per["x"] /= per.groupby("file")["x"].transform("median")      # each profile's drift taken out
    per["over"] = per["x"] / per.groupby("workload")["x"].transform("min")
    slowed = per[per["over"] > ratio]
    return [SlowedServing(r.file, r.workload, float(r.over), tuple(int(i) for i in _rows(steps[r.file], r.workload)))
            for r in slowed.sort_values(["file", "workload"]).itertuples()]


def _rows(steps: pd.DataFrame, workload: str) -> np.ndarray:
    return steps.loc[steps["workload"].eq(workload), "row"].to_numpy()


def read_served(path: str) -> pd.DataFrame:
    """A profile table's columns that find_slowed reads (a table without served rows: none)."""
    import pyarrow.parquet as pq
    names = set(pq.read_schema(path).names)
    return pd.read_parquet(path, columns=[c for c in COLUMNS if c in names])


def describe(slowed: list[SlowedServing], limit: int = 3) -> str:
    """One line for `stepcal fit`'s output."""
    shown = ", ".join(label(s.workload, s.file, s.ratio) for s in slowed[:limit])
    more = f" and {len(slowed) - limit} more (meta.json: slowed_servings)" if len(slowed) > limit else ""
    return (f"left out {len(slowed)} serving(s) the machine slowed (over {SLOWED_RATIO}x another serving of the "
            f"same workload, step for step, each profile's drift taken out): {shown}{more}")


def label(workload: str, file: str, ratio: float) -> str:
    """A slowed serving in a line: continuous/c2/n8/p16-1024/o4-128 in profile_late (1.52x)."""
    return f"{'/'.join(workload.split('/')[1:6])} in {Path(file).parent.name or file} ({ratio:.2f}x)"


__all__ = ["SlowedServing", "describe", "find_slowed", "label", "read_served", "served_steps"]
