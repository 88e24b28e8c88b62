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


def engine_meta(spec, config, *, device: str, dtype: str, num_threads: int, trace_source: str,
                repeats: int, fingerprint: dict) -> dict:
    from simulator.schemas import SCHEMA_VERSION, TOOL_VERSION
    return {"kind": "measured_run", "schema_version": SCHEMA_VERSION, "tool_version": TOOL_VERSION,
            "model_spec": spec.to_dict(), "device": device, "dtype": dtype, "num_threads": num_threads,
            "fingerprint": fingerprint, "trace": trace_source, "repeats": repeats,
            "scheduler": config.scheduler, "scheduler_config": asdict(config.scheduler_config),
            "block_size": config.block_size, "kv_blocks": config.kv_blocks, "clock": config.clock,
            "seed": config.seed}


__all__ = ["engine_meta", "noise_floor", "warm_up", "write_measured_run"]
