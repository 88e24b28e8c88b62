"""The machine's speed while the fitted profiles were taken: their meta.json's speed probes.

`stepcal profile` times one fixed decode step before and after each sweep that runs the engine's
model (profiler.sweep.engine_speed_probe_ms), the same step each measured run times around its
repeats. The tables keep the probes of every profile they were fitted on, so that `validate` can
say how much faster or slower the machine ran during a run than while it was profiled: on a shared
CPU that drift moved the quickstart's step time by up to 8% between profile halves.
"""
from __future__ import annotations

from pathlib import Path

from stepcal.core.profile_meta import ProfileMeta, is_profile_dir


def profile_speed_probes(records) -> list[float]:
    """Every probe (ms) in the meta.json beside each fitted profile of ours, in file order; [] where
    none recorded one (imported profiles, op-only grids, profiles taken before the probe). A profile
    without a readable meta.json of a profile has none; one of a newer schema is refused (InputError)."""
    if not {"source", "file"} <= set(records.columns):
        return []
    probes = []
    for name in sorted(records.loc[records["source"] == "profile", "file"].dropna().astype(str).unique()):
        if is_profile_dir(Path(name).parent):
            probes += ProfileMeta.read(Path(name).parent).probes_ms()
    return probes
