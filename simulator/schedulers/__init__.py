"""Serving schedulers behind one contract (see base.SchedulerBase); SCHEDULERS maps CLI names to classes."""
from simulator.errors import InputError
from simulator.schedulers.base import ItlSamples, ScheduledStep, SchedulerBase, SchedulerConfig
from simulator.schedulers.continuous import ContinuousScheduler
from simulator.schedulers.sarathi import SarathiScheduler
from simulator.schedulers.slo import SloScheduler, SloSettings
from simulator.schedulers.static import StaticScheduler
from simulator.schedulers.vllm import VllmScheduler

SCHEDULERS = {
    "static": StaticScheduler,
    "continuous": ContinuousScheduler,
    "vllm": VllmScheduler,
    "sarathi": SarathiScheduler,
    "slo": SloScheduler,
}


def make_scheduler(name: str, block_manager, config: SchedulerConfig | None = None) -> SchedulerBase:
    if name not in SCHEDULERS:
        raise InputError(f"--scheduler: unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name](block_manager, config)


__all__ = [
    "SCHEDULERS",
    "ContinuousScheduler",
    "ItlSamples",
    "SarathiScheduler",
    "ScheduledStep",
    "SchedulerBase",
    "SchedulerConfig",
    "SloScheduler",
    "SloSettings",
    "StaticScheduler",
    "VllmScheduler",
    "make_scheduler",
]
