"""Serving schedulers behind one contract (see base.SchedulerBase); SCHEDULERS maps CLI names to classes."""
from stepcal.core.errors import InputError
from stepcal.simulator.schedulers.base import (
    ItlSamples,
    ScheduledStep,
    SchedulerBase,
    SchedulerConfig,
    checked_scheduler_config,
)
from stepcal.simulator.schedulers.continuous import ContinuousScheduler
from stepcal.simulator.schedulers.sarathi import SarathiScheduler
from stepcal.simulator.schedulers.slo import SloScheduler, SloSettings
from stepcal.simulator.schedulers.static import StaticScheduler
from stepcal.simulator.schedulers.vllm import VllmScheduler

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
    "checked_scheduler_config",
    "make_scheduler",
]
