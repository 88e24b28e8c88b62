"""Run a deployment at a given request rate: the base trace's arrivals rescaled, then simulated."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from stepcal.core.trace import Trace
from stepcal.core.workload import rescale_rate
from stepcal.simulator.disaggregation import DisaggSimulation
from stepcal.simulator.simulation import Simulation


@dataclass
class RateEvaluator:
    """`evaluator(rate_rps)` → the summary of `simulate_trace` on the trace rescaled to that mean rate.

    Rescaling keeps the order and relative gaps of arrivals (so the burstiness) and the lengths,
    so every rate sees the same requests. Summaries are cached by rate.
    """
    base_trace: Trace
    simulate_trace: Callable[[Trace], dict]
    cache: dict[float, dict] = field(default_factory=dict)

    def __call__(self, rate_rps: float) -> dict:
        if rate_rps not in self.cache:
            self.cache[rate_rps] = self.simulate_trace(rescale_rate(self.base_trace, rate_rps))
        return self.cache[rate_rps]


def aggregated(step_model, config) -> Callable[[Trace], dict]:
    """Simulate with simulator.simulation (every replica does prefill and decode)."""
    config = replace(config, record_batches=False)

    def simulate_trace(trace: Trace) -> dict:
        return Simulation(trace, step_model, config).run().summary
    return simulate_trace


def disaggregated(prefill_model, decode_model, config) -> Callable[[Trace], dict]:
    """Simulate with simulator.disaggregation (separate prefill and decode pools)."""
    config = replace(config, record_batches=False)

    def simulate_trace(trace: Trace) -> dict:
        return DisaggSimulation(trace, prefill_model, decode_model, config).run().summary
    return simulate_trace
