"""Is what validation leaves once step time is right in total the *scatter* of step time?

    .venv/bin/python experiments/step_noise.py --campaign runs/quickstart [--seeds 4]

The simulator gives a batch the same time every time; on a shared CPU the same batch, run twice,
differs by 20-40%, and the difference is correlated over tens of steps (the machine's speed
wanders). Slow stretches build queues that a steady model of the same mean never sees.

1. Estimate the scatter from a run's two repeats: the batches both ran, d = log(t_1 / t_0). If each
   repeat's log step time is its batch's value plus noise x that is AR(1) with stationary standard
   deviation sigma and step-to-step correlation rho, d has standard deviation sigma * sqrt(2) and
   the same autocorrelation.
2. Re-simulate every run of a quickstart campaign with the tables rescaled to its measured total
   (validation's step-matched row): once as they are, once with that noise (sigma, rho from the
   scheduler's lowest-load run, mean-one multipliers, K seeds averaged). Errors of both are printed.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

ACF_LAG = 10        # steps: rho from the autocorrelation at this lag (lag 1 overstates slow wander)
STATS = [(metric, stat) for metric in ("ttft_ms", "tpot_ms", "e2e_ms") for stat in ("p50", "p90", "p99")]


@dataclass(frozen=True)
class StepNoise:
    sigma_log: float      # stationary standard deviation of log step time around the batch's value
    rho: float            # correlation of the noise of consecutive steps


def estimate_noise(ms_0: np.ndarray, ms_1: np.ndarray, lag: int = ACF_LAG) -> StepNoise:
    """Noise of step time from the same batches timed in two repeats, in repeat 0's order."""
    d = np.log(np.asarray(ms_1, dtype=np.float64)) - np.log(np.asarray(ms_0, dtype=np.float64))
    d = d - d.mean()   # the repeats' difference in mean speed is drift between runs, not scatter
    if len(d) <= lag + 1 or d.std() == 0:
        return StepNoise(float(d.std() / np.sqrt(2)), 0.0)
    acf = float(np.corrcoef(d[:-lag], d[lag:])[0, 1])
    rho = min(max(acf, 0.0) ** (1.0 / lag), 0.999)
    return StepNoise(float(d.std() / np.sqrt(2)), rho)


class NoisyStepModel:
    """A step model whose every step is multiplied by exp(x - sigma^2 / 2), x an AR(1) process: the
    multipliers have mean one, so the model's total is kept. Stateful: one instance per simulation,
    and the simulator must take every step one by one (SimConfig.fast_path=False)."""

    def __init__(self, base, noise: StepNoise, seed: int) -> None:
        self.base, self.noise = base, noise
        self.rng = np.random.default_rng(seed)
        self.x = noise.sigma_log * self.rng.standard_normal()

    def step_ms(self, batch) -> float:
        sigma, rho = self.noise.sigma_log, self.noise.rho
        self.x = rho * self.x + np.sqrt(1.0 - rho * rho) * sigma * self.rng.standard_normal()
        return float(self.base.step_ms(batch)) * float(np.exp(self.x - sigma * sigma / 2.0))

    def decode_run_ms(self, kv_lens, num_steps):
        raise RuntimeError("NoisyStepModel takes steps one by one: simulate with fast_path=False")


def run_errors(run, model, config, seeds: int, noise: StepNoise | None) -> list[float]:
    """Errors of the STATS, each simulated statistic averaged over the seeds when there is noise."""
    from experiments.validation import mean_over_repeats, stat_error
    from simulator.simulation import simulate
    if noise is None:
        simulated = simulate(run.trace, model, config).summary
    else:
        simulated = mean_over_repeats([simulate(run.trace, NoisyStepModel(model, noise, seed), config).summary
                                       for seed in range(seeds)])
    return [stat_error(simulated, run.summary, m, q) for m, q in STATS]


def run_noise(run) -> StepNoise | None:
    """The scatter of step time in a measured run, from the batches both its repeats ran."""
    from experiments.validation import matched_steps
    pairs = matched_steps(run)
    return None if pairs is None else estimate_noise(pairs["ms_0"].to_numpy(), pairs["ms_1"].to_numpy())


def campaign(root: Path, seeds: int) -> list[str]:
    from experiments.step_models import request_overhead_ms, resolve_step_model
    from experiments.validation import load_measured_run, rescaled_to_total, sim_config_for, step_level_error
    model = resolve_step_model(str(root / "tables"))
    header = " | ".join(f"{m.split('_')[0].upper()} {q.upper()}" for m, q in STATS)
    lines = [f"| run | sigma_log, rho (own repeats) | step model | {header} |", "|---|---|---|" + "---|" * len(STATS)]
    held_out = {"steady": [], "noisy": []}
    for sched in sorted(p for p in (root / "measured").iterdir() if p.is_dir()):
        runs = [load_measured_run(p) for p in sorted(p for p in sched.glob("load_*") if p.is_dir())]
        noises = [run_noise(run) for run in runs]
        for k, (run, own_noise) in enumerate(zip(runs, noises)):
            # the lowest load's scatter is the one simulated: the others are held out
            scaled = rescaled_to_total(model, step_level_error(model, run.steps)["total_error"])
            config = dataclasses.replace(sim_config_for(run, 0.0, request_overhead_ms(model)), fast_path=False)
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
