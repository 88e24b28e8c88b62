"""Which noise should size a calibration's standard errors (issue 17)?

    .venv/bin/python studies/calibration_noise.py CAMPAIGN [CAMPAIGN ...]

`stepcal calibrate` gives each host term a standard error from the sandwich (J'J)^-1 J'SJ (J'J)^-1,
S the noise of the calibration run's log statistics. For each campaign's calibrated models
(OUT/calibrated and OUT/profiled_cal, each scheduler, fitted on the lowest load) this prints the
mean variance of the fitted log statistics under three views of that noise:

  bootstrap:  a block bootstrap of the run's requests (what S was before f051966; still the one for a
              run of one repeat);
  scatter:    the device's step scatter (the run's AR(1) cv and rho, meta.json's `scatter`) simulated
              over calibrate's 16 seeds with the calibrated terms, over the repeats averaged (what S is now);
  repeats:    what two repeats of the same run show: d^2 / 4 for d the log ratio of their statistics
              (the variance of their mean), less the part common to all statistics (the run's speed
              level, which `--ranges` draws apart);

and the fit's residual mean square over its degrees of freedom against each (the misfit ratio that
scales S when above 1). The simulation replays the measured requests, so only what the device adds
can move a fit: on the quickstart's campaigns the bootstrap came out 10-50 times the other two.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

MODELS = ("calibrated", "profiled_cal")


def repeats_variance(run, keys) -> float | None:
    """Mean variance of the mean of the first two repeats' log statistics, the common level left out."""
    if not run.repeat_stats or len(run.repeat_stats) < 2:
        return None
    first, second = run.repeat_stats[:2]
    d = np.array([math.log(second.stat(*k) / first.stat(*k)) for k in keys])
    return float(np.var(d)) / 4.0


def scatter_variance(fit, terms, keys) -> float:
    """Mean variance of the log statistics under the device's step scatter, as calibrate takes it
    (experiments.calibration.uncertainty._noise_covariance, fit.scatter set)."""
    from stepcal.experiments.calibration.uncertainty import _noise_covariance

    def log_stats(t, seed: int = 0, scattered: bool = False) -> np.ndarray:
        stats = fit.stats(t, seed, scattered)
        return np.array([math.log(stats[k]) for k in keys])
    covariance, _ = _noise_covariance(fit, terms, keys, log_stats)
    return float(np.mean(np.diag(covariance)))


def one_model(campaign: Path, model_name: str, scheduler: str) -> str:
    from stepcal.experiments.calibration.objective import OBJECTIVE, _Fit
    from stepcal.experiments.step_model_meta import read_step_model_meta
    from stepcal.experiments.step_models import resolve_step_model
    from stepcal.experiments.validation.measured import load_measured_run
    from stepcal.simulator.scatter import Scatter
    from stepcal.simulator.step_model import HostTerms
    directory = campaign / model_name / scheduler
    meta = read_step_model_meta(directory)
    calibration = meta.calibration
    run = load_measured_run(calibration["measured_run"])
    scatter = meta.scatter
    fit = _Fit(run, resolve_step_model(str(directory)).base,
               Scatter(cv=scatter["cv"], rho=scatter["rho"]) if scatter else None)
    terms, keys = HostTerms(**meta.host_terms), list(OBJECTIVE)
    boot = float(np.mean(np.diag(fit.log_covariance(keys))))
    scat = scatter_variance(fit, terms, keys) if scatter else math.nan
    reps = repeats_variance(run, keys)
    errors = fit.errors(terms)
    residual = np.array([math.log1p(errors[k]) for k in keys])
    fitted = [name for name, se in calibration.get("uncertainty", {}).get("std_err", {}).items() if se is not None]
    mean_square = float(np.sum(residual ** 2)) / max(len(keys) - len(fitted), 1)
    return (f"| {campaign.name} | {model_name} | {scheduler} | {boot:.1e} | {scat:.1e} | "
            f"{'-' if reps is None else f'{reps:.1e}'} | {mean_square / boot:.2f} | {mean_square / scat:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("campaigns", nargs="+", type=Path, help="quickstart output directories")
    args = parser.parse_args()
    print("| campaign | model | scheduler | bootstrap | scatter | repeats | residual / bootstrap | residual / scatter |")
    print("|---|---|---|---|---|---|---|---|")
    for campaign in args.campaigns:
        for model_name in MODELS:
            for scheduler in sorted(p.name for p in (campaign / model_name).iterdir() if p.is_dir()):
                print(one_model(campaign, model_name, scheduler), flush=True)


if __name__ == "__main__":
    main()
