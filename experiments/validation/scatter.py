"""The device's step-time scatter, from measured runs of two repeats: what the tables store
(meta.json `scatter`) and `--ranges` replications draw by default.

- cv, rho: the step-to-step scatter of step time, an AR(1) process on log step time, from the
  batches both repeats of one run ran (experiments.validation.noise).
- run_cv: the device's speed from run to run. The two repeats of a run serve the same workload, so
  the log ratio r = log(T_1 / T_0) of their total step time is the speed difference of two runs,
  with variance 2 sigma_run^2 (four repeats are two such pairs: 0 with 1, 2 with 3). One pair is a
  poor estimate of a spread (a chi-square of one degree of freedom): on this project's CPU campaigns
  single pairs gave sigma_run from 0.003 to 0.30 where the six pairs of each campaign together said
  0.04 to 0.11. So every pair at hand is pooled: sigma_run^2 = mean(r_i^2) / 2.
- A profile timed in two halves (the quickstart profiles before and after its measurements) is one
  more pair: the median over the points both halves timed of log(t_late / t_early), whole-step points
  where there are some (they are closest to a run), else every point.
- The device's history: `--scatter-runs` takes earlier measured runs, or directories holding some
  (an earlier campaign), of the same device. A campaign alone has three pairs, which put sigma_run
  anywhere from a third of its value to 1.6 times it (a chi-square of three degrees of freedom); on
  this project's 2-core CPU machine eight campaigns' pairs said 0.013 to 0.125 each where their 48
  pairs together said 0.089.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from stepcal.core.errors import InputError
from stepcal.core.measured_run import META, STEPS, repeat_dirs
from stepcal.core.readers import read_parquet
from stepcal.core.run_meta import RunMeta, is_measured_run
from stepcal.experiments.validation.measured import load_measured_run
from stepcal.experiments.validation.noise import run_noise
from stepcal.experiments.validation.steps import matched_steps

# The fingerprint fields (profiler.fingerprint) that make two runs the same device for run_cv; the
# hostname, clocks and library versions may differ.
DEVICE_FIELDS = ("device", "cpu_model", "num_cpus", "gpu_name", "num_threads")

SOURCE = ("two repeats of the measured run: the log ratio of the batches both ran, as an AR(1) process "
          "(experiments.validation.noise); run_cv from the ratio of total step times of the repeats of "
          "{pairs} (experiments.validation.scatter)")


def speed_log_ratios(run) -> list[float]:
    """Every independent pair of `run`'s repeats: log(T_1 / T_0), log(T_3 / T_2), ... over the batches
    each pair both ran (a run of four repeats is two pairs; a fifth repeat pairs with nothing)."""
    ratios = []
    for first in range(0, run.num_repeats - 1, 2):
        both = matched_steps(run, first, first + 1)
        if both is not None:
            ratios.append(float(np.log(both["ms_1"].sum() / both["ms_0"].sum())))
    return ratios


def pooled_run_cv(log_ratios: Sequence[float]) -> float:
    """The coefficient of variation of a run's speed factor (log-normal) from the log ratios of
    pairs of runs: sigma_run^2 = mean(r^2) / 2, cv = sqrt(exp(sigma_run^2) - 1)."""
    ratios = np.asarray(log_ratios, dtype=np.float64)
    if ratios.size == 0:
        raise ValueError("pooled_run_cv needs at least one pair of repeats")
    sigma_run_sq = float(np.mean(ratios ** 2)) / 2.0
    return float(np.sqrt(np.expm1(sigma_run_sq)))


def profile_log_ratio(early: str | Path, late: str | Path) -> float:
    """The device's speed between two profiles of the same points: the median over the points both
    timed (status ok) of log(t_late / t_early), over the whole-step points where both have some."""
    from stepcal.costmodel.importers import profile_table  # lazy: loads pandas
    columns = ("point_key", "op", "time_ms", "status")
    early, late = (profile_table(p) or p for p in (early, late))   # a profile directory, or its table
    frames = [read_parquet(path, "--scatter-profiles", columns) for path in (early, late)]
    both = frames[0].merge(frames[1], on="point_key", suffixes=("_early", "_late"))
    both = both[(both["status_early"] == "ok") & (both["status_late"] == "ok")]
    if both.empty:
        raise InputError(f"--scatter-profiles {early} {late}: no point timed in both (profiles of the same grid "
                         "and model are needed)")
    steps = both[both["op_early"] == "step"]
    both = steps if len(steps) else both
    return float(np.median(np.log(both["time_ms_late"].to_numpy(float) / both["time_ms_early"].to_numpy(float))))


def measured_scatter(run, more_runs: Sequence[RunPairs] = (), more_ratios: Sequence[float] = ()) -> dict | None:
    """cv and rho from `run` (a MeasuredRun of two or more repeats), run_cv pooled over its pair of
    repeats, those of `more_runs` (run_pairs of runs of the same device) and `more_ratios` (other
    pairs' log ratios, e.g. profile_log_ratio). None when `run` has one repeat."""
    noise, own = run_noise(run), speed_log_ratios(run)
    if noise is None or not own:
        return None
    for other in more_runs:
        check_same_device(run.meta.fingerprint, other.meta, str(other.path))
    ratios = [*own, *(r for other in more_runs for r in other.ratios), *more_ratios]
    # Log-normal factors' coefficient of variation: sqrt(exp(sigma^2) - 1), about sigma when small.
    cv = float(np.sqrt(np.expm1(noise.sigma_log ** 2)))
    pairs = "this run" + (f", {len(more_runs)} more run(s) of this device (--scatter-runs, the device's history)"
                          if more_runs else "") + (
        f" and {len(more_ratios)} pair(s) of profiles (--scatter-profiles)" if more_ratios else "")
    block = {"cv": min(cv, 1.0), "rho": noise.rho, "run_cv": pooled_run_cv(ratios),
             "run_cv_pairs": len(ratios), "run_cv_log_ratios": ratios, "source": SOURCE.format(pairs=pairs)}
    if more_runs:
        block["run_cv_runs"] = [str(run.path), *(str(other.path) for other in more_runs)]
    return block


def scatter_run_dirs(paths: Sequence[str | Path], own: str | Path | None = None) -> list[Path]:
    """The measured runs `--scatter-runs` names: a path that is a measured run stands for itself; a
    directory that is not stands for every measured run of two or more repeats under it (an earlier
    campaign's, whose saturation runs have one), hidden directories (a campaign's staging) left out.
    `own`, the run being calibrated, and repeats of a run are dropped: a pair counts once."""
    skip = {Path(own).resolve()} if own is not None else set()
    found: list[Path] = []
    for given in map(Path, paths):
        if not given.is_dir() or (given / META).exists():
            runs = [given]        # a run (load_measured_run says what is wrong with it, if anything)
        else:
            runs = sorted(m.parent for m in given.rglob(META) if is_measured_run(m.parent)
                          and not any(part.startswith(".") for part in m.relative_to(given).parts)
                          and len(repeat_dirs(m.parent)) >= 2)
            if not runs:
                raise InputError(f"--scatter-runs {given}: no measured run of two or more repeats under it "
                                 "(expected `stepcal measure` outputs or a directory holding some, e.g. a campaign's)")
        for run in runs:
            if run.resolve() not in skip:
                skip.add(run.resolve())
                found.append(run)
    return found


def check_same_device(reference: dict | None, other_meta: RunMeta, where: str) -> None:
    """InputError when the run `where` (its meta.json `other_meta`) was measured on another device than
    `reference` (a fingerprint): its speed pairs say nothing of this one. Runs without a fingerprint
    (imported ones) are taken as they are."""
    other = other_meta.fingerprint
    if not isinstance(reference, dict) or not isinstance(other, dict):
        return
    field = differing_field(reference, other)
    if field is not None:
        raise InputError(f"--scatter-runs {where}: measured on another device ({field} {other[field]!r}, "
                         f"not {reference[field]!r}): its speed pairs say nothing of this one")


def differing_field(reference: dict, other: dict) -> str | None:
    """The first of DEVICE_FIELDS that both fingerprints name and that differs, else None."""
    return next((f for f in DEVICE_FIELDS if f in reference and f in other and reference[f] != other[f]), None)


def check_scatter_runs(paths: Sequence[str | Path], reference: dict) -> None:
    """What `--scatter-runs` names, checked from each run's meta.json and repeat directories alone
    (before minutes of work, without reading its logs): runs of two or more repeats, measured on the
    device of the fingerprint `reference`."""
    for path in scatter_run_dirs(paths):
        meta = RunMeta.read(path)
        if len(repeat_dirs(path)) < 2:
            raise one_repeat_error(path)
        check_same_device(reference, meta, str(path))


def required_ratios(run) -> list[float]:
    """speed_log_ratios of a --scatter-runs run; InputError (naming it) for a run of one repeat."""
    ratios = speed_log_ratios(run)
    if not ratios:
        raise one_repeat_error(run.path)
    return ratios


@dataclass(frozen=True)
class RunPairs:
    """What run_cv needs of a --scatter-runs run: where it is, its meta.json (the fingerprint) and its
    pairs' log ratios (required_ratios)."""
    path: Path
    meta: RunMeta
    ratios: tuple[float, ...]


def run_pairs(path: str | Path) -> RunPairs:
    """RunPairs of the measured run at `path`, kept for the process while its step logs are unchanged:
    a quickstart calibrates four models on the same history, and loading a run whole takes ~0.5 s."""
    stamps = tuple((d / STEPS).stat().st_mtime_ns for d in repeat_dirs(path))
    return _run_pairs(Path(path), stamps)


@lru_cache(maxsize=256)
def _run_pairs(path: Path, stamps: tuple) -> RunPairs:
    return pairs_of(load_measured_run(path))


def pairs_of(run) -> RunPairs:
    """RunPairs of a loaded MeasuredRun (InputError for a run of one repeat)."""
    return RunPairs(run.path, run.meta, tuple(required_ratios(run)))


def one_repeat_error(path):
    return InputError(f"--scatter-runs {path}: needs a measured run of two or more repeats "
                      "(its repeats' total step times give the run-to-run spread); it has one")
