"""The end-to-end campaign: profile → fit → measure → simulate → validate → calibrate → report.

Each stage is one `stepcal` command run in-process, so the campaign exercises exactly what a
user runs by hand, and every intermediate directory can be inspected or rerun on its own.

Loads are set from each scheduler's measured capacity (a saturation run: every request arrives
at once). The lowest load is the calibration run; the higher loads are held out. Three step
models are validated on every run:
  tables      the kernel profile and the calibration load's step logs (and the saturation runs'),
  kernels     the kernel profile alone: what per-operator profiles say, without the engine's host work,
  calibrated  the kernel tables plus host terms fitted to the calibration load's request log, the
              path of a user who has kernel profiles and a deployment's request log only.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from simulator.errors import InputError

KERNEL_OPS = ("gemm", "attn_prefill", "attn_decode", "overhead")


@dataclass
class CampaignConfig:
    out: Path
    model_spec: str = "tiny"
    device: str = "cpu"
    schedulers: tuple[str, ...] = ("continuous", "sarathi")
    loads: tuple[float, ...] = (0.3, 0.6, 0.9)      # shares of each scheduler's measured capacity
    num_requests: int = 200
    prompt: str = "lognormal:128:0.8"
    output: str = "lognormal:32:0.8"
    chunk_size: int = 64
    repeats: int = 2
    trials: int = 4
    grid: str = "quick"
    profile_ops: str | None = None                  # e.g. "step,overhead" (None: every op of the grid)
    seed: int = 0
    timings: dict = field(default_factory=dict)

    def workload(self, rate_rps: float, num_requests: int | None = None) -> str:
        n = num_requests or self.num_requests
        return f"poisson:rate={rate_rps:.6g},n={n},prompt={self.prompt},output={self.output},seed={self.seed}"


class Campaign:
    def __init__(self, config: CampaignConfig) -> None:
        self.c = config
        self.t0 = time.perf_counter()

    def stage(self, title: str, argv: list[str]) -> None:
        from experiments.cli import main
        started = time.perf_counter()
        print(f"[{started - self.t0:6.1f} s] {title}", file=sys.stderr, flush=True)
        code = main([str(a) for a in argv])
        if code != 0:
            raise InputError(f"quickstart: stage '{title}' failed (stepcal {' '.join(map(str, argv[:1]))} exited {code})")
        self.c.timings[title] = round(time.perf_counter() - started, 1)

    def scheduler_flags(self, scheduler: str) -> list[str]:
        return ["--scheduler", scheduler, "--chunk-size", self.c.chunk_size]

    def run(self) -> dict:
        c, out = self.c, self.c.out
        ops = ["--ops", c.profile_ops] if c.profile_ops else []
        self.stage(f"profile kernels ({c.grid} grid)", ["profile", "--model-spec", c.model_spec, "--device", c.device,
                                                       "--grid", c.grid, *ops, "--no-progress",
                                                       "--out", out / "profile"])
        capacity = {}
        for s in c.schedulers:
            self.stage(f"measure {s} capacity (saturation run)",
                       ["measure", "--model-spec", c.model_spec, "--device", c.device, "--quiet",
                        "--trace", c.workload(10_000.0, max(60, c.num_requests // 2)), *self.scheduler_flags(s),
                        "--seed", c.seed, "--out", out / "measured" / s / "saturation"])
            capacity[s] = _summary(out / "measured" / s / "saturation")["throughput_rps"]
        self.measure_interleaved(capacity)
        calibration_logs = training_logs(out / "measured", c.schedulers, c.loads[0])
        self.stage("fit T_step tables (tuned)", ["fit", "--profile", out / "profile" / "profile.parquet",
                                                 *calibration_logs, "--model-spec", c.model_spec,
                                                 "--regressor", "tuned", "--trials", c.trials, "--seed", c.seed,
                                                 "--out", out / "tables"])
        models = {s: {"tables": out / "tables"} for s in c.schedulers}
        if self.kernel_ops():
            self.calibrate_kernel_tables(models)
        validations = []
        for s in c.schedulers:
            for load in c.loads:
                measured = out / "measured" / s / _load_name(load)
                for model_name, model in models[s].items():
                    target = out / "validation" / model_name / s / _load_name(load)
                    self.stage(f"simulate + validate {s} at {load:.0%} load ({model_name})",
                               ["validate", "--measured", measured, "--step-model", model, "--quiet", "--out", target])
                    validations.append((s, load, model_name, target))
        report_dirs = [v[3] for v in validations if v[2] in ("tables", "calibrated")] + [out / "tables"]
        self.stage("report", ["report", *report_dirs, "--out", out / "report"])
        return self.headline(capacity, validations)

    def kernel_ops(self) -> list[str]:
        """The profiled per-operator kernels (the whole-step points left out), if GEMMs are among them."""
        profiled = self.c.profile_ops.split(",") if self.c.profile_ops else list(KERNEL_OPS)
        ops = [op for op in KERNEL_OPS if op in profiled]
        return ops if "gemm" in ops else []

    def calibrate_kernel_tables(self, models: dict) -> None:
        """The path of a user with kernel profiles and a deployment's request log only: tables
        composed from the kernels alone ("kernels"; they miss the engine's host work), then host
        terms fitted to each scheduler's calibration-load request log ("calibrated")."""
        c, out = self.c, self.c.out
        self.stage("fit kernel-only T_step tables", ["fit", "--profile", out / "profile" / "profile.parquet",
                                                     "--ops", ",".join(self.kernel_ops()), "--model-spec",
                                                     c.model_spec, "--regressor", "tuned", "--trials", c.trials,
                                                     "--seed", c.seed, "--out", out / "tables_kernels"])
        for s in c.schedulers:
            self.stage(f"calibrate host terms of the kernel tables on {s} at {c.loads[0]:.0%} load",
                       ["calibrate", "--measured", out / "measured" / s / _load_name(c.loads[0]),
                        "--step-model", out / "tables_kernels", "--quiet", "--out", out / "calibrated" / s])
            models[s].update(kernels=out / "tables_kernels", calibrated=out / "calibrated" / s)

    def measure_interleaved(self, capacity: dict) -> None:
        """Every run's repeat 0, then every run's repeat 1, ...: the machine's speed drifts over
        minutes (the same batches cost up to 20-30% more a few minutes later on a shared CPU), and
        back-to-back repeats would hand each run one moment's speed. Interleaved, every run's
        repeats (and the calibration logs the tables train on) span the whole measurement; every
        other pass runs in reverse order, so that a trend within a pass does not favour a load."""
        from profiler.engine.measure import combine_repeats
        c, parts = self.c, self.c.out / "measured" / ".repeats"
        runs = [(s, load) for s in c.schedulers for load in c.loads]
        for k in range(c.repeats):
            for s, load in (runs if k % 2 == 0 else runs[::-1]):
                self.stage(f"measure {s} at {load:.0%} load (repeat {k + 1} of {c.repeats})", [
                    "measure", "--model-spec", c.model_spec, "--device", c.device, "--quiet",
                    "--trace", c.workload(load * capacity[s]), *self.scheduler_flags(s),
                    "--seed", c.seed, "--out", parts / s / _load_name(load) / str(k)])
        for s, load in runs:
            combine_repeats([parts / s / _load_name(load) / str(k) for k in range(c.repeats)],
                            c.out / "measured" / s / _load_name(load))
        shutil.rmtree(parts)

    def headline(self, capacity: dict, validations: list) -> dict:
        rows = []
        for scheduler, load, model_name, path in validations:
            record = json.loads((path / "validation.json").read_text())
            step, step_noise = record["step_level"], record["step_level"].get("noise_floor") or {}
            row = {"scheduler": scheduler, "load": load, "model": model_name,
                   "held_out": load != self.c.loads[0], "step_mape": step.get("mape"),
                   "step_mape.noise": step_noise.get("mape"), "step_total": step.get("total_error"),
                   "step_total.noise": step_noise.get("total_difference"),
                   "preemptions.measured": (record.get("num_preemptions") or {}).get("measured"),
                   "preemptions.simulated": (record.get("num_preemptions") or {}).get("simulated")}
            matched = (record.get("step_matched") or {}).get("metrics") or {}
            for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
                for stat in ("p50", "p90", "p99"):
                    cell = record["metrics"][metric][stat]
                    row[f"{metric}.{stat}"] = cell["error"]
                    row[f"{metric}.{stat}.noise"] = cell["noise_floor"]
                    row[f"{metric}.{stat}.step_matched"] = (matched.get(metric) or {}).get(stat)
            rows.append(row)
        result = {"capacity_rps": capacity, "rows": rows, "targets": target_summary(rows), "timings_s": self.c.timings,
                  "wall_s": round(time.perf_counter() - self.t0, 1)}
        (self.c.out / "headline.json").write_text(json.dumps(result, indent=2))
        return result


def training_logs(measured: Path, schedulers: tuple[str, ...], calibration_load: float) -> list[Path]:
    """Training data beyond the kernel profile: the step logs of every scheduler's runs that are
    never validated: the calibration load (every repeat: the machine's speed drifts, and more of
    it averages out) and the saturation run (it covers the largest batches)."""
    from experiments.validation import repeat_dirs
    logs = [d / "steps.parquet" for s in schedulers for d in repeat_dirs(measured / s / _load_name(calibration_load))]
    return logs + [measured / s / "saturation" / "repeat_0" / "steps.parquet" for s in schedulers]


def _load_name(load: float) -> str:
    return f"load_{round(100 * load):02d}"


def _summary(path: Path) -> dict:
    return json.loads((path / "summary.json").read_text())


def format_headline(result: dict) -> str:
    def pct(v, sign="+"):
        return "   -  " if v is None else f"{100 * v:{sign}6.1f}%"
    lines = ["capacity (saturation throughput): " + ", ".join(f"{s} {r:.1f} req/s" for s, r in result["capacity_rps"].items()),
             "", "errors of the simulator against the measured runs, (simulated − measured) / measured; "
             "[noise] = run-to-run difference of the measured repeats",
             f"{'scheduler':<11}{'load':>5} {'model':<11}{'step MAPE [noise]':>19}{'step total [noise]':>20}  "
             + "".join(f"{m + ' ' + s:>17}" for m in ("TTFT", "TPOT", "E2E") for s in ("p50", "p99"))]
    for r in result["rows"]:
        tag = "" if r["held_out"] else " (calibration run)"
        cells = "".join(f"{pct(r[f'{m}.{s}'])} [{pct(r[f'{m}.{s}.noise']).strip():>6}]"
                        for m in ("ttft_ms", "tpot_ms", "e2e_ms") for s in ("p50", "p99"))
        step = f"{pct(r['step_mape'], '')} [{pct(r['step_mape.noise'], '').strip():>5}]"
        total = f"{pct(r.get('step_total'))} [{pct(r.get('step_total.noise')).strip():>6}]"
        lines.append(f"{r['scheduler']:<11}{r['load']:>5.0%} {r['model']:<11}{step:>19}{total:>20}  {cells}{tag}")
    lines += ["", result["targets"]]
    lines += ["", "the same, with the tables' step time rescaled to match each run's measured total (what is left "
                  "is queueing, scheduling and KV capacity):",
              f"{'scheduler':<11}{'load':>5}  " + "".join(f"{m + ' ' + s:>10}" for m in ("TTFT", "TPOT", "E2E")
                                                          for s in ("p50", "p99"))]
    for r in result["rows"]:
        if r["model"] == "tables":
            lines.append(f"{r['scheduler']:<11}{r['load']:>5.0%}  " + "".join(
                f"{pct(r.get(f'{m}.{s}.step_matched')):>10}" for m in ("ttft_ms", "tpot_ms", "e2e_ms")
                for s in ("p50", "p99")))
    return "\n".join(lines)


def cell_target(row: dict, metric: str, stat: str) -> float:
    """The |error| a held-out cell must stay within: 10% at P99; at P50 and P90, 5% or 1.5 x the
    run-to-run noise floor, whichever is larger."""
    if stat == "p99":
        return 0.10
    return max(0.05, 1.5 * abs(row.get(f"{metric}.{stat}.noise") or 0.0))


def target_summary(rows: list[dict]) -> str:
    """How many held-out cells meet the validation targets (cell_target), per step model (tables,
    kernels, calibrated); and for the misses, which term causes them: step time (the cell is within
    its target once the model's step total is rescaled to the measured one) or what is left with
    step time matched (queueing, scheduling, the scatter of step time), with the preemptions that
    would point at KV capacity."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        held_out = [r for r in rows if r["held_out"] and r["model"] == model]
        cells = [(r, m, s, abs(r[f"{m}.{s}"]) <= cell_target(r, m, s)) for r in held_out
                 for m in ("ttft_ms", "tpot_ms", "e2e_ms") for s in ("p50", "p90", "p99") if r[f"{m}.{s}"] is not None]
        if not cells:
            continue
        central = [met for _, _, s, met in cells if s != "p99"]
        tail = [met for _, _, s, met in cells if s == "p99"]
        lines.append(f"held-out runs, {model}: {sum(central)} of {len(central)} P50/P90 errors within "
                     f"max(5%, 1.5 x noise); {sum(tail)} of {len(tail)} P99 errors within 10%")
        missed = [(r, m, s) for r, m, s, met in cells if not met and r.get(f"{m}.{s}.step_matched") is not None]
        if missed:
            step = sum(abs(r[f"{m}.{s}.step_matched"]) <= cell_target(r, m, s) for r, m, s in missed)
            lines.append(f"  misses: {step} of {len(missed)} are step time (within target once the step total "
                         f"matches the measured one), {len(missed) - step} remain with it matched (queueing, "
                         f"scheduling, scatter of step time)")
        preemptions = [(r.get("preemptions.measured"), r.get("preemptions.simulated")) for r in held_out]
        if all(None not in p for p in preemptions):
            lines.append(f"  preemptions (KV capacity): measured {sum(p[0] for p in preemptions)}, "
                         f"simulated {sum(p[1] for p in preemptions)}")
    return "\n".join(lines)
