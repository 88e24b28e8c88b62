"""Request logs from Request objects: one builder for the simulator and the engine."""
from __future__ import annotations

import numpy as np

from stepcal.core.metrics import request_metrics
from stepcal.simulator.request import Request


def request_log(requests: list[Request]):
    """The request log (docs/design.md contract 4) of finished or unfinished requests, sorted by id."""
    import pandas as pd  # lazy: loads pandas

    def col(attr, dtype=np.float64):
        return np.array([getattr(r, attr) if getattr(r, attr) is not None else np.nan for r in requests], dtype=dtype)
    frame = pd.DataFrame({
        "request_id": np.array([r.request_id for r in requests], dtype=np.int64),
        "replica": np.array([r.replica for r in requests], dtype=np.int64),
        "arrival_s": col("arrival_s"), "first_token_s": col("first_token_s"), "finish_s": col("finish_s"),
        "num_prompt_tokens": np.array([r.num_prompt_tokens for r in requests], dtype=np.int64),
        "num_output_tokens": np.array([r.num_output_tokens for r in requests], dtype=np.int64),
    })
    frame = frame.assign(**request_metrics(frame["arrival_s"], frame["first_token_s"], frame["finish_s"],
                                           frame["num_output_tokens"]))
    frame["num_preemptions"] = np.array([r.num_preemptions for r in requests], dtype=np.int64)
    frame["num_cached_tokens"] = np.array([r.num_cached_tokens for r in requests], dtype=np.int64)
    if any(r.timed_out for r in requests):
        frame["timed_out"] = np.array([r.timed_out for r in requests], dtype=bool)
    if any(r.slo_ttft_ms is not None for r in requests):
        frame["slo_ttft_ms"] = col("slo_ttft_ms")
    if any(r.slo_tpot_ms is not None for r in requests):
        frame["slo_tpot_ms"] = col("slo_tpot_ms")
    return frame.sort_values("request_id", kind="stable").reset_index(drop=True)
