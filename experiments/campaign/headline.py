"""The campaign's headline: one row per validation (scheduler, load, step model), how many held-out
cells meet the targets, and the table the quickstart prints. headline.json is rows' to_dict."""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

import numpy as np

HEADLINE_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
HEADLINE_STATS = ("p50", "p90", "p99")
COVERAGE_KEYS = ("num_inside", "num_cells", "median_relative_width")   # of validate's ranges.coverage


@dataclass(frozen=True)
class HeadlineCell:
    error: float | None            # (simulated - measured) / measured
    noise: float | None            # the measured run-to-run noise floor of the same statistic
    step_matched: float | None     # the error left with the step model rescaled to the measured total


@dataclass(frozen=True)
class HeadlineRow:
    scheduler: str
    load: float                    # share of the scheduler's measured capacity
    model: str                     # tables, profiled, kernels, calibrated or profiled_cal
    held_out: bool                 # False for the calibration load
    step_mape: float | None
    step_mape_noise: float | None
    step_total: float | None
    step_total_noise: float | None
    preemptions_measured: int | None
    preemptions_simulated: int | None
    cells: dict                    # (metric, stat) -> HeadlineCell, HEADLINE_METRICS x HEADLINE_STATS
    coverage: dict | None = None   # validate --ranges: num_inside, num_cells, median_relative_width
    extrapolated: float | None = None   # share of the measured step time beyond the tables' fitted batches
    speed_vs_profile: float | None = None   # the machine's slowdown during the run against the profile

    def cell(self, metric: str, stat: str) -> HeadlineCell:
        return self.cells[(metric, stat)]

    @classmethod
    def of(cls, scheduler: str, load: float, model: str, held_out: bool, record) -> HeadlineRow:
        """The row of one validation record (experiments.validation.compare.ValidationRecord)."""
        step, noise, matched = record.step_level, record.step_level.noise_floor, record.step_matched
        cells = {(m, s): HeadlineCell(record.cell(m, s).error, record.cell(m, s).noise_floor,
                                      None if matched is None else matched.error(m, s))
                 for m in HEADLINE_METRICS for s in HEADLINE_STATS}
        coverage = (record.ranges or {}).get("coverage")
        kept = {k: coverage.get(k) for k in COVERAGE_KEYS} if coverage else None
        return cls(scheduler, load, model, held_out, step.mape, noise and noise.mape, step.total_error,
                   noise and noise.total_difference, record.preemptions.measured, record.preemptions.simulated,
                   cells, kept, (record.beyond_fitted or {}).get("share_of_time"), record.speed_vs_profile)

    @classmethod
    def from_dict(cls, data: dict) -> HeadlineRow:
        """A row of headline.json (keys missing: None)."""
        cells = {(m, s): HeadlineCell(data.get(f"{m}.{s}"), data.get(f"{m}.{s}.noise"),
                                      data.get(f"{m}.{s}.step_matched"))
                 for m in HEADLINE_METRICS for s in HEADLINE_STATS}
        return cls(data.get("scheduler"), data.get("load"), data["model"], data["held_out"], data.get("step_mape"),
                   data.get("step_mape.noise"), data.get("step_total"), data.get("step_total.noise"),
                   data.get("preemptions.measured"), data.get("preemptions.simulated"), cells, data.get("coverage"),
                   data.get("extrapolated"), data.get("speed_vs_profile"))

    def to_dict(self) -> dict:
        out = {"scheduler": self.scheduler, "load": self.load, "model": self.model, "held_out": self.held_out,
               "step_mape": self.step_mape, "step_mape.noise": self.step_mape_noise, "step_total": self.step_total,
               "step_total.noise": self.step_total_noise, "preemptions.measured": self.preemptions_measured,
               "preemptions.simulated": self.preemptions_simulated}
        for (m, s), cell in self.cells.items():
            out.update({f"{m}.{s}": cell.error, f"{m}.{s}.noise": cell.noise, f"{m}.{s}.step_matched": cell.step_matched})
        if self.coverage is not None:
            out["coverage"] = self.coverage
        if self.extrapolated is not None:
            out["extrapolated"] = self.extrapolated
        if self.speed_vs_profile is not None:
            out["speed_vs_profile"] = self.speed_vs_profile
        return out


@dataclass
class Headline:
    capacity_rps: dict             # scheduler -> saturation throughput, req/s
    rows: list                     # HeadlineRow
    timings_s: dict                # stage title -> seconds
    wall_s: float
    reproducibility: dict | None = None   # profile_reproducibility's, when the profile has two halves
    served_again: list = field(default_factory=list)   # repeats the machine slowed, served again (why)
    # the profile's servings the machine slowed, left out of the profiled tables' fit (profiler.slowed_servings)
    slowed_servings: list = field(default_factory=list)

    @property
    def targets(self) -> str:
        return target_summary(self.rows)

    def to_dict(self) -> dict:
        out = {"capacity_rps": self.capacity_rps, "rows": [r.to_dict() for r in self.rows], "targets": self.targets,
               "timings_s": self.timings_s, "wall_s": self.wall_s}
        if self.reproducibility is not None:
            out["reproducibility"] = self.reproducibility
        out["served_again"] = self.served_again
        out["slowed_servings"] = self.slowed_servings
        return out


def profile_reproducibility(pairs: list[tuple[HeadlineRow, HeadlineRow]]) -> dict:
    """How far the profiled prediction moves if the device is profiled again, from each run's rows
    simulated with tables fitted on the profile's early half alone and on its late half alone: per
    P50/P90 cell of TTFT, TPOT and E2E, move = |simulated late / simulated early - 1|. Returns the
    median and largest move, how many moves exceed the cell's own target (cell_target: a cell can
    meet it only to within the profile's reproducibility), and the cells each half alone meets."""
    moves, beyond, met = [], 0, {"early": 0, "late": 0}
    for early, late in pairs:
        for m in HEADLINE_METRICS:
            for s in ("p50", "p90"):
                move = abs((1 + late.cell(m, s).error) / (1 + early.cell(m, s).error) - 1)
                moves.append(move)
                target = cell_target(early, m, s)
                beyond += move > target
                met["early"] += abs(early.cell(m, s).error) <= target
                met["late"] += abs(late.cell(m, s).error) <= cell_target(late, m, s)
    return {"num_cells": len(moves), "median_move": float(np.median(moves)), "max_move": float(np.max(moves)),
            "num_beyond_target": beyond, "cells_met": met}


def reproducibility_line(r: dict) -> str:
    return (f"profile reproducibility: with the profiled tables fitted on each half of the profile alone (before "
            f"and after the measurements), the simulated P50/P90 move by a median {100 * r['median_move']:.1f}% "
            f"(at most {100 * r['max_move']:.0f}%), by more than the cell's target in {r['num_beyond_target']} "
            f"of {r['num_cells']} cells; each half alone meets {r['cells_met']['early']} and "
            f"{r['cells_met']['late']} of them" + _late_over_early(r.get("late_over_early")))


def _late_over_early(ratio: dict | None) -> str:
    if not ratio:
        return ""
    return (f"; the late half timed the same whole steps {100 * (ratio['median'] - 1):+.1f}% against the early one "
            f"(median over {ratio['num_points']} points: the machine's speed moved that much)")


def late_over_early(early, late) -> dict | None:
    """The profile halves' whole steps (step and served-step rows, `serve`'s steps) matched point by point:
    the median of late / early time, and over how many points. The machine's drift between the halves,
    read off the profile itself; None where no point is in both."""
    keys = ["point_key", "name"]
    pick = [frame[frame["op"].isin(("step", "serve")) & frame["status"].eq("ok")][[*keys, "time_ms"]]
            for frame in (early, late)]
    both = pick[0].merge(pick[1], on=keys, suffixes=("_early", "_late"))
    both = both[(both["time_ms_early"] > 0) & (both["time_ms_late"] > 0)]
    if both.empty:
        return None
    return {"median": float(np.median(both["time_ms_late"] / both["time_ms_early"])), "num_points": len(both)}


def cell_target(row: HeadlineRow, metric: str, stat: str) -> float:
    """The |error| a held-out cell must stay within: 10% at P99; at P50 and P90, 5% or 1.5 x the
    run-to-run noise floor, whichever is larger."""
    if stat == "p99":
        return 0.10
    return max(0.05, 1.5 * abs(row.cell(metric, stat).noise or 0.0))


def target_summary(rows: list[HeadlineRow]) -> str:
    """How many held-out cells meet the validation targets (cell_target), per step model (tables,
    profiled, kernels, calibrated, profiled_cal); and for the misses, which term causes them: step time (the cell is within
    its target once the model's step total is rescaled to the measured one) or what is left with
    step time matched (queueing, scheduling, the scatter of step time), with the preemptions that
    would point at KV capacity."""
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        held_out = [r for r in rows if r.held_out and r.model == model]
        cells = [(r, m, s, abs(r.cell(m, s).error) <= cell_target(r, m, s)) for r in held_out
                 for m in HEADLINE_METRICS for s in HEADLINE_STATS if r.cell(m, s).error is not None]
        if not cells:
            continue
        central = [met for _, _, s, met in cells if s != "p99"]
        tail = [met for _, _, s, met in cells if s == "p99"]
        lines.append(f"held-out runs, {model}: {sum(central)} of {len(central)} P50/P90 errors within "
                     f"max(5%, 1.5 x noise); {sum(tail)} of {len(tail)} P99 errors within 10%")
        missed = [(r, m, s) for r, m, s, met in cells if not met and r.cell(m, s).step_matched is not None]
        if missed:
            step = sum(abs(r.cell(m, s).step_matched) <= cell_target(r, m, s) for r, m, s in missed)
            lines.append(f"  misses: {step} of {len(missed)} are step time (within target once the step total "
                         f"matches the measured one), {len(missed) - step} remain with it matched (queueing, "
                         f"scheduling, scatter of step time)")
        covered = [r.coverage for r in held_out if r.coverage and r.coverage.get("num_cells")]
        if covered:
            lines.append("  " + coverage_line(covered))
        beyond = [r for r in held_out if r.extrapolated]
        if beyond:   # validate's warning, per run: a miss there is the fit's extrapolation
            lines.append("  steps beyond the batches the tables were fitted on (extrapolated prices): "
                         + ", ".join(f"{r.scheduler} {r.load:.0%} load {100 * r.extrapolated:.1f}% of its step time"
                                     for r in beyond))
        drift = speed_line(held_out)
        if drift:
            lines.append("  " + drift)
        preemptions = [(r.preemptions_measured, r.preemptions_simulated) for r in held_out]
        if all(None not in p for p in preemptions):
            lines.append(f"  preemptions (KV capacity): measured {sum(p[0] for p in preemptions)}, "
                         f"simulated {sum(p[1] for p in preemptions)}")
    return "\n".join(lines)


MIN_RUNS_FOR_R = 5   # fewer runs give a correlation too loose to read


def speed_line(rows: list[HeadlineRow]) -> str | None:
    """The machine's speed during the held-out runs against the profile the tables were fitted on
    (validate's speed_vs_profile), where both were probed: a step-time miss of about that size is the
    machine's drift, not the model's."""

    drifts = sorted(r.speed_vs_profile for r in rows if r.speed_vs_profile is not None)
    if not drifts:
        return None
    line = (f"machine speed during these runs against the profile (a fixed decode step; + is slower): "
            f"{100 * drifts[0]:+.1f}% to {100 * drifts[-1]:+.1f}%, median {100 * median(drifts):+.1f}%")
    pairs = np.array([(r.speed_vs_profile, r.step_total) for r in rows
                      if r.speed_vs_profile is not None and r.step_total is not None], dtype=np.float64)
    if len(pairs) >= MIN_RUNS_FOR_R and pairs.std(axis=0).min() > 0:
        # a probe slower than the profile's with a step total priced low: the machine's drift, not the model
        r_value = float(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1])
        line += (f"; correlation with the step model's total error (predicted / measured - 1): r = {r_value:+.2f} "
                 f"over {len(pairs)} runs")
    return line


def coverage_line(covered: list[dict]) -> str:
    """How often the measured values (each repeat on its own) fell inside the 90% intervals of the
    held-out runs, with the median of the runs' median relative widths."""
    inside, cells = sum(c["num_inside"] for c in covered), sum(c["num_cells"] for c in covered)
    widths = [c["median_relative_width"] for c in covered if c.get("median_relative_width") is not None]
    width = f"; median width {100 * float(np.median(widths)):.0f}% of the measured value" if widths else ""
    return (f"90% intervals: the measured value lies inside in {inside} of {cells} cells "
            f"({100 * inside / cells:.0f}%, target 80-97%){width}")


def format_headline(headline: Headline) -> str:
    """The table the quickstart prints: errors beside the noise floor, the targets, the step-matched errors."""
    def pct(v, sign="+"):
        return "   -  " if v is None else f"{100 * v:{sign}6.1f}%"
    shown = [(m, s) for m in HEADLINE_METRICS for s in ("p50", "p99")]
    names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}
    lines = ["capacity (saturation throughput): " + ", ".join(f"{s} {r:.1f} req/s" for s, r in headline.capacity_rps.items()),
             "", "errors of the simulator against the measured runs, (simulated − measured) / measured; "
             "[noise] = run-to-run difference of the measured repeats",
             f"{'scheduler':<11}{'load':>5} {'model':<12}{'step MAPE [noise]':>19}{'step total [noise]':>20}  "
             + "".join(f"{names[m] + ' ' + s:>17}" for m, s in shown)]
    for r in headline.rows:
        tag = "" if r.held_out else " (calibration run)"
        cells = "".join(f"{pct(r.cell(m, s).error)} [{pct(r.cell(m, s).noise).strip():>6}]" for m, s in shown)
        step = f"{pct(r.step_mape, '')} [{pct(r.step_mape_noise, '').strip():>5}]"
        total = f"{pct(r.step_total)} [{pct(r.step_total_noise).strip():>6}]"
        lines.append(f"{r.scheduler:<11}{r.load:>5.0%} {r.model:<12}{step:>19}{total:>20}  {cells}{tag}")
    lines += ["", headline.targets]
    if headline.reproducibility is not None:
        lines.append(reproducibility_line(headline.reproducibility))
    if headline.served_again:
        lines.append(f"served again, the machine having slowed them: {'; '.join(headline.served_again)}")
    if headline.slowed_servings:
        lines.append(slowed_servings_line(headline.slowed_servings))
    lines += ["", "the same, with the tables' step time rescaled to match each run's measured total (what is left "
                  "is queueing, scheduling and KV capacity):",
              f"{'scheduler':<11}{'load':>5}  " + "".join(f"{names[m] + ' ' + s:>10}" for m, s in shown)]
    for r in headline.rows:
        if r.model == "tables":
            lines.append(f"{r.scheduler:<11}{r.load:>5.0%}  "
                         + "".join(f"{pct(r.cell(m, s).step_matched):>10}" for m, s in shown))
    return "\n".join(lines)


def slowed_servings_line(servings: list, limit: int = 3) -> str:
    """The profile's slowed stretches in a line: the most slowed servings (the list's first), and how
    many more tables_profiled/meta.json names."""
    more = f"; and {len(servings) - limit} more (tables_profiled/meta.json)" if len(servings) > limit else ""
    return ("profile stretches the machine slowed, left out of the profiled tables' fit: "
            + "; ".join(servings[:limit]) + more)
