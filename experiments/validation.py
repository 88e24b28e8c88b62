"""Validation: simulate a measured run's workload with the same scheduler settings and compare.

Every figure is (simulated - measured) / measured, per metric and percentile, with the measured
run-to-run noise floor beside it when the measured run has repeats.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.errors import InputError
from simulator.metrics import PERCENTILES, clean_json

METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
STATS = ("mean",) + tuple(f"p{q}" for q in PERCENTILES)


@dataclass
class MeasuredRun:
    path: Path
    meta: dict
    trace: object            # simulator.trace.Trace
    requests: object         # DataFrame, repeat 0
    steps: object            # DataFrame, every repeat's step log, with a `repeat` column
    summary: dict            # each statistic averaged over the repeats, with noise_floor when there are repeats
    num_repeats: int = 1
    speed_probe_ms: list | None = None   # per repeat: a fixed decode step's time around it (the machine's speed)


def load_measured_run(path: str | Path) -> MeasuredRun:
    import pandas as pd

    from simulator.workload import read_trace
    path = Path(path)
    for name in ("meta.json", "trace.parquet", "summary.json", "repeat_0/requests.parquet", "repeat_0/steps.parquet"):
        if not (path / name).exists():
            raise InputError(f"--measured {path}: missing {name} (expected the output of `stepcal measure` "
                             f"or `stepcal import vllm-bench`)")
    meta = json.loads((path / "meta.json").read_text())
    trace = read_trace(path / "trace.parquet", "stepcal")   # written in our own trace format
    repeats = repeat_dirs(path)
    summaries = [json.loads((d / "summary.json").read_text()) for d in repeats if (d / "summary.json").exists()]
    summary = json.loads((path / "summary.json").read_text())
    if len(summaries) == len(repeats) > 1:
        summary = {**summary, **mean_over_repeats(summaries)}
    steps = pd.concat([pd.read_parquet(d / "steps.parquet").assign(repeat=k) for k, d in enumerate(repeats)],
                      ignore_index=True)
    probes = [s.get("speed_probe_ms") for s in summaries]
    return MeasuredRun(path, meta, trace, pd.read_parquet(path / "repeat_0/requests.parquet"), steps, summary,
                       len(repeats), probes if probes and None not in probes else None)


def repeat_dirs(path: Path) -> list[Path]:
    """A measured run's repeat_0, repeat_1, ... directories, in order, as long as each has a step log."""
    dirs = []
    while (path / f"repeat_{len(dirs)}" / "steps.parquet").exists():
        dirs.append(path / f"repeat_{len(dirs)}")
    return dirs


def mean_over_repeats(summaries: list[dict]) -> dict:
    """Each latency statistic and the throughput averaged over the repeats: the measured value the
    simulator is compared with. One repeat alone carries the machine's speed at that moment (on a
    shared CPU the same batches differ by up to 20% in total between repeats minutes apart)."""
    out = {}
    for metric in METRICS:
        stats = {}
        for stat in STATS:
            values = [(s.get(metric) or {}).get(stat) for s in summaries]
            stats[stat] = float(np.mean(values)) if all(v is not None for v in values) else None
        out[metric] = stats
    tput = [s.get("throughput_rps") for s in summaries]
    out["throughput_rps"] = float(np.mean(tput)) if all(v is not None for v in tput) else None
    return out


def sim_config_for(run: MeasuredRun, step_overhead_ms: float = 0.0, request_overhead_ms: float = 0.0):
    """The simulator settings that replay the measured run: same scheduler, budget, KV capacity."""
    from simulator.schedulers import SchedulerConfig
    from simulator.simulation import SimConfig
    meta = run.meta
    return SimConfig(scheduler=meta["scheduler"], scheduler_config=SchedulerConfig(**meta["scheduler_config"]),
                     block_size=meta["block_size"], kv_blocks=meta["kv_blocks"], step_overhead_ms=step_overhead_ms,
                     request_overhead_ms=request_overhead_ms,
                     record_batches=False)


def relative_error(predicted, measured) -> float | None:
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


def stat_error(simulated: dict, measured: dict, metric: str, stat: str) -> float | None:
    """Relative error of one statistic between two run summaries (None where either lacks it)."""
    return relative_error((simulated.get(metric) or {}).get(stat), (measured.get(metric) or {}).get(stat))


def predict_steps(model, steps) -> np.ndarray:
    """The model's time for each measured step's batch, in ms."""
    from simulator.batch import StepBatch
    return np.array([model.step_ms(StepBatch.of(ids, q, kv)) for ids, q, kv in
                     zip(steps["request_ids"], steps["q_lens"], steps["kv_lens"])], dtype=np.float64)


def step_level_error(model, steps, predicted: np.ndarray | None = None) -> dict:
    """MAPE (and P90 / max APE) of the model's step time on the measured step log, batch by batch."""
    if len(steps) == 0:   # e.g. an imported vLLM bench: no step log to compare against
        return {"mape": None, "p90_ape": None, "max_ape": None, "mean_predicted_ms": None,
                "mean_measured_ms": None, "num_steps": 0}
    predicted = predict_steps(model, steps) if predicted is None else predicted
    measured = steps["duration_ms"].to_numpy(dtype=np.float64)
    ape = np.abs(predicted - measured) / measured
    # total_error: what the latencies feel (they are sums of steps); MAPE also counts scatter.
    return {"mape": float(ape.mean()), "p90_ape": float(np.percentile(ape, 90)), "max_ape": float(ape.max()),
            "total_error": float(predicted.sum() / measured.sum() - 1.0),
            "mean_predicted_ms": float(predicted.mean()), "mean_measured_ms": float(measured.mean()),
            "num_steps": len(steps)}


def step_matched_errors(run: MeasuredRun, model, step_error: dict, config) -> dict | None:
    """Errors left once step time is right in total: the model rescaled by measured / predicted total
    over the measured step log, the same workload simulated again. What remains is queueing,
    scheduling and KV capacity; the difference to the plain errors is step time's share.
    None without a step log, or for a model that is not a FeatureStepModel."""
    from simulator.simulation import simulate
    from simulator.step_model import FeatureStepModel
    total_error = step_error.get("total_error")
    if total_error is None or not isinstance(model, FeatureStepModel):
        return None
    scaled = rescaled_to_total(model, total_error)
    result = simulate(run.trace, scaled, config)
    errors = {metric: {stat: stat_error(result.summary, run.summary, metric, stat) for stat in STATS}
              for metric in METRICS}
    return clean_json({"scale": scaled.factor, "metrics": errors,
                       "throughput_rps": relative_error(result.summary.get("throughput_rps"),
                                                        run.summary.get("throughput_rps"))})


def rescaled_to_total(model, total_error: float):
    """The model scaled so that its total over the measured step log equals the measured total
    (total_error: predicted / measured - 1, as step_level_error reports it)."""
    from simulator.step_model import ScaledStepModel
    return ScaledStepModel(model, 1.0 / (1.0 + total_error))


def matched_steps(run: MeasuredRun):
    """The batches (same requests, q_lens, kv_lens) that repeat 0 and repeat 1 both ran: a DataFrame
    with `ms_0`, `ms_1` and each batch's position `index_0`, `index_1` in its repeat's step log,
    in repeat 0's order. None without a second repeat or without a batch in common."""
    import pandas as pd
    a, b = run.steps[run.steps["repeat"] == 0], run.steps[run.steps["repeat"] == 1]
    if not len(a) or not len(b):
        return None

    def keyed(steps):
        key = [repr((tuple(r), tuple(q), tuple(k))) for r, q, k in zip(steps["request_ids"], steps["q_lens"], steps["kv_lens"])]
        return pd.DataFrame({"key": key, "ms": steps["duration_ms"].to_numpy(),
                             "index": np.arange(len(steps))}).drop_duplicates("key")

    both = keyed(a).merge(keyed(b), on="key", suffixes=("_0", "_1")).sort_values("index_0", ignore_index=True)
    return None if both.empty else both


def step_noise_floor(run: MeasuredRun) -> dict | None:
    """Run-to-run noise of step time itself: the same batch in repeat 0 and repeat 1, |t1 - t0| / t0
    over the batches both repeats ran. No model can predict a measured step closer than this.
    None without a second repeat."""
    both = matched_steps(run)
    if both is None:
        return None
    ape = (both["ms_1"] - both["ms_0"]).abs() / both["ms_0"]
    # The machine's speed between the repeats: the same batches, total time of repeat 1 over repeat 0.
    speed = float(both["ms_1"].sum() / both["ms_0"].sum() - 1.0)
    return {"mape": float(ape.mean()), "median_ape": float(ape.median()), "num_matched_steps": len(both),
            "total_difference": speed}


def compare(run: MeasuredRun, simulated_requests, simulated_summary: dict, step_error: dict) -> dict:
    """The validation record: per metric and statistic, measured, simulated, error, noise floor."""
    measured_ids = set(run.requests.loc[run.requests["finish_s"].notna(), "request_id"])
    simulated_ids = set(simulated_requests.loc[simulated_requests["finish_s"].notna(), "request_id"])
    noise = run.summary.get("noise_floor") or {}
    metrics = {}
    for metric in METRICS:
        metrics[metric] = {}
        for stat in STATS:
            m = (run.summary.get(metric) or {}).get(stat)
            s = (simulated_summary.get(metric) or {}).get(stat)
            metrics[metric][stat] = {"measured": m, "simulated": s, "error": relative_error(s, m),
                                     "noise_floor": (noise.get(metric) or {}).get(stat)}
    return clean_json({
        "measured_run": str(run.path), "num_requests": len(run.trace), "num_repeats": run.num_repeats,
        "num_finished_both": len(measured_ids & simulated_ids),
        "num_finished_only_measured": len(measured_ids - simulated_ids),
        "num_finished_only_simulated": len(simulated_ids - measured_ids),
        "metrics": metrics,
        "throughput_rps": {"measured": run.summary.get("throughput_rps"),
                           "simulated": simulated_summary.get("throughput_rps"),
                           "error": relative_error(simulated_summary.get("throughput_rps"), run.summary.get("throughput_rps")),
                           "noise_floor": noise.get("throughput_rps")},
        "num_preemptions": {"measured": run.summary.get("num_preemptions"),
                            "simulated": simulated_summary.get("num_preemptions")},
        "step_level": step_error,
        "speed_probe_ms": run.speed_probe_ms,
    })


STEP_MATCHED_NOTE = ("with the step model rescaled (x {scale:.3f}) so that its total matches the measured step log's, "
                     "the error left comes from queueing, scheduling and KV capacity:")


def step_matched_rows(matched: dict) -> list[list[str]]:
    """Rows (metric, P50, P90, P99 errors) of the step-matched simulation, for the table and the report."""
    return [[metric] + [format_pct(matched["metrics"][metric].get(f"p{q}")) for q in (50, 90, 99)]
            for metric in ("ttft_ms", "tpot_ms", "e2e_ms")]


def format_table(record: dict) -> str:
    """A markdown table of the validation record."""
    repeats = record.get("num_repeats", 1)
    lines = [f"measured run {record['measured_run']}: {record['num_requests']} requests, "
             + (f"each statistic the mean of {repeats} repeats, " if repeats > 1 else "")
             + f"{record['num_finished_both']} finished in both runs"
             + (f", {record['num_finished_only_measured']} only measured" if record['num_finished_only_measured'] else "")
             + (f", {record['num_finished_only_simulated']} only simulated" if record['num_finished_only_simulated'] else ""),
             "", "| metric | stat | measured | simulated | error | noise floor |", "|---|---|---|---|---|---|"]
    for metric, stats in record["metrics"].items():
        for stat, cell in stats.items():
            lines.append(f"| {metric} | {stat} | {_fmt(cell['measured'])} | {_fmt(cell['simulated'])} | "
                         f"{format_pct(cell['error'])} | {format_pct(cell['noise_floor'])} |")
    t = record["throughput_rps"]
    lines.append(f"| throughput_rps | | {_fmt(t['measured'])} | {_fmt(t['simulated'])} | {format_pct(t['error'])} | "
                 f"{format_pct(t['noise_floor'])} |")
    s = record["step_level"]
    if s.get("mape") is None:
        return "\n".join(lines + ["", "step level: no measured step log"])
    lines += ["", f"step level: MAPE {format_pct(s['mape'])}, P90 APE {format_pct(s['p90_ape'])}, max APE {format_pct(s['max_ape'])} "
                  f"over {s['num_steps']} measured steps; total step time {format_pct(s.get('total_error'))} "
                  f"(mean measured {s['mean_measured_ms']:.3f} ms, predicted {s['mean_predicted_ms']:.3f} ms)"]
    noise = s.get("noise_floor")
    if noise:
        lines.append(f"step-time noise floor: the same batch in two repeats differs by {format_pct(noise['mape'])} "
                     f"on average (median {format_pct(noise['median_ape'])}, {noise['num_matched_steps']} batches); "
                     f"their total time, repeat 1 vs repeat 0: {format_pct(noise.get('total_difference'))}")
    if record.get("speed_probe_ms"):
        lines.append("machine speed during each repeat (one fixed decode step, timed before and after it): "
                     + " / ".join(f"{v:.3f}" for v in record["speed_probe_ms"]) + " ms")
    matched = record.get("step_matched")
    if matched:
        lines += ["", STEP_MATCHED_NOTE.format(scale=matched["scale"]), "",
                  "| metric | p50 | p90 | p99 |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in step_matched_rows(matched)]
    return "\n".join(lines)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_pct(value) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"
