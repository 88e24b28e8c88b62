"""Measured runs: serve a trace R times on the engine and write the logs, meta and noise floor."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from simulator.io import atomic_output_dir, atomic_write_json, atomic_write_parquet
from simulator.metrics import clean_json

NOISE_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
NOISE_STATS = ("mean", "p50", "p90", "p95", "p99")


def warm_up(model, num_steps: int = 3) -> None:
    """A few untimed steps so the first measured step pays no allocator or kernel-selection cost."""
    import torch
    cache = model.new_cache()
    prompt = torch.arange(64) % model.spec.vocab_size
    model.forward_step([prompt], [cache], [True])
    for _ in range(num_steps):
        model.forward_step([torch.tensor([1])], [cache], [True])


def speed_probe_ms(model, num_steps: int = 200, num_seqs: int = 4, kv_len: int = 128) -> float:
    """Median time of one fixed decode step, timed back to back: the machine's speed at this
    moment, recorded before and after each repeat. On a shared CPU the same batch can cost 30%
    more a few minutes later; the probe lets validation tell that drift from model error."""
    import time

    import torch
    caches = [model.new_cache() for _ in range(num_seqs)]
    with torch.inference_mode():
        for cache in caches:
            cache.fill_random(kv_len)
        tokens, emit = [torch.tensor([1])] * num_seqs, [True] * num_seqs
        sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
        times_ms = []
        for k in range(num_steps + num_steps // 5):      # the first fifth warms up, untimed
            t0 = time.perf_counter()
            model.forward_step(tokens, caches, emit)
            sync()
            if k >= num_steps // 5:
                times_ms.append((time.perf_counter() - t0) * 1000.0)
            for cache in caches:
                cache.truncate(kv_len)
    return float(sorted(times_ms)[len(times_ms) // 2])


def noise_floor(summaries: list[dict]) -> dict:
    """Run-to-run relative difference of each metric statistic: |b - a| / a between the first two
    repeats (max over pairs with the first when there are more): the floor a simulator cannot beat."""
    floor = {}
    base = summaries[0]
    for metric in NOISE_METRICS:
        floor[metric] = {}
        for stat in NOISE_STATS:
            a = (base.get(metric) or {}).get(stat)
            diffs = [abs(s[metric][stat] - a) / a for s in summaries[1:]
                     if a and (s.get(metric) or {}).get(stat) is not None]
            floor[metric][stat] = max(diffs) if diffs else None
    tput = [s["throughput_rps"] for s in summaries if s.get("throughput_rps")]
    floor["throughput_rps"] = (max(abs(t - tput[0]) / tput[0] for t in tput[1:]) if len(tput) > 1 else None)
    return floor


def write_measured_run(out: str | Path, trace, results: list, meta: dict) -> dict:
    """OUT/meta.json, OUT/trace.parquet, OUT/repeat_<k>/{requests,steps}.parquet + summary.json,
    OUT/summary.json (repeat 0, with the noise floor when there are repeats)."""
    summaries = [clean_json(r.summary) for r in results]
    summary = dict(summaries[0])
    if len(results) > 1:
        summary["noise_floor"] = noise_floor(summaries)
    with atomic_output_dir(out) as staging:
        atomic_write_parquet(trace.to_frame(), staging / "trace.parquet")
        for k, (result, s) in enumerate(zip(results, summaries)):
            atomic_write_parquet(result.requests, staging / f"repeat_{k}" / "requests.parquet")
            atomic_write_parquet(result.steps, staging / f"repeat_{k}" / "steps.parquet")
            atomic_write_json(staging / f"repeat_{k}" / "summary.json", s)
        atomic_write_json(staging / "summary.json", summary)
        atomic_write_json(staging / "meta.json", clean_json(meta))
    return summary


# Settings that must agree for single-repeat runs to be one measured run's repeats.
_SAME_RUN_KEYS = ("model_spec", "device", "dtype", "num_threads", "scheduler", "scheduler_config", "block_size",
                  "kv_blocks", "clock", "seed")


def combine_repeats(parts: list[str | Path], out: str | Path) -> dict:
    """One measured run from single-repeat runs of the same workload taken at different times.

    The quickstart interleaves repeats across its runs (every run's repeat 0, then every run's
    repeat 1), so that each run's repeats sample the machine's speed at different moments of
    the campaign instead of two back-to-back minutes. Writes the layout `write_measured_run`
    writes; raises InputError when the parts differ in trace or settings."""
    import json
    from types import SimpleNamespace

    import pandas as pd

    from simulator.errors import InputError
    from simulator.workload import read_trace
    parts = [Path(p) for p in parts]
    metas = [json.loads((p / "meta.json").read_text()) for p in parts]
    traces = [pd.read_parquet(p / "trace.parquet") for p in parts]
    for part, meta, trace in zip(parts[1:], metas[1:], traces[1:]):
        differ = [k for k in _SAME_RUN_KEYS if meta.get(k) != metas[0].get(k)]
        if differ or not trace.equals(traces[0]):
            raise InputError(f"{part}: not a repeat of {parts[0]} (differs in {', '.join(differ) or 'trace'})")
    results = []
    for part in parts:
        results += [SimpleNamespace(requests=pd.read_parquet(d / "requests.parquet"),
                                    steps=pd.read_parquet(d / "steps.parquet"),
                                    summary=json.loads((d / "summary.json").read_text()))
                    for d in sorted(part.glob("repeat_*"), key=lambda d: int(d.name.split("_")[1]))]
    meta = dict(metas[0], repeats=len(results))
    return write_measured_run(out, read_trace(parts[0] / "trace.parquet", "stepcal"), results, meta)


def engine_meta(spec, config, *, device: str, dtype: str, num_threads: int, trace_source: str,
                repeats: int, fingerprint: dict) -> dict:
    from simulator.schemas import SCHEMA_VERSION, TOOL_VERSION
    return {"kind": "measured_run", "schema_version": SCHEMA_VERSION, "tool_version": TOOL_VERSION,
            "model_spec": spec.to_dict(), "device": device, "dtype": dtype, "num_threads": num_threads,
            "fingerprint": fingerprint, "trace": trace_source, "repeats": repeats,
            "scheduler": config.scheduler, "scheduler_config": asdict(config.scheduler_config),
            "block_size": config.block_size, "kv_blocks": config.kv_blocks, "clock": config.clock,
            "seed": config.seed}


__all__ = ["combine_repeats", "engine_meta", "noise_floor", "speed_probe_ms", "warm_up", "write_measured_run"]
