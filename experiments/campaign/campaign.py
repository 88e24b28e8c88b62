"""The campaign's stages: profile → measure → fit → calibrate → validate → reproduce → report.

Each stage calls the library function its `stepcal` command calls, with the command's default
flags, and prints what the command prints, so every intermediate directory is what a user gets by
hand and can be inspected or rerun on its own.

Loads are set from each scheduler's measured capacity (a saturation run: every request arrives
at once). The lowest load is the calibration run; the higher loads are held out. Five step
models are validated on every run:
  tables      the kernel profile and the calibration load's step logs (and the saturation runs'),
  profiled    the profile alone, whole steps (device time) plus the engine's host path (the `host`
              op): the path of a user without step logs; it saw no run, so every load is held out,
  kernels     the kernel profile alone (GEMMs, attention and the element-wise op): what per-operator
              profiles say, without the engine's host work,
  calibrated  the kernel tables plus host terms fitted to the calibration load's request log, the
              path of a user who has kernel profiles and a deployment's request log only,
  profiled_cal  the profiled tables plus host terms fitted the same way: a base that already has the
              step's shape over batch size (on the CPU the kernels are about half of a step, a third
              without the element-wise op, and terms fitted at a low load, where batches hold few
              sequences, cannot learn the rest).
The profile is taken in two halves, before and after the measurements; the profiled tables fitted
on each half alone say how far that path's prediction moves when the device is profiled again. Fitted
on both, the stretches of a workload's serving that the machine slowed in one half are left out, as a
slowed measured repeat is served again (profiler.slowed_servings).
"""
from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from stepcal.core.errors import InputError, print_warnings
from stepcal.core.io import atomic_write_bytes
from stepcal.core.measured_run import SAME_PLACE, STEPS, read_measured_run, repeat_dir, repeat_dirs
from stepcal.core.model_files import load_model_spec
from stepcal.core.workload import load_workload
from stepcal.costmodel.table_meta import TableMeta
from stepcal.experiments.backends import open_runner
from stepcal.experiments.calibration import calibrate_step_model
from stepcal.experiments.campaign.config import CALIBRATED, PROFILED_OPS, CampaignConfig, load_name
from stepcal.experiments.campaign.headline import Headline, HeadlineRow, late_over_early, profile_reproducibility
from stepcal.experiments.fitting import FitOptions, fit_tables
from stepcal.experiments.output_paths import check_output
from stepcal.experiments.profiling import describe_sweep, profile_kernels
from stepcal.experiments.replications import RangesSettings, replicate_ranges
from stepcal.experiments.report.build import build_report, describe_report
from stepcal.experiments.validation.compare import read_record
from stepcal.experiments.validation.device_history import read_history, record_runs
from stepcal.experiments.validation.validate import validate_run
from stepcal.profiler.fingerprint import hardware_fingerprint
from stepcal.profiler.grid import load_grid
from stepcal.profiler.noise_policy import NoisePolicy
from stepcal.simulator.schedulers import checked_scheduler_config

T = TypeVar("T")


def retry_spent(retries: int) -> str:
    """The calibration's hint for a repeat still slowed: served again `retries` times already."""
    if retries == 0:
        return "this campaign serves no slowed repeat again (retry_slowed_repeats 0)"
    return f"the quickstart served this run's slowed repeats again {retries} times, its most"


RETRY_SPENT = retry_spent(NoisePolicy.for_device("cpu").retry_slowed_repeats)   # the quickstart's


@dataclass(frozen=True)
class CalibrationJob:
    """One `stepcal calibrate` of the campaign: its stage title, the scheduler and model name it
    makes, where it writes, and calibrate_step_model's arguments."""
    title: str
    scheduler: str
    name: str
    target: Path
    args: tuple
    kwargs: dict


def calibrate_captured(task: tuple, shared=None) -> tuple:
    """One calibration in a pool worker: calibrate_step_model(*args, **kwargs) with what it prints
    held back (printed by the campaign in the jobs' order, not interleaved with another's). Returns
    (stdout, stderr, wall seconds, an InputError's message or None)."""

    args, kwargs = task
    printed, warned, error = io.StringIO(), io.StringIO(), None
    started = time.perf_counter()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(warned):
        try:
            calibrate_step_model(*args, **kwargs)
        except InputError as exc:
            error = str(exc)
    return printed.getvalue(), warned.getvalue(), round(time.perf_counter() - started, 1), error


class StageExit(Exception):
    """A stage ended as its command would with this exit status (e.g. 3: an incomplete profile)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Campaign:
    def __init__(self, config: CampaignConfig) -> None:
        self.c = config
        self.t0 = time.perf_counter()
        self.profiled: list[str] = []     # profile directories written (profile, profile_late)
        self.history_used: list = []      # device_history entries of earlier campaigns pooled in run_cv
        self.history_added: list = []     # this campaign's runs, added to the ledger at the end
        self.served_again: list[str] = []  # repeats the machine slowed, served again (serve_slowed_again)

    def stage(self, title: str, command: str, work: Callable[[], T]) -> T:
        """Run one stage: its line on stderr, its time in the timings; a failure names the stage."""
        started = time.perf_counter()
        print(f"[{started - self.t0:6.1f} s] {title}", file=sys.stderr, flush=True)
        try:
            result = work()
        except InputError as exc:     # one line: which stage, then what `stepcal COMMAND` would have said
            raise InputError(f"quickstart: stage '{title}' failed (stepcal {command}): {exc}") from None
        except StageExit as exc:
            raise InputError(f"quickstart: stage '{title}' failed (stepcal {command} exited {exc.code})") from None
        self.c.timings[title] = round(time.perf_counter() - started, 1)
        return result

    def run(self) -> Headline:
        return self.model(self.measure_all())

    def measure_all(self) -> dict:
        """The stages on the device: the profile's two halves around the capacity and load runs.
        Returns each scheduler's capacity (req/s)."""
        c = self.c
        check_output(c.out, staged=False)   # before minutes of profiling, not after
        self.history_used = self.read_history()
        early_rounds, late_rounds = self.profile_rounds()
        self.stage(f"profile kernels ({c.grid} grid)", "profile", lambda: self.profile("profile", early_rounds))
        capacity = self.measure_capacity()
        self.measure_interleaved(capacity)
        if late_rounds:
            self.stage(f"profile kernels again ({late_rounds} more rounds)", "profile",
                       lambda: self.profile("profile_late", late_rounds))
        return capacity

    def measure_capacity(self, num_requests: int | None = None) -> dict:
        """Each scheduler's saturation run (every request at once) of `num_requests` (default: half a
        load run's, at least 60): its throughput, in req/s."""
        c, capacity = self.c, {}
        for s in c.schedulers:
            workload = c.workload(10_000.0, num_requests or max(60, c.num_requests // 2))
            summary = self.stage(f"measure {s} capacity (saturation run)", "measure",
                                 lambda s=s, w=workload: self.measure(s, w, c.measured_dir(s)))
            capacity[s] = summary["throughput_rps"]
        return capacity

    def model(self, capacity: dict) -> Headline:
        """The stages after the measurements (fit, calibrate, validate, reproduce, report), which need
        no device: a campaign measured elsewhere (gpu/gpu_campaign.py) is modelled here."""
        c, out = self.c, self.c.out
        calibration_logs = training_logs(out / "measured", c.schedulers, c.loads[0])
        self.stage("fit T_step tables (tuned)", "fit", lambda: self.fit(calibration_logs, None, out / "tables"))
        models = {s: {"tables": out / "tables"} for s in c.schedulers}
        if c.profiled_ops():
            self.stage("fit T_step tables from the profile alone (step + host)", "fit",
                       lambda: self.fit([], ",".join(PROFILED_OPS), out / "tables_profiled"))
            for s in c.schedulers:
                models[s]["profiled"] = out / "tables_profiled"
        if c.kernel_ops():
            self.stage("fit kernel-only T_step tables", "fit",
                       lambda: self.fit([], ",".join(c.kernel_ops()), out / "tables_kernels"))
            for s in c.schedulers:
                models[s]["kernels"] = out / "tables_kernels"
        calibrations = [(base, name) for base, name in (("kernels", "calibrated"), ("profiled", "profiled_cal"))
                        if base in models[c.schedulers[0]]]
        self.calibrate_all(models, calibrations)
        validations = []
        for s in c.schedulers:
            for load in c.loads:
                for model_name, model in models[s].items():
                    target = out / "validation" / model_name / s / load_name(load)
                    # ranges on the calibrated models' held-out runs: their tables carry the device's
                    # scatter and the host terms' covariance, measured on the calibration runs
                    ranges = c.ranges if model_name in CALIBRATED and load != c.loads[0] else 0
                    title = f"simulate + validate {s} at {load:.0%} load ({model_name}" + (
                        f", {ranges} replications)" if ranges else ")")
                    self.stage(title, "validate", lambda s=s, load=load, model=model, target=target, r=ranges:
                               self.validate(c.measured_dir(s, load), model, target, r))
                    validations.append((s, load, model_name, target))
        reproducibility = None
        if c.profiled_ops() and len(self.profiled) == 2:
            reproducibility = self.stage("fit and validate the profiled tables on each profile half alone "
                                         "(reproducibility)", "fit", self.profile_halves)
        report_dirs = [v[3] for v in validations if v[2] in ("tables", "profiled", *CALIBRATED)] + [out / "tables"]
        self.stage("report", "report", lambda: self.report(report_dirs, out / "report"))
        headline = self.headline(capacity, validations, reproducibility)
        self.record_history()
        return headline

    def read_history(self) -> list:
        """The ledger's entries of this device from earlier campaigns (not of runs under OUT, which this
        campaign replaces, or of --scatter-runs, already pooled), read once before the measurements."""
        c = self.c
        if c.history_file is None or c.repeats < 2:
            return []
        try:
            ledger = read_history(c.history_file)
        except OSError as exc:   # the campaign does not need it: say so and go on without
            print(f"warning: {c.history_file}: cannot read the device history ({exc.strerror}); "
                  "this campaign pools no earlier one", file=sys.stderr)
            return []
        if ledger.num_unreadable:
            print(f"warning: {c.history_file}: {ledger.num_unreadable} line(s) unreadable, left out",
                  file=sys.stderr)
        return ledger.matching(hardware_fingerprint(c.device, num_threads=1), exclude_under=[c.out, *c.scatter_runs])

    def record_history(self) -> None:
        """Every measured run of two or more repeats into the ledger: a later campaign pools its pairs."""
        c = self.c
        if c.history_file is not None and c.repeats >= 2:
            runs = [c.measured_dir(s, load) for s in c.schedulers for load in c.loads]
            try:
                self.history_added = record_runs(c.history_file, runs, c.out)
            except OSError as exc:   # the campaign's results are written; only the ledger is not
                print(f"warning: {c.history_file}: cannot add to the device history ({exc.strerror})",
                      file=sys.stderr)

    def profile_rounds(self) -> tuple[int | None, int]:
        """The grid's passes, split: the first half before the measurements, the rest after them, so
        that the profile, like the interleaved measured repeats, spans the machine's drift over the
        campaign (on this project's VMs its speed moves 10-30% over minutes, and a profile taken at
        the start alone put whole-step tables 15-25% off runs measured minutes later, one way or
        the other)."""
        try:
            rounds = int(load_grid(self.c.grid, load_model_spec(self.c.model_spec)).timing.get("rounds", 1))
        except InputError:
            return None, 0     # the profile stage says what is wrong with the grid
        return rounds - rounds // 2, rounds // 2

    def profile_files(self) -> list[str]:
        """The profiles taken so far (before and after the measurements)."""
        return [str(self.c.out / name / "profile.parquet") for name in self.profiled]

    def profile(self, name: str, rounds: int | None) -> None:
        """Profile into OUT/name, `rounds` passes over the grid (None: the grid's own number)."""
        c = self.c
        result = profile_kernels(c.model_spec, str(c.out / name), device=c.device, ops=c.profile_ops,
                                 grid=c.grid, progress=False, rounds=rounds, noise=c.noise)
        self.profiled.append(name)
        print(describe_sweep(result), file=sys.stderr)
        if not result.complete:
            raise StageExit(3)

    def measure(self, scheduler: str, workload: str, out: Path) -> dict:
        """One repeat of a generated workload, served by the engine with measure's default flags."""
        from stepcal.profiler.engine.engine import EngineConfig  # lazy: loads torch
        from stepcal.profiler.engine.measure import measure_trace  # lazy: loads torch
        c = self.c
        spec = load_model_spec(c.model_spec)
        trace = load_workload(workload, seed=c.seed)
        print_warnings(trace.warnings)
        # EngineConfig's KV block size is measure's --block-size default
        config = EngineConfig(scheduler=scheduler, scheduler_config=checked_scheduler_config(chunk_size=c.chunk_size),
                              seed=c.seed)
        # one repeat per call: serve_slowed_again below judges it against the run's other repeats
        return measure_trace(trace, spec, config, str(out), device=c.device, trace_source=workload,
                             noise=c.noise.with_retry_slowed(0))

    def fit(self, logs: list[Path], ops: str | None, out: Path, profiles: list[str] | None = None,
            track: bool = True) -> None:
        """`stepcal fit` of every profile taken so far (or `profiles`) and `logs` into `out`."""
        c = self.c
        profiles = self.profile_files() if profiles is None else profiles
        fit_tables(FitOptions(profile=[*profiles, *map(str, logs)], out=str(out), ops=ops, model_spec=c.model_spec,
                              regressor="tuned", trials=c.trials, seed=c.seed, no_mlflow=not track, noise=c.noise))

    def profile_halves(self) -> dict:
        """The profiled tables fitted on each half of the profile alone (OUT/reproducibility), and
        every run validated with both: how far the prediction of a user without step logs moves when
        the device is profiled again minutes later (experiments.campaign.headline.profile_reproducibility).
        Diagnostics, not tracked in MLflow."""
        c, where = self.c, self.c.out / "reproducibility"
        for name in self.profiled:
            self.fit([], ",".join(PROFILED_OPS), where / f"tables_{name}", [str(c.out / name / "profile.parquet")],
                     track=False)
        pairs = []
        for s in c.schedulers:
            for load in c.loads:
                rows = []
                for name in self.profiled:
                    target = where / "validation" / name / s / load_name(load)
                    self.validate(c.measured_dir(s, load), where / f"tables_{name}", target)
                    rows.append(HeadlineRow.of(s, load, f"profiled ({name})", True, read_record(target / "validation.json")))
                pairs.append(tuple(rows))
        import pandas as pd  # lazy: loads pandas
        early, late = (pd.read_parquet(c.out / name / "profile.parquet") for name in self.profiled)
        return {**profile_reproducibility(pairs), "late_over_early": late_over_early(early, late)}

    def validate(self, measured: Path, step_model: Path, out: Path, ranges: int = 0) -> None:
        # what `stepcal validate --ranges N --ranges-seed SEED --workers W --quiet` runs: the scatter stored
        # with the tables
        settings = RangesSettings(num_replications=ranges, seed=self.c.seed, workers=self.c.workers)
        validate_run(str(measured), str(step_model), str(out),
                     ranges=partial(replicate_ranges, settings, str(step_model), quantiles=True, quiet=True)
                     if ranges else None)

    def report(self, dirs: list[Path], out: Path) -> None:
        files = build_report([str(d) for d in dirs], str(out))
        print(describe_report(str(out), files))

    def calibrate_all(self, models: dict, bases: list[tuple[str, str]]) -> None:
        """Host terms fitted to each scheduler's calibration-load request log on top of each (base,
        name)'s `base` tables, into models[s][name]: the path of a user who has profiles and a
        deployment's request log only. On the kernel tables ("calibrated") they stand for the engine's
        host work and everything the kernels miss; on the whole-step tables ("profiled_cal") for what
        the profile's host path misses and the front end. Request log only: the 30% runs' step logs,
        which `stepcal calibrate` would read the step terms off, stay out of it (they train the
        `tables` model).
        One after the other, or on config.workers processes at once: they are independent, and a
        third of a Poisson quickstart's time on two cores (four, about a minute each: 247 s one at a
        time, 127 s two at a time, same terms); each one's printed lines come out whole, in the order
        the one-process campaign prints them."""
        jobs = [job for base, name in bases for job in self.calibration_jobs(models, base, name)]
        if self.c.workers > 1 and len(jobs) > 1:
            self.calibrate_in_pool(jobs)
        else:
            for job in jobs:
                self.stage(job.title, "calibrate", lambda j=job: calibrate_step_model(*j.args, **j.kwargs))
        for job in jobs:
            models[job.scheduler][job.name] = job.target

    def calibration_jobs(self, models: dict, base: str, name: str) -> list[CalibrationJob]:
        c = self.c
        # the device's run-to-run spread from every calibration run's repeats, not one pair's, from
        # the profile's two halves, timed before and after the measurements, and from the device's
        # history (--scatter-runs: earlier runs and campaigns; the ledger: earlier quickstarts)
        halves = self.profile_files() if len(self.profiled) == 2 and c.repeats > 1 else []
        jobs = []
        for s in c.schedulers:
            others = [str(c.measured_dir(o, c.loads[0])) for o in c.schedulers if o != s and c.repeats > 1]
            others += list(c.scatter_runs) if c.repeats > 1 else []
            tables, target = models[s][base], c.out / name / s
            jobs.append(CalibrationJob(
                f"calibrate host terms of the {base} tables on {s} at {c.loads[0]:.0%} load", s, name, target,
                (str(c.measured_dir(s, c.loads[0])), str(tables), str(target)),
                {"scatter_runs": others, "scatter_profiles": halves, "history": [e.pairs() for e in self.history_used],
                 "step_log": False, "retry_hint": retry_spent(c.noise.retry_slowed_repeats)}))
        return jobs

    def calibrate_in_pool(self, jobs: list[CalibrationJob]) -> None:
        """The jobs on config.workers spawned processes; each job's stage line and printed lines as
        soon as it and the jobs before it are done; each stage's time is its own calibration's."""
        workers = min(self.c.workers, len(jobs))
        print(f"[{time.perf_counter() - self.t0:6.1f} s] calibrate {len(jobs)} tables, {workers} at a time",
              file=sys.stderr, flush=True)
        done, next_job = {}, 0
        with open_runner(calibrate_captured, None, workers=workers) as runner:
            for index, outcome in runner.as_completed([(job.args, job.kwargs) for job in jobs]):
                done[index] = outcome
                while next_job in done:
                    self.replay_calibration(jobs[next_job], done.pop(next_job))
                    next_job += 1

    def replay_calibration(self, job: CalibrationJob, outcome: tuple) -> None:
        printed, warned, wall_s, error = outcome

        def replay() -> None:
            sys.stdout.write(printed)
            sys.stderr.write(warned)
            if error is not None:
                raise InputError(error)
        self.stage(job.title, "calibrate", replay)
        self.c.timings[job.title] = wall_s

    def measure_interleaved(self, capacity: dict) -> None:
        """Every run's repeat 0, then every run's repeat 1, ...: the machine's speed drifts over
        minutes (the same batches cost up to 20-30% more a few minutes later on a shared CPU), and
        back-to-back repeats would hand each run one moment's speed. Interleaved, every run's
        repeats (and the calibration logs the tables train on) span the whole measurement; every
        other pass is rotated by half its length (CampaignConfig.interleaved), so that each run's
        repeats lie at least half a pass apart."""
        from stepcal.profiler.engine.measure import combine_repeats  # lazy: loads torch
        c, parts = self.c, self.c.out / "measured" / ".repeats"
        for k, s, load in c.interleaved():
            workload, part = c.workload(load * capacity[s]), parts / s / load_name(load) / str(k)
            self.stage(f"measure {s} at {load:.0%} load (repeat {k + 1} of {c.repeats})", "measure",
                       lambda s=s, w=workload, p=part: self.measure(s, w, p))
        for s in c.schedulers:
            for load in c.loads:
                kept = self.serve_slowed_again(s, load, capacity[s], parts)
                combine_repeats([parts / s / load_name(load) / str(k) for k in range(c.repeats)],
                                c.measured_dir(s, load), kept, noise=c.noise)
        shutil.rmtree(parts)

    def serve_slowed_again(self, scheduler: str, load: float, capacity_rps: float, parts: Path) -> tuple[int, ...]:
        """A repeat the machine slowed (a stretch of its steps far slower than the run's other steps of
        that size: profiler.engine.slowdown) is served again, up to config.noise.retry_slowed_repeats
        times per run (profiler.engine.measure.serve_slowed_again, the rule of `stepcal measure
        --retry-slowed`); none where the noise policy marks no slowed window (CUDA's). On
        this project's VMs another process takes the cores for a second or two now and then; a run
        lasts a few seconds, and one such stretch moved a bursty run's TTFT P50 from 128 to 365 ms, a
        miss no model can avoid and a noise floor that excuses every other. The served-again repeats
        are named. Returns the repeats kept because their slow stretch came back in the same place
        (said on stderr): the engine's own, flagged so when the repeats are combined."""
        from stepcal.profiler.engine.measure import serve_slowed_again  # lazy: loads torch
        from stepcal.profiler.engine.slowdown import SlowestWindow  # lazy: loads torch
        c = self.c
        if not c.noise.mark_slowed_windows:    # the rule is a shared CPU's (profiler.noise_policy)
            return ()
        dirs = [parts / scheduler / load_name(load) / str(k) for k in range(c.repeats)]
        repeats = []

        def current() -> list:
            repeats[:] = [read_measured_run(d).repeats[0] for d in dirs]
            return repeats

        def again(k: int, window: dict) -> None:
            why = SlowestWindow.from_dict(window).describe()
            self.served_again.append(f"{scheduler} {load:.0%} repeat {k + 1}: {why}")
            self.stage(f"measure {scheduler} at {load:.0%} load again (repeat {k + 1} of {c.repeats}: the machine "
                       f"slowed it, {why})", "measure",
                       lambda: self.measure(scheduler, c.workload(load * capacity_rps), dirs[k]))
        slowed = serve_slowed_again(current, again, c.noise.retry_slowed_repeats)
        kept = tuple(k for k in slowed if repeats[k].summary.get(SAME_PLACE))
        for k in kept:
            why = SlowestWindow.from_dict(repeats[k].summary["slowest_window"]).describe()
            print(f"{scheduler} at {load:.0%} load, repeat {k + 1}: {why} again, in the same place, when "
                  "served again: kept, as the engine's own", file=sys.stderr)
        return kept

    def headline(self, capacity: dict, validations: list, reproducibility: dict | None = None) -> Headline:
        """Every validation's row, read back from its validation.json; writes OUT/headline.json."""
        # The profiled tables saw no run: every load is held out for them.
        rows = [HeadlineRow.of(scheduler, load, model_name, load != self.c.loads[0] or model_name == "profiled",
                               read_record(path / "validation.json"))
                for scheduler, load, model_name, path in validations]
        headline = Headline(capacity, rows, self.c.timings, round(time.perf_counter() - self.t0, 1), reproducibility,
                            self.served_again, self.slowed_servings())
        atomic_write_bytes(self.c.out / "headline.json", json.dumps(headline.to_dict(), indent=2).encode())
        return headline

    def slowed_servings(self) -> list[str]:
        """The profile's servings with stretches the profiled tables' fit left out (their meta.json), the
        most slowed first, named for the headline as the repeats served again are: workload, profile
        half, how much slower, how many of its steps."""
        from stepcal.profiler.slowed_servings import labels  # lazy: loads pandas
        tables = self.c.out / "tables_profiled"
        if not (tables / "meta.json").exists():
            return []
        return labels(TableMeta.read(tables).slowed_servings or [])


def training_logs(measured: Path, schedulers: tuple[str, ...], calibration_load: float) -> list[Path]:
    """Training data beyond the kernel profile: the step logs of every scheduler's runs that are
    never validated: the calibration load (every repeat: the machine's speed drifts, and more of
    it averages out) and the saturation run (it covers the largest batches)."""
    logs = [d / STEPS for s in schedulers for d in repeat_dirs(measured / s / load_name(calibration_load))]
    return logs + [repeat_dir(measured / s / "saturation", 0) / STEPS for s in schedulers]
