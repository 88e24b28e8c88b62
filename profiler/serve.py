"""The profiler's `serve` op: whole steps timed while the engine serves a workload.

The `step` and `host` ops hold the engine at one batch and repeat it. Served steps are slower
than the same batches held, and in ways a held batch cannot show: on the CPU a decode step right
after a prefill step took 0.3-0.9 ms more than the decodes after it (the quickstart's runs, `tiny`,
one thread), and the engine's prefill steps took 1.10-1.14 times the held prefills of the same
size. Whole-step tables fitted on the held grid alone priced a campaign's runs 6-9% low, and its
continuous-batching TPOT 20-33% low. Serving also forms the batches a grid samples sparsely:
ragged KV lengths, several prompts in one prefill step, chunks beside decodes.

A workload is closed-loop and needs no arrival rate: num_requests requests all wait at time zero
and the scheduler keeps at most `concurrency` of them in flight (its max_num_seqs); prompt and
output lengths are log-uniform over their ranges. Its steps do not depend on the device's speed,
so a workload forms the same batches on every device and in every round, and rounds pool per step.

Each served step becomes two profile rows keyed by the workload's point key and the step's index:
op `step` (the iteration's device_ms) and op `host` (its host_ms), both named `served`, which the
profiled tables' step + host fit takes beside the held points. The workload's own row (op `serve`)
says that it ran, for resumption, with its mean step time. A grid's [serve] section names the
workloads (profiler.grid_sections.serve_workloads); the sweep writes the rows (profiler.sweep).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from stepcal.core.trace import Trace
from stepcal.simulator.schedulers import SchedulerConfig

SCHEDULERS = ("continuous", "sarathi", "vllm")
SERVED = "served"          # the name of the step and host rows a workload gives
BLOCK_SIZE = 16            # `stepcal measure`'s default KV block size
_NAME = re.compile(r"^(continuous|sarathi|vllm)(\d*)/c(\d+)/n(\d+)/p(\d+)-(\d+)/o(\d+)-(\d+)$")


@dataclass(frozen=True)
class Workload:
    """One closed-loop workload: its name (Workload.name) is the grid point's name."""
    scheduler: str
    chunk_size: int          # sarathi's prefill chunk; 0 for the others
    concurrency: int
    num_requests: int
    prompt: tuple[int, int]  # log-uniform prompt lengths, inclusive
    output: tuple[int, int]  # log-uniform output lengths, inclusive

    @property
    def name(self) -> str:
        chunk = str(self.chunk_size) if self.chunk_size else ""
        return (f"{self.scheduler}{chunk}/c{self.concurrency}/n{self.num_requests}/"
                f"p{self.prompt[0]}-{self.prompt[1]}/o{self.output[0]}-{self.output[1]}")

    @classmethod
    def parse(cls, name: str) -> Workload:
        match = _NAME.match(name)
        if match is None:
            raise ValueError(f"not a served workload's name: {name!r}")
        scheduler, chunk, *numbers = match.groups()
        c, n, p0, p1, o0, o1 = (int(x) for x in numbers)
        return cls(scheduler, int(chunk or 0), c, n, (p0, p1), (o0, o1))

    def lengths(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, output lengths), from (seed, the workload's shape)."""
        rng = np.random.default_rng([seed, self.concurrency, self.num_requests, *self.prompt, *self.output])
        return _log_uniform(rng, self.prompt, self.num_requests), _log_uniform(rng, self.output, self.num_requests)

    def max_tokens_in_flight(self) -> int:
        """An upper bound on the tokens whose K/V the engine holds at once."""
        return self.concurrency * (self.prompt[1] + self.output[1])


def _log_uniform(rng: np.random.Generator, bounds: tuple[int, int], n: int) -> np.ndarray:
    low, high = bounds
    return np.clip(np.exp(rng.uniform(np.log(low), np.log(high + 1), n)).astype(np.int64), low, high)


def serve(model, workload: Workload, seed: int):
    """Serve the workload once on the engine; its step log (with host_ms and device_ms)."""
    from stepcal.profiler.engine.engine import Engine, EngineConfig  # lazy: loads torch
    prompts, outputs = workload.lengths(seed)
    trace = Trace.from_arrays(np.zeros(len(prompts)), prompts, outputs)
    scheduler_config = SchedulerConfig(max_num_seqs=workload.concurrency,
                                       **({"chunk_size": workload.chunk_size} if workload.chunk_size else {}))
    config = EngineConfig(scheduler=workload.scheduler, scheduler_config=scheduler_config, block_size=BLOCK_SIZE,
                          prefix_caching=False, seed=seed)
    return Engine(model, trace, config).run().steps


__all__ = ["SCHEDULERS", "SERVED", "Workload", "serve"]
