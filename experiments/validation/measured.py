"""A measured run as validation compares it: the workload, repeat 0's request log (and the later
repeats' for calibration), every repeat's step log, and each statistic averaged over the repeats
(files: core.measured_run)."""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from stepcal.core.errors import InputError, shown
from stepcal.core.measured_run import METRICS, SAME_PLACE, STATS, MetricStats, Needs, RunStats, read_measured_run
from stepcal.core.run_meta import RunMeta
from stepcal.core.schemas import REQUEST_LOG_COLUMNS, STEP_LOG_COLUMNS
from stepcal.simulator.frontend import FrontEnd
from stepcal.simulator.schedulers import SCHEDULERS, SchedulerConfig
from stepcal.simulator.simulation import SimConfig


def check_replay_meta(where: Path, meta: RunMeta) -> None:
    """The settings a replay builds its SimConfig from, each of the type it needs (the kind was
    checked on reading)."""
    if not isinstance(meta.scheduler, str) or meta.scheduler not in SCHEDULERS:
        raise InputError(f"{where}: scheduler must be one of {', '.join(SCHEDULERS)}, got {meta.scheduler!r}")
    config = meta.scheduler_config
    known = set(SchedulerConfig.__dataclass_fields__)
    if not isinstance(config, dict) or not set(config) <= known:
        raise InputError(f"{where}: scheduler_config must be an object with keys among {', '.join(sorted(known))}, "
                         f"got {config!r}")
    settings = [("block_size", meta.block_size), ("kv_blocks", meta.kv_blocks)]
    settings += [(f"scheduler_config.{k}", v) for k, v in config.items()]
    for key, value in settings:
        if value is None and key.split(".")[-1] in NULLABLE:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{where}: {key} must be a positive integer, got {shown(value)}")


# Settings whose null means "no limit" (KV blocks), "the scheduler's own default" (token budget) or
# "off" (speculative decoding, which the engine's runs do not use yet).
NULLABLE = ("kv_blocks", "max_num_batched_tokens", "spec_decode")


# A measured run as a replay needs it: the settings its SimConfig is built from, every statistic
# compared, and both logs.
REPLAY = Needs(meta_keys=("kind", "scheduler", "scheduler_config", "block_size", "kv_blocks"),
               summary_keys=("throughput_rps", "num_preemptions") + METRICS,
               request_columns=REQUEST_LOG_COLUMNS, step_columns=STEP_LOG_COLUMNS, check_meta=check_replay_meta)


@dataclass
class MeasuredRun:
    path: Path
    meta: RunMeta
    trace: object            # core.trace.Trace
    requests: object         # DataFrame, repeat 0
    steps: object            # DataFrame, every repeat's step log, with a `repeat` column
    stats: RunStats          # each statistic averaged over the repeats; preemptions of repeat 0
    noise_floor: RunStats | None = None   # summary.json's run-to-run noise floor, when there are repeats
    num_repeats: int = 1
    speed_probe_ms: list | None = None    # per repeat: a fixed decode step's time around it (the machine's speed)
    repeat_stats: list | None = None      # per repeat: its own RunStats (None where a repeat has no summary)
    later_requests: tuple = ()            # the request logs of repeats 1, 2, ... (DataFrames)
    same_place: tuple = ()                # repeats slow again in the same place when served again: kept

    @property
    def request_logs(self) -> tuple:
        """Every repeat's request log, repeat 0 first."""
        return (self.requests, *self.later_requests)


def load_measured_run(path: str | Path) -> MeasuredRun:
    import pandas as pd  # lazy: loads pandas
    files = read_measured_run(path, arg_name="--measured", needs=REPLAY)
    top = RunStats.from_summary(files.summary)
    summaries = [r.summary for r in files.repeats if r.summary is not None]
    repeat_stats = [RunStats.from_summary(s) for s in summaries] if len(summaries) == len(files.repeats) else None
    stats = top
    if repeat_stats is not None and len(repeat_stats) > 1:
        stats = replace(mean_over_repeats(repeat_stats), num_preemptions=top.num_preemptions)
    noise = files.summary.get("noise_floor")
    steps = pd.concat([r.steps.assign(repeat=k) for k, r in enumerate(files.repeats)], ignore_index=True)
    probes = [s.get("speed_probe_ms") for s in summaries]
    same_place = tuple(k for k, r in enumerate(files.repeats) if (r.summary or {}).get(SAME_PLACE))
    return MeasuredRun(files.path, files.meta, files.trace, files.repeats[0].requests, steps, stats,
                       RunStats.from_summary(noise) if noise is not None else None, len(files.repeats),
                       probes if probes and None not in probes else None, repeat_stats,
                       tuple(r.requests for r in files.repeats[1:]), same_place)


def mean_over_repeats(runs: list[RunStats]) -> RunStats:
    """Each latency statistic and the throughput averaged over the repeats: the measured value the
    simulator is compared with. One repeat alone carries the machine's speed at that moment (on a
    shared CPU the same batches differ by up to 20% in total between repeats minutes apart)."""
    def mean(values: list) -> float | None:
        return float(np.mean(values)) if all(v is not None for v in values) else None
    metrics = {metric: MetricStats(**{stat: mean([r.stat(metric, stat) for r in runs]) for stat in STATS})
               for metric in METRICS}
    return RunStats(metrics, mean([r.throughput_rps for r in runs]))


def sim_config_for(run: MeasuredRun, step_overhead_ms: float = 0.0, front_end=None):
    """The simulator settings that replay the measured run: same scheduler, budget, KV capacity; the
    request path `front_end` (simulator.frontend.FrontEnd, none by default)."""
    meta = run.meta
    return SimConfig(scheduler=meta.scheduler, scheduler_config=SchedulerConfig(**meta.scheduler_config),
                     block_size=meta.block_size, kv_blocks=meta.kv_blocks, step_overhead_ms=step_overhead_ms,
                     front_end=front_end or FrontEnd(), record_batches=False,
                     prefix_caching=meta.prefix_caching_on,   # runs written before prefix caching had none
                     timeout_s=meta.timeout_s)


def slowed_repeats(run: MeasuredRun) -> list[dict]:
    """The measured repeats the machine slowed (profiler.engine.slowdown), found on their step logs
    whenever they were measured: {repeat, ratio, start_s, end_s, others} each, and `same_place`: true
    for one kept because it was slow again in the same place when served again (the engine's own)."""
    from stepcal.profiler.engine.slowdown import slowest_windows  # lazy: loads torch
    logs = [steps for _, steps in run.steps.groupby("repeat", sort=True)]
    return [{"repeat": k, **w.to_dict(), **({"same_place": True} if k in run.same_place else {})}
            for k, w in enumerate(slowest_windows(logs)) if w is not None and w.slowed]


def describe_slowed(slowed: dict, where: str = "", repeat: str = "repeat") -> str:
    """One slowed_repeats entry in words: a warning for the machine's, a note for the engine's own.
    `where` goes before the sentence (a run's path and ": "); `repeat` names the repeat."""
    from stepcal.profiler.engine.slowdown import SlowestWindow  # lazy: loads torch
    window = SlowestWindow.from_dict(slowed).describe()
    if slowed.get("same_place"):
        return (f"note: {where}{repeat} {slowed['repeat']} was slow in the same place each time it was served "
                f"({window}): kept, as the engine's own")
    return f"warning: {where}the machine slowed {repeat} {slowed['repeat']} ({window})"


RETRY_HINT = "`stepcal measure --retry-slowed 2` serves such a repeat again"


def warn_slowed(run: MeasuredRun, what: str, retry_hint: str | None = None) -> list[dict]:
    """slowed_repeats, each named on stderr: `what` (the fit, the comparison) holds its statistics;
    `retry_hint` follows a slowed repeat's line (default RETRY_HINT; the quickstart's says its retries
    are spent)."""
    slowed = slowed_repeats(run)
    for s in slowed:
        again = "" if s.get("same_place") else f" ({retry_hint or RETRY_HINT})"
        print(f"{describe_slowed(s, f'{run.path}: ')}; {what}{again}", file=sys.stderr)
    return slowed
