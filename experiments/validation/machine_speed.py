"""The machine's speed during a measured run against its speed while the tables' profiles were taken.

Both time the same fixed decode step (profiler.engine.measure.speed_probe_ms): a run before and
after each repeat, `stepcal profile` before and after each sweep of engine ops (kept in the tables'
meta.json as `profile_speed_probe_ms`). On a shared CPU the same batches cost up to 8% more or less
minutes later. Over the 30 held-out runs of five quickstarts on this project's shared 2-core VM, the
profiled tables' step-total error followed the probe's drift with r = -0.87, moving 0.84x as much as the
probe did, and 0.57x over the 24 runs within 15% (the probe, 0.5 s at each end of a repeat, catches
short swings the whole run averages out).
validate says so beside the errors, as a warning past 5%.
"""
from __future__ import annotations

import numpy as np

from stepcal.experiments.step_models import tables_meta

# A drift this large is the size of the validation targets (5%): validation.md says so as a warning.
DRIFT_WARNING = 0.05


def profile_probes(model) -> list | None:
    """The step model's tables' profile probes (under calibrated host terms or a rescale too); None
    for a model without them (const:, linear:, imported profiles, tables fitted before the probe)."""
    probes = tables_meta(model).profile_speed_probe_ms
    return [float(p) for p in probes] if probes else None


def speed_vs_profile(run_probes: list | None, profile_probes_ms: list | None) -> float | None:
    """The run's probe time over the profile's, less 1: +0.05 is a machine 5% slower during the run."""
    if not run_probes or not profile_probes_ms:
        return None
    return float(np.mean(run_probes)) / float(np.mean(profile_probes_ms)) - 1.0


def describe_speed(run_probes: list | None, profile_probes_ms: list | None) -> str | None:
    """validation.md's line on the machine's speed: the run's probes, and against the profile's where known."""
    if not run_probes:
        return None
    line = ("machine speed during each repeat (one fixed decode step, timed before and after it): "
            + " / ".join(f"{v:.3f}" for v in run_probes) + " ms")
    drift = speed_vs_profile(run_probes, profile_probes_ms)
    if drift is None:
        return line
    line = (f"{line}; while the tables' profiles were taken: {np.mean(profile_probes_ms):.3f} ms (mean of "
            f"{len(profile_probes_ms)} probes): the machine ran {100 * abs(drift):.1f}% "
            f"{'slower' if drift > 0 else 'faster'} during this run, and the step-time errors move with it")
    if abs(drift) < DRIFT_WARNING:
        return line
    return (f"warning: {line}; profile and measure again on a quieter machine before reading these errors "
            "as the model's")
