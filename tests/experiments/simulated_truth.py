"""A measured run's workload served by the simulator as its truth (calibration's tests):
`from tests.experiments.simulated_truth import served_as`."""
from dataclasses import replace

from stepcal.core.measured_run import RunStats


def served_as(measured, simulated):
    """`measured` (a MeasuredRun) with the simulation's statistics, request log and batches in place of
    the engine's: the engine's batches come from its virtual clock, so their mix moves with the
    machine's speed, and a test fitted to them would too."""
    return replace(measured, stats=RunStats.from_summary(simulated.summary), requests=simulated.requests,
                   steps=simulated.steps.assign(repeat=0))
