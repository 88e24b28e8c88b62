"""The real device behind a budgeted campaign: one point at a time through the sweep's own
PointMeasurer (profiler.sweep), its wall time measured. (The replay device's measurer is
experiments.replay.sweep.ReplayMeasurer.)"""
from __future__ import annotations

import time

from stepcal.core.schemas import SCHEMA_VERSION, TOOL_VERSION
from stepcal.profiler.fingerprint import device_name, fingerprint_id, hardware_fingerprint
from stepcal.profiler.point import Point
from stepcal.profiler.sweep import PointMeasurer, SweepConfig, utc_now


class DeviceMeasurer:
    """Times points on cpu or cuda as `stepcal profile` does, with the sweep's provenance columns."""

    def __init__(self, config: SweepConfig) -> None:
        import torch  # lazy: loads torch
        self.config = config
        self.inner = PointMeasurer(config)
        fingerprint = hardware_fingerprint(config.device, config.num_threads)
        self.provenance = {"device": config.device, "device_name": device_name(fingerprint), "dtype": config.dtype,
                           "model_spec": config.spec.name, "num_threads": config.num_threads,
                           "torch_version": torch.__version__, "tool_version": TOOL_VERSION,
                           "schema_version": SCHEMA_VERSION, "fingerprint_id": fingerprint_id(fingerprint)}

    def measure(self, point: Point, rounds: int = 1) -> tuple[dict, float, float]:
        """(row, measure_s, wall_s): the point timed `rounds` times, its samples pooled."""
        started = time.monotonic()
        row = None
        for _ in range(max(rounds, 1)):
            row = self.inner.measure_row(point, row)
        wall_s = time.monotonic() - started
        stamp = {**self.provenance, "measured_at": utc_now()}
        return {**row, **stamp}, wall_s, wall_s
