"""validation.md: the validation record as a markdown table, as `stepcal validate` prints it."""
from __future__ import annotations

from stepcal.experiments.host_defaults import describe_host_defaults
from stepcal.experiments.validation.compare import StepMatched, ValidationRecord
from stepcal.experiments.validation.error_sources import sources_text
from stepcal.experiments.validation.extrapolated import describe_beyond
from stepcal.experiments.validation.machine_speed import describe_speed
from stepcal.experiments.validation.measured import RETRY_HINT, describe_slowed
from stepcal.experiments.validation.split import describe_split

STEP_MATCHED_NOTE = ("with the step model rescaled (x {scale:.3f}) so that its total matches the measured step log's, "
                     "the error left comes from queueing, scheduling and KV capacity:")


def step_matched_rows(matched: StepMatched) -> list[list[str]]:
    """Rows (metric, P50, P90, P99 errors) of the step-matched simulation, for the table and the report."""
    return [[metric] + [format_pct(matched.error(metric, f"p{q}")) for q in (50, 90, 99)]
            for metric in ("ttft_ms", "tpot_ms", "e2e_ms")]


def format_table(record: ValidationRecord) -> str:
    """A markdown table of the validation record."""
    repeats = record.num_repeats
    lines = [f"measured run {record.measured_run}: {record.num_requests} requests, "
             + (f"each statistic the mean of {repeats} repeats, " if repeats > 1 else "")
             + f"{record.num_finished_both} finished in both runs"
             + (f", {record.num_finished_only_measured} only measured" if record.num_finished_only_measured else "")
             + (f", {record.num_finished_only_simulated} only simulated" if record.num_finished_only_simulated else ""),
             "", "| metric | stat | measured | simulated | error | noise floor |", "|---|---|---|---|---|---|"]
    for metric, stats in record.metrics.items():
        for stat, cell in stats.items():
            lines.append(f"| {metric} | {stat} | {_fmt(cell.measured)} | {_fmt(cell.simulated)} | "
                         f"{format_pct(cell.error)} | {format_pct(cell.noise_floor)} |")
    t = record.throughput_rps
    lines.append(f"| throughput_rps | | {_fmt(t.measured)} | {_fmt(t.simulated)} | {format_pct(t.error)} | "
                 f"{format_pct(t.noise_floor)} |")
    if record.host_defaults:
        lines += ["", describe_host_defaults(record.host_defaults)]
    if record.ranges is not None:
        lines += ["", _ranges_line(record.ranges)]
    if record.timeseries is not None:
        lines += ["", timeseries_line(record.timeseries)]
    reuse = record.prefix_reuse
    if reuse is not None:
        lines += ["", f"prefix cache: measured {_share(reuse.measured_hit_rate)} of prompt tokens reused, "
                      f"simulated {_share(reuse.simulated_hit_rate)}; {reuse.num_same_cached} of "
                      f"{reuse.num_compared} requests reused the same number of tokens"]
    s = record.step_level
    if s.mape is None:
        return "\n".join(lines + ["", "step level: no measured step log"])
    lines += ["", f"step level: MAPE {format_pct(s.mape)}, P90 APE {format_pct(s.p90_ape)}, max APE {format_pct(s.max_ape)} "
                  f"over {s.num_steps} measured steps; total step time {format_pct(s.total_error)} "
                  f"(mean measured {s.mean_measured_ms:.3f} ms, predicted {s.mean_predicted_ms:.3f} ms)"]
    noise = s.noise_floor
    if noise:
        lines.append(f"step-time noise floor: the same batch in two repeats differs by {format_pct(noise.mape)} "
                     f"on average (median {format_pct(noise.median_ape)}, {noise.num_matched_steps} batches); "
                     f"their total time, repeat 1 vs repeat 0: {format_pct(noise.total_difference)}")
    split = describe_split(record.step_split)
    if split:
        lines.append(split)
    for slowed in record.slowed_repeats or []:
        again = "" if slowed.get("same_place") else f"; {RETRY_HINT}"
        lines.append(f"{describe_slowed(slowed, repeat='measured repeat')}: its statistics are in the measured "
                     f"values above{again}")
    beyond = describe_beyond(record.beyond_fitted)
    if beyond:
        lines.append(beyond)
    speed = describe_speed(record.speed_probe_ms, record.profile_speed_probe_ms)
    if speed:
        lines.append(speed)
    matched = record.step_matched
    if matched:
        lines += ["", STEP_MATCHED_NOTE.format(scale=matched.scale), "",
                  "| metric | p50 | p90 | p99 |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in step_matched_rows(matched)]
    return "\n".join(lines)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_pct(value) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ranges_line(ranges: dict) -> str:
    c = ranges["coverage"]
    low, high = ranges["interval_percentiles"]
    line = (f"ranges: {ranges['num_replications']} replications; the measured value lies inside the {low:g}th-{high:g}th "
            f"percentile interval in {c['num_inside']} of {c['num_cells']} cells (coverage {_share(c['coverage'])}")
    mean = c.get("coverage_of_mean")
    if c.get("num_repeats", 1) > 1 and mean:
        line += (f", each of {c['num_repeats']} repeats on its own; their mean in {mean['num_inside']} of "
                 f"{mean['num_cells']}, {_share(mean['coverage'])}")
    line += f"), median width {_share(c['median_relative_width'])} of the measured value"
    return line + (f"\n{sources_text(ranges['sources'])}" if ranges.get("sources") else "")


def timeseries_line(block: dict) -> str:
    """validation.md's line: each compared series' means, peaks and mean difference per tick."""
    parts = [f"{name} mean {c['measured_mean']:.1f} measured / {c['simulated_mean']:.1f} simulated, peak "
             f"{c['measured_peak']:.0f} / {c['simulated_peak']:.0f}, mean |difference| {c['mean_abs_diff']:.1f}"
             for name, c in block["series"].items()]
    if block["not_recorded"]:
        parts.append(f"not recorded by the run: {', '.join(block['not_recorded'])}")
    if block["not_simulated"]:
        parts.append(f"not known to the replay (no KV capacity): {', '.join(block['not_simulated'])}")
    return f"engine queue over {block['ticks']} ticks of {block['file']}: " + "; ".join(parts)
