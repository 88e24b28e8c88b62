"""Writing a calibrated step model: the work of `stepcal calibrate` around the fit.

It reads the measured run, measures the device's scatter on it (pooled with more runs, a profile's
two halves and the device's history), fits the host terms (stages.calibrate), and writes the output
directory: the step model's tables copied, with `host_terms`, the `calibration` record and the
scatter block in meta.json, written by the writer `stepcal fit` uses (TableMeta.write; a calibrated
built-in model's by BuiltinMeta.write).
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.io import atomic_output_dir
from stepcal.core.metrics import clean_json
from stepcal.experiments.calibration.result import Calibration
from stepcal.experiments.calibration.stages import calibrate
from stepcal.experiments.host_defaults import host_defaults as engine_defaults
from stepcal.experiments.step_model_meta import BuiltinMeta, read_step_model_meta
from stepcal.experiments.step_models import resolve_step_model
from stepcal.experiments.validation.measured import MeasuredRun, load_measured_run, warn_slowed
from stepcal.experiments.validation.scatter import measured_scatter, profile_log_ratio, run_pairs, scatter_run_dirs
from stepcal.simulator.scatter import Scatter
from stepcal.simulator.step_model import HostTermsModel


def calibrate_step_model(measured: str | Path, step_model: str, out: str | Path,
                         max_simulations: int = 300, host_defaults: str | None = None,
                         scatter_runs: Sequence[str | Path] = (),
                         scatter_profiles: Sequence[str | Path] = (),
                         history: Sequence = (), step_log: bool = True,
                         retry_hint: str | None = None) -> Calibration:
    """The work of `stepcal calibrate`: fit host terms of `step_model` (re-fitted from its base when it
    has some) on the measured run, and write OUT as a step-model directory: a copy of the tables with
    `host_terms` and a `calibration` record in meta.json (for const: / linear:, a small directory
    naming the model). `host_defaults` names an engine whose published terms start the search;
    `scatter_runs`, more measured runs of the device whose repeats join the run-to-run spread, as does
    `scatter_profiles`, a profile timed in two halves (early, late), and `history`, RunPairs of the
    device's history (experiments.validation.device_history) whose runs may be gone. `step_log`: read
    the step terms off the run's step log where it has one (False: search them on the request log).
    `retry_hint`: what the warning of a slowed repeat suggests (default: measure it again)."""
    run = load_measured_run(measured)
    more_runs = [run_pairs(r) for r in scatter_run_dirs(scatter_runs, own=measured)] + list(history)
    scatter = scatter_of(run, more_runs, scatter_profiles)  # before the search
    model = resolve_step_model(step_model)
    base = model.base if isinstance(model, HostTermsModel) else model   # re-fit from the base, not on top
    start = None
    if host_defaults is not None:
        start = engine_defaults(host_defaults)
    step_scatter = Scatter(cv=scatter["cv"], rho=scatter["rho"]) if scatter is not None else None
    # after the inputs' checks: a refusal is one line
    warn_slowed(run, "the host terms are fitted to it as measured", retry_hint)
    result = calibrate(run, base, max_simulations=max_simulations, start=start, scatter=step_scatter,
                       step_log=step_log)
    source = Path(step_model)
    with atomic_output_dir(out) as staging:
        if source.is_dir():
            with tempfile.TemporaryDirectory() as tmp:   # copy first: out may be step_model itself
                shutil.copytree(source, Path(tmp) / "t")
                for item in (Path(tmp) / "t").iterdir():
                    shutil.move(str(item), staging / item.name)
            meta = read_step_model_meta(staging)
        else:
            meta = BuiltinMeta(step_model=step_model)
        calibration = clean_json({**result.to_dict(), "measured_run": str(measured), "host_defaults": host_defaults})
        meta = replace(meta, host_terms=result.terms.to_dict(), calibration=calibration)
        if scatter is not None or result.bias_cv > 0:   # the level the terms left goes with the device's spread
            meta = replace(meta, scatter={**(scatter or {"cv": 0.0, "rho": 0.0, "run_cv": 0.0}),
                                          "bias_cv": result.bias_cv})
        meta.write(staging)
    return result


def scatter_of(run: MeasuredRun, scatter_runs: list, scatter_profiles: Sequence = ()) -> dict | None:
    """The scatter block calibrate stores: measured_scatter of the run, its run_cv pooled with the
    repeats of `scatter_runs` (experiments.validation.scatter.RunPairs) and the two halves of
    `scatter_profiles` (early, late), and the run's repeats as model_level_repeats
    (simulator.ranges.Scatter)."""
    if (scatter_runs or scatter_profiles) and run.num_repeats < 2:
        flag = "--scatter-runs" if scatter_runs else "--scatter-profiles"
        raise InputError(f"{flag} needs --measured of two or more repeats ({run.path} has one): "
                         "the step-to-step scatter comes from its own repeats")
    ratios = [profile_log_ratio(*scatter_profiles)] if scatter_profiles else []
    block = measured_scatter(run, scatter_runs, ratios)
    if block is not None:   # the calibrated terms are fitted to every repeat: the model carries their speed
        block["model_level_repeats"] = run.num_repeats
    return block
