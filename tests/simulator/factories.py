"""Small builders of simulator inputs for tests."""
import numpy as np

from stepcal.core.trace import Trace
from stepcal.simulator.kv_cache import BlockManager
from stepcal.simulator.request import Request
from stepcal.simulator.schedulers import SchedulerConfig, make_scheduler


def make_trace(arrivals, prompts, outputs, **optional) -> Trace:
    return Trace.from_arrays(np.asarray(arrivals, dtype=float), np.asarray(prompts), np.asarray(outputs),
                             source="test", **optional)


def random_trace(n: int, seed: int = 0, rate: float = 5.0, max_prompt: int = 2000,
                 max_output: int = 300) -> Trace:
    rng = np.random.default_rng(seed)
    return make_trace(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, max_prompt, n),
                      rng.integers(1, max_output, n))


def make_request(request_id: int, prompt: int, output: int, arrival_s: float = 0.0, **kw) -> Request:
    return Request(request_id, arrival_s, prompt, output, **kw)


def make_scheduler_with_kv(name: str, num_blocks: int = 1000, block_size: int = 16, **config):
    kv = BlockManager(num_blocks, block_size)
    return make_scheduler(name, kv, SchedulerConfig(**config)), kv


def run_to_completion(scheduler, requests, step_s: float = 0.01, max_steps: int = 100000):
    """Drive a scheduler by hand: add all requests at t=0, then step. Returns the batches as
    lists of (request_id, q, s) tuples."""
    for r in requests:
        scheduler.add(r)
    now, batches = 0.0, []
    while scheduler.has_work():
        step = scheduler.schedule(now)
        assert step is not None, "scheduler stuck"
        batch = step.batch
        batches.append(list(zip(batch.request_ids, batch.q_lens.tolist(), batch.kv_lens.tolist())))
        now += step_s
        scheduler.on_step_done(step, now)
        assert len(batches) < max_steps
    return batches
