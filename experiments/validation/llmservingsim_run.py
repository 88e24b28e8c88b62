"""A real vLLM run recorded by LLMServingSim's bench -> a measured-run directory (core.measured_run's
layout), so that validate and calibrate replay it.

The bench writes, under RUN_DIR/vllm/ (or RUN_DIR itself, in its older layout):
  requests.jsonl   one JSON object a line: `request_id`, `input_toks`, `output_toks`, `arrival_time`
                   (the client's wall clock, epoch seconds) and vLLM's per-request stamps `queued_ts`,
                   `scheduled_ts`, `first_token_ts`, `last_token_ts` (the engine's monotonic clock, s)
  meta.json        `engine_kwargs` (max_num_seqs, max_num_batched_tokens, tensor_parallel_size, dtype,
                   seed, ...), `vllm_version`, `started_at` / `finished_at`, the dataset
  timeseries.csv   running / waiting requests and KV use, one row a tick (kept as it is)
and RUN_DIR/config.json, LLMServingSim's cluster config of the run (model name, hardware, tp_size).

Clocks: `arrival_time` and the engine's stamps are on two clocks. LLMServingSim's own comparison
measures every latency from `queued_ts` (the engine's receipt of the request, on the stamps' clock),
and so does this import: its figures then equal the "vLLM" column of LLMServingSim's
validation/summary.txt. The epoch clock is only related to the engine's by a per-run offset, recorded
in meta.json with the delay it implies between each client send and the engine's receipt.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from stepcal.core.bounds import MAX_TOKENS_PER_REQUEST
from stepcal.core.errors import InputError
from stepcal.core.measured_run import Repeat, write_measured_run
from stepcal.core.metrics import clean_json, distribution, request_metrics, summarize
from stepcal.core.readers import read_bytes, read_json, read_text
from stepcal.core.run_meta import LLMSERVINGSIM, RunMeta
from stepcal.core.trace import Trace
from stepcal.experiments.validation.vllm_bench import empty_step_frame
from stepcal.simulator.schedulers import SchedulerConfig

REQUESTS_FILE = "requests.jsonl"
META_FILE = "meta.json"
TIMESERIES_FILE = "timeseries.csv"
CLUSTER_CONFIG_FILE = "config.json"
EXPECTED = "LLMServingSim's bench output: RUN_DIR/vllm/requests.jsonl"
TOKEN_KEYS = ("input_toks", "output_toks")
STAMP_KEYS = ("arrival_time", "queued_ts", "first_token_ts", "last_token_ts")
# meta.json's run-level keys worth keeping (engine_kwargs is kept whole beside them)
TOTALS_KEYS = ("model", "vllm_version", "dataset_path", "dataset_hash", "num_requests", "started_at",
               "finished_at", "tick_seconds")
# What each figure of the request log means, written into meta.json (and said in --help).
DEFINITIONS = {
    "arrival_s": "queued_ts - the first request's queued_ts (the engine's monotonic clock)",
    "first_token_s": "first_token_ts - the first request's queued_ts",
    "finish_s": "last_token_ts - the first request's queued_ts",
    "ttft_ms": "first_token_ts - queued_ts",
    "tpot_ms": "(last_token_ts - first_token_ts) / (output_toks - 1), undefined for one output token",
    "e2e_ms": "last_token_ts - queued_ts",
}
VLLM_BLOCK_SIZE = 16     # vLLM's KV block on CUDA; the bench does not record it


@dataclass
class LlmServingSimRun:
    """One bench run, validated; index i of every array is line i of requests.jsonl."""
    bench_dir: Path                  # the folder holding requests.jsonl and meta.json
    num_prompt_tokens: np.ndarray    # int64
    num_output_tokens: np.ndarray    # int64
    arrival_epoch_s: np.ndarray      # float64, the client's clock
    queued_s: np.ndarray             # float64, the engine's monotonic clock, as are the next two
    first_token_s: np.ndarray
    last_token_s: np.ndarray
    engine: dict                     # meta.json's engine_kwargs
    totals: dict                     # meta.json's run-level keys (TOTALS_KEYS)
    timeseries_path: Path | None     # timeseries.csv, where the bench wrote one
    cluster_config_path: Path | None  # RUN_DIR/config.json, where present
    cluster_config: dict | None

    def __len__(self) -> int:
        return len(self.queued_s)

    @property
    def requests_path(self) -> Path:
        return self.bench_dir / REQUESTS_FILE


def bench_dir_of(run_dir: str | Path) -> Path:
    """RUN_DIR/vllm when it holds the requests, else RUN_DIR itself (the bench's older layout)."""
    run_dir = Path(run_dir)
    if (run_dir / "vllm" / REQUESTS_FILE).exists() or not (run_dir / REQUESTS_FILE).exists():
        return run_dir / "vllm"
    return run_dir


def read_llmservingsim_run(run_dir: str | Path) -> LlmServingSimRun:
    """Read and check a bench run; every problem is an InputError naming the file (and line or key)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such directory (expected {EXPECTED})")
    bench_dir = bench_dir_of(run_dir)
    path = bench_dir / REQUESTS_FILE
    if not path.is_file():
        raise InputError(f"{path}: no such file (expected {EXPECTED})")
    records = [_request(path, number, line) for number, line in _lines(path)]
    if not records:
        raise InputError(f"{path}: no requests (expected one JSON object a line)")
    columns = {key: np.array([r[key] for r in records]) for key in TOKEN_KEYS + STAMP_KEYS}
    engine, totals = _read_meta(bench_dir / META_FILE)
    config_path = run_dir / CLUSTER_CONFIG_FILE if bench_dir != run_dir else None
    config = read_json(config_path, "LLMServingSim's cluster config") if config_path and config_path.exists() else None
    timeseries = bench_dir / TIMESERIES_FILE
    return LlmServingSimRun(
        bench_dir, columns["input_toks"].astype(np.int64), columns["output_toks"].astype(np.int64),
        columns["arrival_time"].astype(np.float64), columns["queued_ts"].astype(np.float64),
        columns["first_token_ts"].astype(np.float64), columns["last_token_ts"].astype(np.float64),
        engine, totals, timeseries if timeseries.is_file() else None,
        config_path if config is not None else None, config)


def _lines(path: Path):
    """(line number, text) of each non-blank line."""
    for number, line in enumerate(read_text(path, EXPECTED).splitlines(), start=1):
        if line.strip():
            yield number, line


def _request(path: Path, number: int, line: str) -> dict:
    """One line's request, checked: whole token counts, finite stamps in the engine's order."""
    where = f"{path}: line {number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not a JSON object ({exc.msg})") from None
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in TOKEN_KEYS + STAMP_KEYS:
        if key not in record:
            raise InputError(f"{where}: missing key {key!r}")
    for key in TOKEN_KEYS:
        value = record[key]
        whole = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and value == int(value)
        if not whole or not 1 <= value <= MAX_TOKENS_PER_REQUEST:
            raise InputError(f"{where}: {key} must be an integer from 1 to {MAX_TOKENS_PER_REQUEST:,}, got {value!r}")
    for key in STAMP_KEYS:
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"{where}: {key} must be a number of seconds, got {value!r}")
    for earlier, later in (("queued_ts", "first_token_ts"), ("first_token_ts", "last_token_ts")):
        if record[later] < record[earlier]:
            raise InputError(f"{where}: {later} ({record[later]!r}) is before {earlier} ({record[earlier]!r})")
    return record


def _read_meta(path: Path) -> tuple[dict, dict]:
    """meta.json's engine_kwargs (its scheduler settings checked) and its run-level keys."""
    meta = read_json(path, "LLMServingSim's bench meta.json", ("engine_kwargs",))
    engine = meta["engine_kwargs"]
    if not isinstance(engine, dict):
        raise InputError(f"{path}: engine_kwargs must be an object, got {engine!r}")
    for key, nullable in (("max_num_seqs", False), ("max_num_batched_tokens", True),
                          ("tensor_parallel_size", True)):
        value = engine.get(key)
        if value is None and nullable:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{path}: engine_kwargs.{key} must be a positive integer, got {value!r}")
    return engine, {key: meta[key] for key in TOTALS_KEYS if key in meta}


def clock_alignment(run: LlmServingSimRun) -> dict:
    """How the client's epoch clock maps onto the engine's monotonic one. The offset is the smallest
    that has no request queued before it was sent (max of arrival_time - queued_ts): one per run, since
    both clocks tick at the same rate over a run; the delay it leaves each request (queued_ts -
    arrival_time + offset: the client's send, tokenisation and hand-over to the engine) is measured
    by neither LLMServingSim nor this import's latencies."""
    offset_s = float((run.arrival_epoch_s - run.queued_s).max())
    delay_ms = (run.queued_s - (run.arrival_epoch_s - offset_s)) * 1000.0
    return {"epoch_minus_monotonic_s": offset_s, "first_arrival_epoch_s": float(run.arrival_epoch_s.min()),
            "first_queued_monotonic_s": float(run.queued_s.min()),
            "send_to_queued_ms": clean_json(distribution(delay_ms)) | {"max": float(delay_ms.max())}}


def request_frame(run: LlmServingSimRun):
    """The request log (docs/design.md contract 4), on the engine's clock from the first receipt."""
    import pandas as pd  # lazy: loads pandas

    origin_s = run.queued_s.min()
    n = len(run)
    frame = pd.DataFrame({
        "request_id": np.arange(n, dtype=np.int64), "replica": np.zeros(n, dtype=np.int64),
        "arrival_s": run.queued_s - origin_s, "first_token_s": run.first_token_s - origin_s,
        "finish_s": run.last_token_s - origin_s,
        "num_prompt_tokens": run.num_prompt_tokens, "num_output_tokens": run.num_output_tokens})
    frame = frame.assign(**request_metrics(frame["arrival_s"], frame["first_token_s"], frame["finish_s"],
                                           frame["num_output_tokens"]))
    frame["num_preemptions"] = np.zeros(n, dtype=np.int64)
    return frame


def run_trace(run: LlmServingSimRun, requests) -> Trace:
    """The workload to replay: each request arrives when the engine received it, with its lengths."""
    return Trace.from_arrays(requests["arrival_s"].to_numpy(), run.num_prompt_tokens, run.num_output_tokens,
                             request_id=requests["request_id"].to_numpy(), source=str(run.requests_path))


def run_meta(run: LlmServingSimRun, *, model_spec, block_size: int, kv_blocks: int | None, warnings: list) -> RunMeta:
    """meta.json: the engine's settings (scheduler vllm, as the run's was), where it came from, the
    latency definitions and the clocks' alignment."""
    engine = run.engine
    config = SchedulerConfig(max_num_seqs=engine["max_num_seqs"],
                             max_num_batched_tokens=engine.get("max_num_batched_tokens"))
    extra = {"vllm_version": run.totals.get("vllm_version"),
             "tensor_parallel_size": engine.get("tensor_parallel_size"),
             "engine_kwargs": engine, "latency_definitions": DEFINITIONS,
             "clock_alignment": clock_alignment(run),
             "timeseries": TIMESERIES_FILE if run.timeseries_path else None,
             "cluster_config": str(run.cluster_config_path.resolve()) if run.cluster_config_path else None,
             "cluster_model_name": _cluster_model_name(run.cluster_config)}
    return RunMeta(source=LLMSERVINGSIM, bench_file=str(run.requests_path.resolve()),
                   model_spec=model_spec.to_dict() if model_spec is not None else None,
                   dtype=engine.get("dtype"), seed=engine.get("seed"), repeats=1,
                   scheduler="vllm", scheduler_config=asdict(config), block_size=block_size, kv_blocks=kv_blocks,
                   prefix_caching=False, arrival_source="queued_ts", num_requests=len(run), num_failed=0,
                   bench_totals=run.totals, warnings=warnings, extra=extra)


def _cluster_model_name(config: dict | None) -> str | None:
    """The served model named by LLMServingSim's cluster config (nodes[0].instances[0].model_name)."""
    try:
        return str(config["nodes"][0]["instances"][0]["model_name"])
    except (TypeError, KeyError, IndexError):
        return None


def _check_kv_capacity(run: LlmServingSimRun, block_size: int, kv_blocks: int | None) -> None:
    """The engine served every request, so its KV cache held the largest one whole."""
    largest = int((run.num_prompt_tokens + run.num_output_tokens).max())
    if kv_blocks is not None and largest > kv_blocks * block_size:
        raise InputError(f"--kv-blocks {kv_blocks} x --block-size {block_size} holds {kv_blocks * block_size} "
                         f"tokens, fewer than the largest request of {run.requests_path} ({largest} tokens)")


def import_warnings(run: LlmServingSimRun, kv_blocks: int | None) -> list[str]:
    """What the import could not take from the bench, for stderr and meta.json."""
    if kv_blocks is not None:
        return []
    return [f"{run.bench_dir / META_FILE}: the bench does not record the KV cache's capacity: the replay has "
            f"no KV limit (give --kv-blocks, or --device-memory-gb to derive it)"]


def write_llmservingsim_run(run: LlmServingSimRun, out: str | Path, *, model_spec=None,
                            block_size: int = VLLM_BLOCK_SIZE, kv_blocks: int | None = None) -> dict:
    """The run as a one-repeat measured run (empty step log; timeseries.csv kept beside it); returns
    its summary. The bench records no inter-token gaps, so itl_ms has no statistics."""
    _check_kv_capacity(run, block_size, kv_blocks)
    requests = request_frame(run)
    trace = run_trace(run, requests)
    summary = clean_json(summarize(requests, itl_s=np.zeros(0)))
    warnings = import_warnings(run, kv_blocks) + list(trace.warnings)
    meta = run_meta(run, model_spec=model_spec, block_size=block_size, kv_blocks=kv_blocks, warnings=warnings)
    extra_files = {TIMESERIES_FILE: read_bytes(run.timeseries_path, "the bench's timeseries.csv")} \
        if run.timeseries_path else {}
    return write_measured_run(out, trace, [Repeat(requests, empty_step_frame(), summary)], meta,
                              extra_files=extra_files)


__all__ = ["DEFINITIONS", "LlmServingSimRun", "bench_dir_of", "clock_alignment", "import_warnings", "read_llmservingsim_run",
           "request_frame", "run_meta", "run_trace", "write_llmservingsim_run"]
