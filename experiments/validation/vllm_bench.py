"""`vllm bench serve --save-result --save-detailed` JSON -> a measured-run directory (core.measured_run's
layout). Without --save-detailed, vLLM drops the per-request lists and keeps only the run's averages,
which cannot be replayed.

The JSON holds per-request lists (index i is request i): `ttfts` (s), `itls` (list of lists, s),
`input_lens`, `output_lens`, `errors` (empty string when OK) and, in newer vLLM versions,
`start_times` (perf_counter seconds); and run totals such as `duration`, `completed`,
`request_rate` ("inf" or a number) and `max_concurrency`.

A vLLM bench has no step log, so the run's steps.parquet is an empty frame with the step-log
columns; validate then reports no step-level error.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from stepcal.core.bounds import MAX_ARRIVAL_S, MAX_TIME_MS, MAX_TOKENS_PER_REQUEST
from stepcal.core.errors import InputError
from stepcal.core.measured_run import Repeat, write_measured_run
from stepcal.core.metrics import clean_json, request_metrics, summarize
from stepcal.core.run_meta import VLLM_BENCH, RunMeta
from stepcal.core.schemas import STEP_LOG_COLUMNS
from stepcal.core.trace import Trace

PER_REQUEST_KEYS = ("input_lens", "output_lens", "ttfts", "itls")
EXPECTED = "expected a `vllm bench serve --save-result --save-detailed` JSON"
# Run-level scalars worth keeping in meta.json (when present), to say what was measured.
TOTALS_KEYS = ("date", "backend", "model_id", "tokenizer_id", "num_prompts", "duration", "completed",
               "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
               "request_rate", "burstiness", "max_concurrency")


@dataclass
class VllmBench:
    """One bench result, validated; index i of every array is request i."""
    path: Path
    arrival_s: np.ndarray          # float64, seconds from the first request's start
    arrival_source: str            # "start_times", "request_rate" (evenly spaced) or "zero"
    num_prompt_tokens: np.ndarray  # int64
    num_output_tokens: np.ndarray  # int64, as the bench recorded (0 for most failed requests)
    ttft_s: np.ndarray             # float64, NaN for failed requests
    itl_s: list[np.ndarray]        # per request, the gaps between its streamed tokens
    failed: np.ndarray             # bool: a non-empty error string
    totals: dict
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.arrival_s)


def read_vllm_bench(path: str | Path) -> VllmBench:
    """Read and check a bench JSON; every problem is an InputError naming the file and key (and index)."""
    path = Path(path)
    data = _load_json(path)
    missing = [key for key in PER_REQUEST_KEYS if key not in data]
    if len(missing) == len(PER_REQUEST_KEYS):   # vLLM drops them all without --save-detailed
        raise InputError(f"{path}: no per-request lists ({', '.join(missing)}): the bench was saved without "
                         f"--save-detailed; run `vllm bench serve` again with --save-result --save-detailed")
    if missing:
        raise InputError(f"{path}: missing key {missing[0]!r} ({EXPECTED})")
    for key in PER_REQUEST_KEYS:
        if not isinstance(data[key], list):
            raise InputError(f"{path}: {key!r} must be a list, got {type(data[key]).__name__}")
    n = len(data["input_lens"])
    if n == 0:
        raise InputError(f"{path}: 'input_lens' is empty: the bench has no requests")
    errors = data.get("errors", [""] * n)
    lists = {key: data[key] for key in PER_REQUEST_KEYS} | {"errors": errors}
    if "start_times" in data:
        lists["start_times"] = data["start_times"]
    for key, values in lists.items():
        if not isinstance(values, list) or len(values) != n:
            got = len(values) if isinstance(values, list) else type(values).__name__
            raise InputError(f"{path}: {key!r} has {got} entries but 'input_lens' has {n}")
    failed = np.array([bool(e) for e in errors], dtype=bool)
    prompt = _int_list(path, "input_lens", data["input_lens"], minimum=1)
    output = _int_list(path, "output_lens", data["output_lens"], minimum=0)
    ok_zero = np.flatnonzero((output == 0) & ~failed)
    if len(ok_zero):
        raise InputError(f"{path}: 'output_lens'[{ok_zero[0]}] is 0 for a request without an error")
    ttft = _time_list(path, "ttfts", data["ttfts"], allow_none=failed, maximum_s=MAX_ARRIVAL_S)
    ttft[failed] = np.nan
    itls = [np.zeros(0) if failed[i] else _time_list(path, f"itls[{i}]", v, maximum_s=MAX_TIME_MS / 1000)
            for i, v in enumerate(data["itls"])]
    _check_gap_counts(path, output, itls)
    totals = {k: data[k] for k in TOTALS_KEYS if k in data}
    arrival, source, warnings = _arrivals(path, data, n)
    warnings = warnings + _sparse_gap_warnings(output, itls, failed)
    return VllmBench(path, arrival, source, prompt, output, ttft, itls, failed, totals, warnings)


def _load_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: {EXPECTED} (an object), got a {type(data).__name__}")
    return data


def _int_list(path: Path, key: str, values: list, minimum: int) -> np.ndarray:
    for i, v in enumerate(values):
        whole = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v == int(v)
        if not whole or not minimum <= v <= MAX_TOKENS_PER_REQUEST:
            raise InputError(f"{path}: {key!r}[{i}] must be an integer from {minimum} to "
                             f"{MAX_TOKENS_PER_REQUEST:,}, got {v!r}")
    return np.asarray(values, dtype=np.int64)


def _sparse_gap_warnings(output: np.ndarray, itls: list, failed: np.ndarray) -> list[str]:
    """Requests with far fewer inter-token gaps than tokens: streamed in chunks, or cut short.
    Their TPOT (summed gaps over output - 1) is only right if the gaps cover the whole decode."""
    sparse = [i for i, gaps in enumerate(itls) if not failed[i] and output[i] > 2 and len(gaps) < (output[i] - 1) / 2]
    if not sparse:
        return []
    i = sparse[0]
    return [f"{len(sparse)} request(s) have fewer than half as many inter-token gaps as output tokens "
            f"(e.g. index {i}: {len(itls[i])} gaps for {output[i]} tokens); their TPOT assumes the gaps "
            f"span the whole decode"]


def _check_gap_counts(path: Path, output: np.ndarray, itls: list) -> None:
    """A request of N output tokens streams at most N - 1 gaps after its first token; N are tolerated
    (a tokenizer may count one token fewer than the chunks it arrived in), more are a mismatched file."""
    for i, gaps in enumerate(itls):
        if len(gaps) > output[i]:
            raise InputError(f"{path}: 'itls'[{i}] has {len(gaps)} inter-token gaps but 'output_lens'[{i}] is "
                             f"{output[i]} tokens: more gaps than tokens (lists from different runs?)")


def _time_list(path: Path, key: str, values, allow_none: np.ndarray | None = None,
               maximum_s: float = MAX_ARRIVAL_S) -> np.ndarray:
    """Seconds, finite, non-negative and at most maximum_s; None (or anything) is tolerated where allow_none[i]."""
    if not isinstance(values, list):
        raise InputError(f"{path}: {key!r} must be a list of seconds, got {type(values).__name__}")
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        if allow_none is not None and allow_none[i]:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InputError(f"{path}: {key!r}[{i}] must be a number of seconds, got {v!r}")
        if v < 0:
            raise InputError(f"{path}: {key!r}[{i}] is negative ({v!r} s)")
        if v > maximum_s:   # larger is a unit mistake, and their sums would overflow
            raise InputError(f"{path}: {key!r}[{i}] is {v!r} s, more than {maximum_s:g} s (core.bounds): "
                             f"seconds expected")
        out[i] = v
    return out


def _arrivals(path: Path, data: dict, n: int) -> tuple[np.ndarray, str, list[str]]:
    """Arrival times: start_times when the bench recorded them, else evenly spaced at request_rate,
    else all at 0; the choice is recorded in meta.json because it changes what validate replays."""
    if "start_times" in data:
        start = _time_list(path, "start_times", data["start_times"], maximum_s=np.inf)
        span = start - start.min()
        if span.max() > MAX_ARRIVAL_S:
            i = int(np.argmax(span))
            raise InputError(f"{path}: 'start_times'[{i}] is {span[i]:.3g} s after the first request, more than a "
                             f"year (MAX_ARRIVAL_S, core.bounds)")
        return span, "start_times", []
    rate = _rate(data.get("request_rate"))
    concurrency = data.get("max_concurrency")
    limit = f"; the bench's max_concurrency {concurrency} is not replayed" if concurrency else ""
    if rate is not None:
        return (np.arange(n, dtype=np.float64) / rate, "request_rate",
                [f"{path}: no 'start_times' (older vLLM): arrivals evenly spaced at request_rate {rate:g} req/s, "
                 f"an approximation of the bench's random arrivals{limit}"])
    return (np.zeros(n), "zero",
            [f"{path}: no 'start_times' and no finite 'request_rate': every request arrives at 0 s{limit}"])


def _rate(value) -> float | None:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        return None
    return rate if math.isfinite(rate) and rate > 0 else None


def request_frame(bench: VllmBench):
    """The request log (docs/design.md contract 4); failed requests keep NaN first_token_s / finish_s."""
    import pandas as pd  # lazy: loads pandas

    first_token = bench.arrival_s + bench.ttft_s
    finish = first_token + np.array([itl.sum() for itl in bench.itl_s])
    frame = pd.DataFrame({
        "request_id": np.arange(len(bench), dtype=np.int64), "replica": np.zeros(len(bench), dtype=np.int64),
        "arrival_s": bench.arrival_s, "first_token_s": first_token, "finish_s": finish,
        "num_prompt_tokens": bench.num_prompt_tokens, "num_output_tokens": bench.num_output_tokens})
    frame = frame.assign(**request_metrics(frame["arrival_s"], frame["first_token_s"], frame["finish_s"],
                                           frame["num_output_tokens"]))
    frame["num_preemptions"] = np.zeros(len(bench), dtype=np.int64)
    return frame


def empty_step_frame():
    """The step-log columns with no rows: a vLLM bench does not see the engine's steps."""
    import pandas as pd  # lazy: loads pandas

    float_columns = ("start_s", "duration_ms", "prefill_attn_work")
    list_columns = ("request_ids", "q_lens", "kv_lens")
    return pd.DataFrame({c: pd.Series([], dtype=object if c in list_columns else
                                      np.float64 if c in float_columns else np.int64)
                         for c in STEP_LOG_COLUMNS})


def bench_trace(bench: VllmBench):
    """The workload to replay. A failed request keeps its prompt; its output length is the one the
    bench recorded, or 1 when it recorded none, so that the simulator can still serve it."""
    return Trace.from_arrays(bench.arrival_s, bench.num_prompt_tokens, np.maximum(bench.num_output_tokens, 1),
                             request_id=np.arange(len(bench), dtype=np.int64), source=str(bench.path))


def _check_kv_capacity(bench: VllmBench, block_size: int, kv_blocks: int | None) -> None:
    """The deployment served every request, so its KV cache held the largest one whole; a smaller
    --kv-blocks describes another deployment (and its replay could never finish that request)."""
    if kv_blocks is None:
        return
    largest = int((bench.num_prompt_tokens + bench.num_output_tokens).max())
    if largest > kv_blocks * block_size:
        raise InputError(f"--kv-blocks {kv_blocks} x --block-size {block_size} holds {kv_blocks * block_size} "
                         f"tokens, fewer than the largest request of {bench.path} ({largest} tokens)")


def write_vllm_bench_run(bench: VllmBench, out: str | Path, *, model_spec, scheduler: str, scheduler_config,
                         block_size: int, kv_blocks: int | None) -> dict:
    """The bench as a one-repeat measured run (core.measured_run's layout, with an empty step log);
    returns its summary."""
    _check_kv_capacity(bench, block_size, kv_blocks)
    trace = bench_trace(bench)
    requests = request_frame(bench)
    itls = [itl for itl in bench.itl_s if len(itl)]
    summary = clean_json(summarize(requests, itl_s=np.concatenate(itls) if itls else np.zeros(0)))
    meta = RunMeta(source=VLLM_BENCH, bench_file=str(bench.path), model_spec=model_spec.to_dict(),
                   scheduler=scheduler, scheduler_config=asdict(scheduler_config), block_size=block_size,
                   kv_blocks=kv_blocks, repeats=1, arrival_source=bench.arrival_source, num_requests=len(bench),
                   num_failed=int(bench.failed.sum()), bench_totals=bench.totals,
                   warnings=list(bench.warnings) + list(trace.warnings))
    return write_measured_run(out, trace, [Repeat(requests, empty_step_frame(), summary)], meta)


__all__ = ["VllmBench", "bench_trace", "empty_step_frame", "read_vllm_bench", "request_frame",
           "write_vllm_bench_run"]
