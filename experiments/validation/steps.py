"""Step level: the model's time for each measured step, its error, and the step-time noise floor
(the same batch timed in two repeats)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepcal.core.batch import StepBatch
from stepcal.experiments.validation.measured import MeasuredRun


@dataclass(frozen=True)
class StepNoiseFloor:
    """Run-to-run noise of step time itself, over the batches repeat 0 and repeat 1 both ran."""
    mape: float                 # mean |t1 - t0| / t0
    median_ape: float
    num_matched_steps: int
    total_difference: float     # the machine's speed between the repeats: total of repeat 1 / repeat 0 - 1

    @classmethod
    def from_dict(cls, data: dict | None) -> StepNoiseFloor | None:
        return None if not data else cls(data.get("mape"), data.get("median_ape"), data.get("num_matched_steps"),
                                         data.get("total_difference"))

    def to_dict(self) -> dict:
        return {"mape": self.mape, "median_ape": self.median_ape, "num_matched_steps": self.num_matched_steps,
                "total_difference": self.total_difference}


@dataclass(frozen=True)
class StepLevelError:
    """The model against the measured step log, batch by batch (all None without a step log)."""
    num_steps: int
    mape: float | None = None
    p90_ape: float | None = None
    max_ape: float | None = None
    total_error: float | None = None        # predicted / measured total - 1: what the latencies feel
    mean_predicted_ms: float | None = None
    mean_measured_ms: float | None = None
    noise_floor: StepNoiseFloor | None = None

    @classmethod
    def from_dict(cls, data: dict) -> StepLevelError:
        return cls(data.get("num_steps", 0), data.get("mape"), data.get("p90_ape"), data.get("max_ape"),
                   data.get("total_error"), data.get("mean_predicted_ms"), data.get("mean_measured_ms"),
                   StepNoiseFloor.from_dict(data.get("noise_floor")))

    def to_dict(self) -> dict:
        out = {"mape": self.mape, "p90_ape": self.p90_ape, "max_ape": self.max_ape}
        if self.num_steps:     # validation.json has never carried total_error for a run without a step log
            out["total_error"] = self.total_error
        return {**out, "mean_predicted_ms": self.mean_predicted_ms, "mean_measured_ms": self.mean_measured_ms,
                "num_steps": self.num_steps,
                "noise_floor": None if self.noise_floor is None else self.noise_floor.to_dict()}


def predict_steps(model, steps) -> np.ndarray:
    """The model's time for each measured step's batch, in ms."""
    return np.array([model.step_ms(StepBatch.of(ids, q, kv)) for ids, q, kv in
                     zip(steps["request_ids"], steps["q_lens"], steps["kv_lens"])], dtype=np.float64)


def step_level_error(model, steps, predicted: np.ndarray | None = None,
                     noise_floor: StepNoiseFloor | None = None) -> StepLevelError:
    """MAPE (and P90 / max APE) of the model's step time on the measured step log, batch by batch."""
    if len(steps) == 0:   # e.g. an imported vLLM bench: no step log to compare against
        return StepLevelError(0, noise_floor=noise_floor)
    predicted = predict_steps(model, steps) if predicted is None else predicted
    measured = steps["duration_ms"].to_numpy(dtype=np.float64)
    ape = np.abs(predicted - measured) / measured
    # total_error: what the latencies feel (they are sums of steps); MAPE also counts scatter.
    return StepLevelError(len(steps), float(ape.mean()), float(np.percentile(ape, 90)), float(ape.max()),
                          float(predicted.sum() / measured.sum() - 1.0), float(predicted.mean()),
                          float(measured.mean()), noise_floor)


def matched_steps(run: MeasuredRun, first: int = 0, second: int = 1):
    """The batches (same requests, q_lens, kv_lens) that repeats `first` and `second` both ran: a
    DataFrame with `ms_0`, `ms_1` (first, second) and each batch's position `index_0`, `index_1` in
    its repeat's step log, in the first's order. None without those repeats or a batch in common."""
    import pandas as pd  # lazy: loads pandas
    a, b = run.steps[run.steps["repeat"] == first], run.steps[run.steps["repeat"] == second]
    if not len(a) or not len(b):
        return None

    def keyed(steps):
        key = [repr((tuple(r), tuple(q), tuple(k))) for r, q, k in zip(steps["request_ids"], steps["q_lens"], steps["kv_lens"])]
        return pd.DataFrame({"key": key, "ms": steps["duration_ms"].to_numpy(),
                             "index": np.arange(len(steps))}).drop_duplicates("key")

    both = keyed(a).merge(keyed(b), on="key", suffixes=("_0", "_1")).sort_values("index_0", ignore_index=True)
    return None if both.empty else both


def step_noise_floor(run: MeasuredRun) -> StepNoiseFloor | None:
    """Run-to-run noise of step time itself: the same batch in repeat 0 and repeat 1, |t1 - t0| / t0
    over the batches both repeats ran. No model can predict a measured step closer than this.
    None without a second repeat."""
    both = matched_steps(run)
    if both is None:
        return None
    ape = (both["ms_1"] - both["ms_0"]).abs() / both["ms_0"]
    speed = float(both["ms_1"].sum() / both["ms_0"].sum() - 1.0)
    return StepNoiseFloor(float(ape.mean()), float(ape.median()), len(both), speed)
