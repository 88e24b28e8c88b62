"""Replications of a simulation (ranges) where the experiments need more than the summaries that
simulator.ranges.replicate returns: a replication's request log (each SLO of a sweep, the latency quantiles
behind the report's CDF bands), or one trace at many rates (capacity); and simulate's, validate's and
capacity's replications on the local pool or Ray.

A replication is simulator.ranges.run_replication (what replicate runs, keeping the whole result): the
step model's error per term, the scatter and the front end drawn from its seed. A `ReplicaPool` sends
what does not depend on the draw (the trace, the loaded step model, the settings) to each worker once
(experiments.backends: a spawned local process, or a Ray object shared by the tasks); a task ships only
(keep, seed, rate) and brings back what a top-level function `keep(result)` keeps of the replication.

`RangesSettings` is what a prediction's ranges are asked for (how many replications, their seed, where
they run, the scatter given); `replicate_ranges` runs them and summarises them as a `ranges` block. Its
replications also draw the fit's held-out error per term (experiments.validation.model_error) and fill
in the scatter the profile knows where no flag or table gives it; the block's `sources` says what was
drawn and what is not known (experiments.validation.error_sources).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from tqdm import tqdm

from stepcal.core.workload import rescale_rate
from stepcal.experiments.backends import open_runner, ordered
from stepcal.experiments.step_models import stored_scatter, tables_meta
from stepcal.experiments.validation.error_sources import filled_scatter, sources_block
from stepcal.experiments.validation.model_error import ModelError, model_error_of, with_model_error
from stepcal.simulator.ranges import INTERVAL, ranges_block, replication_seeds, run_replication, term_names
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.step_model import HostTermsModel

CDF_QUANTILES = np.round(np.linspace(0.0, 1.0, 101), 2)   # where each replication's latency CDF is kept
CDF_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")            # the report's CDF panels
RANGES_PERCENTILES = "ranges_percentiles.parquet"         # where simulate and validate --ranges store quantile_frame


def scatter_text(block: dict) -> str:
    """'scatter cv 0.14, rho 0.84, run cv 0.067 (3 pairs: Student's t; the model carries a 2-repeat run's
    speed)': what a ranges block's replications drew of the device."""
    pairs, repeats = block.get("scatter_run_cv_pairs", 0), block.get("scatter_model_repeats", 0)
    level = [f"{pairs} pair{'s' if pairs != 1 else ''}: Student's t"] if pairs else []
    level += [f"the model carries a {repeats}-repeat run's speed"] if repeats else []
    return (f"scatter cv {block.get('scatter_cv', 0.0):g}, rho {block.get('scatter_rho', 0.0):g}, "
            f"run cv {block.get('scatter_run_cv', 0.0):g}" + (f" ({'; '.join(level)})" if level else ""))


def keep_summary(result) -> dict:
    return result.summary


def keep_summary_and_quantiles(result) -> tuple[dict, dict[str, list[float]]]:
    """The summary and, per CDF metric, the finished requests' latency at CDF_QUANTILES (None: no value)."""
    finished = result.requests["finish_s"].notna().to_numpy()
    quantiles = {}
    for metric in CDF_METRICS:
        values = result.requests[metric].to_numpy(dtype=np.float64)[finished]
        values = values[np.isfinite(values)]
        quantiles[metric] = (np.quantile(values, CDF_QUANTILES).tolist() if len(values)
                             else [None] * len(CDF_QUANTILES))
    return result.summary, quantiles


@dataclass(frozen=True)
class Shared:
    """What every replication of a run shares: the base trace (rescaled per task when a rate is given),
    the loaded step model, the simulation settings (with the scatter) and the model's held-out error
    each replication draws (None: not drawn)."""
    trace: object
    model: object
    config: object
    model_error: ModelError | None = None


@dataclass(frozen=True)
class Task:
    """One replication: what to keep of it (a module-level function), its seed, and the rate (None: the
    trace's own arrivals)."""
    keep: Callable
    seed: int
    rate_rps: float | None = None


def run_task(task: Task, shared: Shared):
    trace = shared.trace if task.rate_rps is None else rescale_rate(shared.trace, task.rate_rps)
    model = with_model_error(shared.model, shared.model_error, task.seed)
    return task.keep(run_replication(trace, model, shared.config, task.seed))


class ReplicaPool:
    """Runs replications on a backend of experiments.backends: in this process (local, workers 1), in a
    pool of local processes, or as Ray tasks; every worker receives the Shared part once. The settings
    are checked when the pool is made. Use as a context manager; `map` keeps the order of its tasks
    whichever backend runs them."""

    def __init__(self, trace, model, config, workers: int = 1, *, backend: str = "local",
                 address: str | None = None, model_error: ModelError | None = None) -> None:
        self._runner = open_runner(run_task, Shared(trace, model, config, model_error), backend=backend,
                                   workers=workers, address=address)
        self.num_simulations = 0

    def __enter__(self) -> ReplicaPool:
        self.runner = self._runner.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._runner.__exit__(*exc)

    def map(self, keep: Callable, seeds: Sequence[int], rate_rps: float | None = None,
            on_done: Callable[[], None] | None = None) -> list:
        """keep(replication) for each seed, at `rate_rps` (None: the trace as it is); `on_done()` as each
        replication finishes (a progress bar's step)."""
        self.num_simulations += len(seeds)
        tasks = [Task(keep, seed, rate_rps) for seed in seeds]
        return ordered(self.runner.as_completed(tasks), len(tasks), on_done)


def quantile_frame(seeds: Sequence[int], quantiles: Sequence[dict[str, list]]):
    """Long table of the replications' latency quantiles: replication, seed, metric, quantile, value_ms."""
    import pandas as pd  # lazy: loads pandas
    rows = [(i, seed, metric, float(q), value)
            for i, (seed, by_metric) in enumerate(zip(seeds, quantiles))
            for metric, values in by_metric.items() for q, value in zip(CDF_QUANTILES, values)]
    frame = pd.DataFrame(rows, columns=["replication", "seed", "metric", "quantile", "value_ms"])
    return frame.astype({"replication": "int64", "seed": "int64", "value_ms": "float64"})


class progress_bar:
    """A bar over replications on stderr, as simulate's and sweep's bars (tqdm), or nothing when `quiet`;
    a context manager whose value is the pool's on_done (None when quiet). `total` None: counted only
    (capacity does not know beforehand how many rates it will probe)."""

    def __init__(self, total: int | None, quiet: bool = False, desc: str = "replications") -> None:
        self.total, self.quiet, self.desc = total, quiet, desc
        self.bar = None

    def __enter__(self) -> Callable[[], None] | None:
        if self.quiet:
            return None

        self.bar = tqdm(total=self.total, unit="sim", desc=self.desc, file=sys.stderr, mininterval=0.5, leave=False)
        return self.bar.update

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclass(frozen=True)
class ScatterOverrides:
    """The scatter a command was asked to draw (--scatter-cv, --scatter-rho, --scatter-run-cv,
    --scatter-run-cv-pairs, --scatter-model-repeats); None where not given, so the step model's stored
    value (else 0) is drawn."""
    cv: float | None = None
    rho: float | None = None
    run_cv: float | None = None
    run_cv_pairs: int | None = None
    model_level_repeats: int | None = None

    def source(self, stored: dict) -> str:
        """Where the scatter came from: any value given, else the tables, else none. cv, rho and run_cv
        all given make it flags (the pairs behind a given run_cv are the flag's or none; the model's
        level repeats describe the model, not the device)."""
        given = [value is not None for value in (self.cv, self.rho, self.run_cv)]
        given_any = any(given) or self.run_cv_pairs is not None or self.model_level_repeats is not None
        if all(given) or (given_any and not stored):
            return "flags"
        return "flags and tables" if given_any else ("tables" if stored else "none")


@dataclass(frozen=True)
class RangesSettings:
    """How many replications a prediction's ranges run (0: no ranges), from which seed, where, and with
    which scatter. The defaults are those of the --ranges flags."""
    num_replications: int = 0
    seed: int = 0
    workers: int = 1
    backend: str = "local"
    ray_address: str | None = None
    scatter: ScatterOverrides = field(default_factory=ScatterOverrides)

    def pool(self, trace, model, config, model_error: ModelError | None = None) -> ReplicaPool:
        """A ReplicaPool on these workers and backend (drawing `model_error` where given)."""
        return ReplicaPool(trace, model, config, self.workers, backend=self.backend, address=self.ray_address,
                           model_error=model_error)


def chosen_scatter(overrides: ScatterOverrides, step_model: str) -> tuple[Scatter, str]:
    """The replications' Scatter: each of cv, rho, run_cv and model_level_repeats where given, else the
    one stored with the step model `step_model` names (meta.json scatter), else 0; run_cv_pairs where
    given, else 0 (run_cv taken as exact); and where it came from (ScatterOverrides.source)."""
    stored = stored_scatter(step_model)

    def chosen(value, key: str, default=0.0):
        return stored.get(key, default) if value is None else value
    scatter = Scatter(chosen(overrides.cv, "cv"), chosen(overrides.rho, "rho"), chosen(overrides.run_cv, "run_cv"),
                      overrides.run_cv_pairs or 0, int(chosen(overrides.model_level_repeats, "model_level_repeats", 0)),
                      float(stored.get("bias_cv", 0.0)))   # the model's, as its level repeats
    return scatter, overrides.source(stored)


def replication_settings(settings: RangesSettings, model, scatter: Scatter, wall_s: float) -> dict:
    """What a `ranges` block says of how its replications were drawn and run (simulate, validate, capacity)."""
    return {"seed": settings.seed, "interval_percentiles": list(INTERVAL), "drawn_terms": term_names(model),
            "scatter_cv": scatter.cv, "scatter_rho": scatter.rho, "scatter_run_cv": scatter.run_cv,
            "scatter_run_cv_pairs": scatter.run_cv_pairs, "scatter_model_repeats": scatter.model_level_repeats,
            "scatter_bias_cv": scatter.bias_cv, "workers": settings.workers, "backend": settings.backend,
            "wall_s": wall_s}


def replicate_ranges(settings: RangesSettings, step_model: str, trace, model, config, *, quantiles: bool = False,
                     quiet: bool = False) -> dict | None:
    """The `ranges` block of a simulation (simulator.ranges) over settings.num_replications replications
    of `model` (which `step_model` names), or None when there are none. With `quantiles`, the block also
    holds `replica_quantiles`: a DataFrame of each replication's latency at CDF_QUANTILES (for the
    report's CDF bands), which the caller stores apart. `quiet`: no progress bar."""
    if not settings.num_replications:
        return None
    scatter, source = chosen_scatter(settings.scatter, step_model)
    meta = tables_meta(model)
    # a calibrated model's level and host terms were fitted to a run: their covariance carries its error
    error = None if meta.calibration is not None else model_error_of(meta)
    stored = stored_scatter(step_model)
    given = {"cv": settings.scatter.cv is not None or "cv" in stored,
             "run_cv": settings.scatter.run_cv is not None or "run_cv" in stored}
    scatter, origins = filled_scatter(scatter, given, error, meta)
    seeds = replication_seeds(settings.num_replications, settings.seed)
    wall0 = time.perf_counter()
    with settings.pool(trace, model, replace(config, scatter=scatter), error) as pool, \
            progress_bar(len(seeds), quiet) as on_done:
        kept = pool.map(keep_summary_and_quantiles if quantiles else keep_summary, seeds, on_done=on_done)
    table = None
    if quantiles:
        summaries = [summary for summary, _ in kept]
        table = quantile_frame(seeds, [q for _, q in kept])
    else:
        summaries = kept
    block = {"num_replications": settings.num_replications,
             **replication_settings(settings, model, scatter, time.perf_counter() - wall0),
             "scatter_source": source,
             "sources": sources_block(error, meta, term_names(model), scatter, origins,
                                      host_terms=isinstance(model, HostTermsModel)),
             "stats": ranges_block(summaries)}
    if table is not None:
        block["replica_quantiles"] = table
    return block
