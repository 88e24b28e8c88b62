"""Is what validation leaves once step time is right in total the *scatter* of step time?

    .venv/bin/python studies/step_noise.py --campaign runs/quickstart [--seeds 4]

The simulator gives a batch the same time every time; on a shared CPU the same batch, run twice,
differs by 20-40%, and the difference is correlated over tens of steps (the machine's speed
wanders). Slow stretches build queues that a steady model of the same mean never sees.

1. Estimate the scatter from a run's two repeats (experiments.validation.noise): the batches both
   ran, their log ratio as an AR(1) process with stationary sigma and step-to-step correlation rho.
2. Re-simulate every run of a quickstart campaign with the tables rescaled to its measured total
   (validation's step-matched row): once as they are, once with that noise (sigma, rho from the
   scheduler's lowest-load run, mean-one multipliers, K seeds averaged). Errors of both are printed.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from stepcal.experiments.validation.noise import NoisyStepModel, StepNoise, run_noise

STATS = [(metric, stat) for metric in ("ttft_ms", "tpot_ms", "e2e_ms") for stat in ("p50", "p90", "p99")]


def run_errors(run, model, config, seeds: int, noise: StepNoise | None) -> list[float]:
    """Errors of the STATS, each simulated statistic averaged over the seeds when there is noise."""
    from stepcal.core.measured_run import RunStats
    from stepcal.experiments.validation.errors import stat_error
    from stepcal.experiments.validation.measured import mean_over_repeats
    from stepcal.simulator.simulation import simulate
    if noise is None:
        simulated = RunStats.from_summary(simulate(run.trace, model, config).summary)
    else:
        simulated = mean_over_repeats([RunStats.from_summary(
            simulate(run.trace, NoisyStepModel(model, noise, seed), config).summary) for seed in range(seeds)])
    return [stat_error(simulated, run.stats, m, q) for m, q in STATS]


def campaign(root: Path, seeds: int) -> list[str]:
    from stepcal.experiments.step_models import front_end, resolve_step_model
    from stepcal.experiments.validation.compare import rescaled_to_total
    from stepcal.experiments.validation.measured import load_measured_run, sim_config_for
    from stepcal.experiments.validation.steps import step_level_error
    model = resolve_step_model(str(root / "tables"))
    header = " | ".join(f"{m.split('_')[0].upper()} {q.upper()}" for m, q in STATS)
    lines = [f"| run | sigma_log, rho (own repeats) | step model | {header} |", "|---|---|---|" + "---|" * len(STATS)]
    held_out = {"steady": [], "noisy": []}
    for sched in sorted(p for p in (root / "measured").iterdir() if p.is_dir()):
        runs = [load_measured_run(p) for p in sorted(p for p in sched.glob("load_*") if p.is_dir())]
        noises = [run_noise(run) for run in runs]
        for k, (run, own_noise) in enumerate(zip(runs, noises)):
            # the lowest load's scatter is the one simulated: the others are held out
            scaled = rescaled_to_total(model, step_level_error(model, run.steps).total_error)
            config = dataclasses.replace(sim_config_for(run, 0.0, front_end(model)), fast_path=False)
            label = f"{sched.name} {run.path.name}" + (" (noise fitted here)" if k == 0 else "")
            own_text = f"{own_noise.sigma_log:.3f}, {own_noise.rho:.3f}" if own_noise else "-"
            for name, n in (("steady", None), ("noisy", noises[0])):
                if name == "noisy" and n is None:
                    continue
                errors = run_errors(run, scaled, config, seeds, n)
                if k > 0:
                    held_out[name].append(np.abs(errors))
                lines.append(f"| {label} | {own_text} | {name} | " + " | ".join(f"{100 * e:+.1f}%" for e in errors) + " |")
    for name, rows in held_out.items():
        if rows:
            mean = np.mean(rows, axis=0)
            lines.append(f"| held-out mean \\|error\\| | | {name} | " + " | ".join(f"{100 * e:.1f}%" for e in mean)
                         + f" | (all: {100 * np.mean(rows):.1f}%)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--campaign", type=Path, required=True, help="a quickstart output directory")
    parser.add_argument("--seeds", type=int, default=4, help="noisy simulations averaged per run (default 4)")
    args = parser.parse_args()
    if not (args.campaign / "tables").is_dir() or not (args.campaign / "measured").is_dir():
        print(f"step_noise.py: --campaign {args.campaign}: expected a quickstart directory with tables/ and measured/",
              file=sys.stderr)
        return 2
    print("\n".join(campaign(args.campaign, args.seeds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
