"""The work of `stepcal fit`: fit every target, write a T_step table directory, track it in MLflow
(the campaign runs it too). Imports nothing heavy at load time."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.io import atomic_output_dir
from stepcal.core.model_files import load_model_spec
from stepcal.core.parallel_layout import checked_parallelism
from stepcal.costmodel.devices import device_spec
from stepcal.costmodel.profile_speed import profile_speed_probes
from stepcal.profiler.noise_policy import NoisePolicy


@dataclass(frozen=True)
class FitOptions:
    """What `stepcal fit` is asked for (the flags below, by the same names); the campaign builds one too."""
    profile: list[str]
    out: str
    format: str = "auto"
    model_spec: str | None = None
    dtype: str | None = None
    device: str | None = None
    ops: str | None = None
    tp: int | None = None
    ep: int = 1
    moe_distribution: str | None = None
    ep_link_gbps: float = 450.0
    ep_latency_us: float = 10.0
    tp_link_gbps: float | None = None
    tp_latency_us: float = 0.0
    no_skew: bool = False
    device_spec: str | None = None
    axes: str = "data"
    regressor: str = "tuned"
    trials: int = 12
    timeout_s: float | None = None
    storage: str | None = None
    seed: int = 0
    holdout: str | None = None
    tracking_uri: str | None = None
    experiment: str = "stepcal-fit"
    register: str | None = None
    no_mlflow: bool = False
    scatter_runs: list[str] = field(default_factory=list)
    noise: NoisePolicy | None = None     # None: the profiles' device's


def fit_tables(options: FitOptions) -> None:
    """Fit every target, write the T_step table directory options.out, track it in MLflow, print the errors."""

    from stepcal.costmodel.axes import AXES_RULES, Axes  # lazy: loads numpy, pandas
    from stepcal.costmodel.build import build_tables, composed_ops  # lazy: loads numpy, pandas, sklearn
    from stepcal.costmodel.compose_comm import Composition  # lazy: loads numpy, pandas, sklearn
    from stepcal.costmodel.compose_elementwise import roofline_device  # lazy: loads numpy, pandas, sklearn
    from stepcal.costmodel.fitting import (  # lazy: loads numpy, pandas, sklearn
        FitConfig,
        dtypes_for,
        fit_all,
        select_records,
    )
    from stepcal.costmodel.importers import load_profiles  # lazy: loads numpy, pandas
    from stepcal.costmodel.records import normalise_dtype  # lazy: loads numpy, pandas

    if options.axes not in AXES_RULES:
        raise InputError(f"--axes must be one of {', '.join(AXES_RULES)}, got {options.axes!r}")
    if options.trials < 1:
        raise InputError(f"--trials must be at least 1, got {options.trials}")
    for flag, value in (("--tp", options.tp), ("--ep", options.ep)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    if options.device_spec is not None:
        try:                                    # an unknown name fails before any fitting
            device_spec(options.device_spec)
        except InputError as exc:
            raise InputError(f"--device-spec: {exc}") from None
    spec = load_model_spec(options.model_spec) if options.model_spec else None
    parallelism = checked_parallelism(spec, options.tp or 1, options.ep, options.model_spec)
    composition = Composition(options.moe_distribution, options.ep_link_gbps, options.ep_latency_us,
                              options.device_spec, tp_link_gbps=options.tp_link_gbps,
                              tp_latency_us=options.tp_latency_us, decode_skew_alpha=_skew_alpha(options))
    started = time.perf_counter()
    dtype = normalise_dtype(options.dtype) if options.dtype else (dtypes_for(spec) if spec else None)
    # With a model, only the ops its T_step is composed of (unless --ops says otherwise).
    ops = options.ops or (composed_ops(spec, parallelism) if spec else None)
    records = select_records(load_profiles(options.profile, options.format, spec, options.tp), device=options.device,
                             dtype=dtype, tp=options.tp, ops=ops)
    imported = _import_meta(records, options, composition.decode_skew_alpha)
    profile_speed_probes(records)   # each profile's meta.json read now: one of a newer schema is refused before fitting
    records, slowed = without_slowed_servings(records, options.noise)
    if slowed:
        from stepcal.profiler.slowed_servings import describe  # lazy: loads numpy, pandas
        print(describe(slowed), flush=True)
    roofline_device(records, options.device_spec)  # --device-spec against the profiles' own device, before fitting
    holdout = None
    if options.holdout:
        holdout = select_records(load_profiles([options.holdout], options.format, spec, options.tp), device=options.device,
                                 dtype=dtype, tp=options.tp)
    config = FitConfig(regressor=options.regressor, trials=options.trials, seed=options.seed,
                       storage=options.storage, timeout_s=options.timeout_s)
    result = fit_all(records, config, holdout,
                     progress=lambda t, n: print(f"fitting {t} ({n} rows)", flush=True))
    out = Path(options.out)
    scatter = logged_scatter(options.profile, options.scatter_runs)   # the runs are read before the output is staged
    with atomic_output_dir(out) as staging:
        meta = build_tables(result, staging, spec=spec, parallelism=parallelism, composition=composition,
                            axes=Axes.default() if options.axes == "fixed" else None,
                            extra_meta={"inputs": [str(p) for p in options.profile], "holdout": options.holdout,
                                        **({"scatter": scatter} if scatter else {}),
                                        **({"slowed_servings": [s.to_dict() for s in slowed]} if slowed else {}),
                                        **imported})
        plot = _plot(result, staging)
    if not options.no_mlflow:
        meta = _track(options, result, out, meta, plot and out / plot.name)
    _report(result, meta, out, time.perf_counter() - started)


def _skew_alpha(options: FitOptions) -> float | None:
    """Decode attention's skew correction from an LLMServingSim bundle's skew.csv; None for other inputs."""
    if options.format != "llmservingsim" or options.no_skew:
        return None
    from stepcal.costmodel.importers.llmservingsim import skew_alpha  # lazy: loads numpy, pandas
    return skew_alpha(options.profile, options.tp)


def _import_meta(records, options: FitOptions, skew_alpha: float | None) -> dict:
    """meta.json's account of an LLMServingSim bundle's import (which file each term came from, the
    skew term the composition adds, what was left out); nothing for other formats."""
    if options.format != "llmservingsim":
        return {}
    from stepcal.costmodel.importers.llmservingsim import bundle_meta  # lazy: loads numpy, pandas
    account = bundle_meta(records, skew_alpha)
    return {"llmservingsim": {"term_files": account["term_files"]}, "notes": account["notes"]}


def without_slowed_servings(records, noise=None):
    """The records less the served steps the machine slowed (stretches of a serving: profiler.slowed_servings),
    where a workload was served more than once (two profiles: the campaign's halves, a device profiled
    twice; or a grid's [serve] rounds): a pooled row's time from its other passes, a row with none
    left out. Returns them and the slowed servings; the records as they are where the NoisePolicy
    `noise` (None: the profiles' device's) does not drop slowed servings."""
    from stepcal.profiler.serve import SERVED  # lazy: loads numpy
    from stepcal.profiler.slowed_servings import (  # lazy: loads numpy, pandas
        find_slowed,
        kept_times,
        profiled_device,
        read_served,
    )
    served = records["source"].eq("profile") & records["name"].eq(SERVED)
    files = [f for f in records.loc[served, "file"].unique() if str(f).endswith(".parquet")]
    noise = noise if noise is not None else NoisePolicy.for_device(profiled_device(files))
    if not noise.drop_slowed_servings:
        return records, []
    frames = {f: read_served(f) for f in files}
    slowed = find_slowed(frames) if frames else []
    if not slowed:
        return records, []
    records = records.copy()
    drop = served & False          # no row yet, aligned with records
    for file, times in kept_times(frames, slowed).items():
        rows = served & records["file"].eq(file)
        new = records.loc[rows, "row"].map(times)
        drop |= rows & records["row"].isin([r for r, t in times.items() if t is None])
        keep = new.notna()
        records.loc[keep[keep].index, "time_ms"] = new[keep].astype(float)
    return records[~drop].reset_index(drop=True), slowed


def logged_scatter(paths, scatter_runs=()) -> dict | None:
    """The device's step-time scatter from the measured runs whose step logs are among the inputs (a
    run's repeat_k/steps.parquet with a second repeat beside it), as `stepcal calibrate` stores it
    (experiments.validation.scatter): cv and rho the median over the runs, run_cv pooled over their
    pairs of repeats and those of `scatter_runs` (--scatter-runs: the device's history), which give
    cv and rho too where no step log among the inputs has a second repeat. What `--ranges` draws with
    these tables; None without any such run."""

    import numpy as np  # lazy: loads numpy

    from stepcal.core.measured_run import STEPS, repeat_dirs  # lazy: loads numpy
    from stepcal.experiments.validation.measured import load_measured_run  # lazy: loads numpy, tqdm
    from stepcal.experiments.validation.scatter import (  # lazy: loads numpy, tqdm
        SOURCE,
        check_same_device,
        measured_scatter,
        one_repeat_error,
        pairs_of,
        pooled_run_cv,
        run_pairs,
        scatter_run_dirs,
    )
    runs = sorted({Path(p).parent.parent for p in paths
                   if Path(p).name == STEPS and Path(p).parent.name.startswith("repeat_")})
    found = {}
    for run in runs:
        if len(repeat_dirs(run)) < 2:
            continue
        try:
            measured = load_measured_run(run)
        except InputError:      # a step log kept without its run: nothing to pair it with
            continue
        scatter = measured_scatter(measured)
        if scatter is not None:
            found[str(run)] = (measured, scatter)
    own = {Path(run).resolve() for run in found}
    # one repeat: refused (run_pairs, pairs_of). Without the inputs' own runs the history gives cv and
    # rho too: its runs are loaded once, for both.
    loaded, history = {}, {}
    for run in scatter_run_dirs(scatter_runs):
        if run.resolve() in own:
            continue
        if found:
            history[str(run)] = run_pairs(run)
        else:
            loaded[str(run)] = load_measured_run(run)
            history[str(run)] = pairs_of(loaded[str(run)])
    if not found and not history:
        return None
    reference = (next(iter(found.values()))[0] if found else next(iter(history.values()))).meta.fingerprint
    for where, pairs in history.items():
        check_same_device(reference, pairs.meta, where)
    if found:       # cv and rho: the inputs' own runs where there are some, else the history's
        shapes = {where: scatter for where, (_, scatter) in found.items()}
    else:
        shapes = {where: measured_scatter(run) for where, run in loaded.items()}
        missing = [where for where, scatter in shapes.items() if scatter is None]
        if missing:
            raise one_repeat_error(missing[0])
    ratios = [r for where, (_, scatter) in found.items() for r in scatter["run_cv_log_ratios"]]
    ratios += [r for pairs in history.values() for r in pairs.ratios]
    median = {key: float(np.median([s[key] for s in shapes.values()])) for key in ("cv", "rho")}
    pairs = f"those {len(shapes)} run(s)" + (f" and {len(history)} more (--scatter-runs)" if found and history else "")
    where = "among the inputs" if found else "of --scatter-runs"
    return {**median, "run_cv": pooled_run_cv(ratios), "run_cv_pairs": len(ratios),
            "source": f"cv and rho: the median over {len(shapes)} measured run(s) of two or more repeats {where}; "
                      + SOURCE.format(pairs=pairs), "runs": sorted(shapes),
            **({"run_cv_runs": sorted(found) + sorted(history)} if history else {})}


def _plot(result, directory):
    from stepcal.costmodel.plots import plot_held_out  # lazy: loads numpy, pandas, sklearn
    return plot_held_out(result, directory / "held_out_random.png")


def _track(options, result, out, meta, plot):
    from stepcal.costmodel.tracking import default_tracking_uri, track_fit  # lazy: loads numpy, pandas, sklearn
    uri = options.tracking_uri or default_tracking_uri(out)
    run_id = track_fit(result, out, meta, tracking_uri=uri, experiment=options.experiment,
                       register=options.register, plot_path=plot,
                       artifact_root=None if options.tracking_uri else out / "mlartifacts",
                       params={"model_spec": options.model_spec, "tp": options.tp or 1, "ep": options.ep,
                               "dtype": options.dtype, "device": options.device, "device_spec": options.device_spec,
                               "inputs": " ".join(options.profile)[:500]})
    # meta.json is rewritten whole (atomically) now that the run id is known.
    return replace(meta, mlflow_run_id=run_id, mlflow_tracking_uri=uri).write(out)


def _report(result, meta, out, wall_s) -> None:
    terms = " + ".join(meta.t_step_terms) or "none"
    print(f"wrote {out} ({meta.mode} T_step: {terms}) in {wall_s:.1f} s")
    for target, fit in result.targets.items():
        errs = "  ".join(f"{split} MAPE {e['mape']:.2f}% (P90 {e['p90_ape']:.1f}%)"
                         for split, e in fit.errors.items())
        print(f"  {target:<36} {fit.choice.family:<8} {fit.n_rows:>6} rows  {errs}")
    for split, e in result.errors.items():
        print(f"  overall {split}: MAPE {e['mape']:.2f}%  P90 {e['p90_ape']:.1f}%  max {e['max_ape']:.1f}%")
    for note in meta.notes or []:
        print(f"  note: {note}")
    for target, why in (meta.skipped_targets or {}).items():
        print(f"  note: {target} not fitted: {why}")      # its term is then among the missing ones
    if meta.missing_terms:
        print(f"  note: no data for T_step terms {', '.join(meta.missing_terms)}")
    scatter = meta.scatter
    if scatter:
        print(f"  step-time scatter from {len(scatter['runs'])} measured run(s) (what --ranges draws): "
              f"cv {scatter['cv']:.3g}, rho {scatter['rho']:.3g}, run cv {scatter['run_cv']:.3g}")
    if meta.mlflow_run_id:
        print(f"  MLflow run {meta.mlflow_run_id} at {meta.mlflow_tracking_uri}")
