"""One replica driven by the event loop: its KV cache, scheduler and step log, and the step in flight.

Every simulation (aggregated, or the two pools of a disaggregated one) runs its replicas through this
driver. A step's time comes from the replica's StepTimeModel plus the per-step host overhead. A run
of identical decode-only steps is advanced in one move (`plan_runs`): it is cut at the owner's
horizon when planned (the next trace arrival), or later by `cut_run` (a KV cache landing), and
either way the logs are the same as stepping one by one.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from stepcal.core.batch import StepFeatures, feature_row
from stepcal.core.step_log import StepLogBuilder
from stepcal.simulator.events import STEP_DONE, WAKE, EventLoop
from stepcal.simulator.prefix_cache import make_block_manager
from stepcal.simulator.request import Request, Status
from stepcal.simulator.scatter import ScatterSeries
from stepcal.simulator.schedulers import ScheduledStep, SchedulerConfig, make_scheduler
from stepcal.simulator.spec_decode import verify_feature_row
from stepcal.simulator.step_model import FeatureStepModel


@dataclass(slots=True, eq=False)
class InFlight:
    """The step (or decode run) a replica is running; as an event, it fires when it ends."""
    replica: Replica
    step: ScheduledStep
    start_s: float
    durations_ms: np.ndarray | float      # one step's duration, or each step's of a run
    row: tuple | None = None              # one step: its feature_row()
    ends_s: np.ndarray | None = None      # a run: start then each step's end (len = steps + 1)
    features: StepFeatures | None = None  # a run: its steps' features when the model needed them

    @property
    def is_run(self) -> bool:
        return self.ends_s is not None

    def fire(self, now_s: float) -> None:
        if self.replica.in_flight is self:   # else a cut run replaced it
            self.replica.finish_step(now_s)


@dataclass(slots=True, eq=False)
class Wake:
    replica: Replica

    def fire(self, now_s: float) -> None:
        replica = self.replica
        replica.wake_pending = False
        if not replica.busy:
            replica.start_step(now_s)


@dataclass
class ReplicaSettings:
    scheduler: str
    scheduler_config: SchedulerConfig
    num_blocks: int
    block_size: int
    step_overhead_ms: float = 0.0
    record_batches: bool = True
    prefix_caching: bool = False
    scatter: object = None                # simulator.scatter.Scatter: step-to-step scatter of step time
    scatter_seed: int = 0


class Replica:
    """Hooks let the owner see steps start (`on_step_start(step, now_s)`), requests finish
    (`on_finished(requests, now_s)`), and bound decode runs (`run_horizon()`: the time of the next
    event that could change this replica's schedule, and whether the step in flight then may stay
    in the run)."""

    def __init__(self, loop: EventLoop, index: int, settings: ReplicaSettings, model, *,
                 plan_runs: bool = True, pool: str | None = None,
                 on_step_start: Callable[[ScheduledStep, float], None] | None = None,
                 on_finished: Callable[[list[Request], float], None] | None = None,
                 run_horizon: Callable[[], tuple[float, bool]] | None = None) -> None:
        self.loop, self.index, self.pool, self.model = loop, index, pool, model
        self.kv = make_block_manager(settings.num_blocks, settings.block_size, settings.prefix_caching)
        self.scheduler = make_scheduler(settings.scheduler, self.kv, settings.scheduler_config)
        self.log = StepLogBuilder(index, settings.record_batches)
        self.step_overhead_ms = settings.step_overhead_ms
        self.plan_runs = plan_runs
        self.on_step_start, self.on_finished, self.run_horizon = on_step_start, on_finished, run_horizon
        self.is_feature_model = isinstance(model, FeatureStepModel)
        self.busy = False
        self.wake_pending = False
        self.in_flight: InFlight | None = None
        self.pending_aborts: list[Request] = []   # timed out while in the step in flight
        self.num_steps_done = 0
        self.scatter = None                       # the factors of this replica's steps, by step number
        if settings.scatter is not None and not settings.scatter.is_zero:
            self.scatter = ScatterSeries(settings.scatter, settings.scatter_seed, index)

    def abort(self, request: Request, now_s: float) -> None:
        """The client gave up at now_s: a decode run is cut there (the queue changes), and the request
        leaves now, or when the step in flight that carries it ends."""
        self.cut_run(now_s)
        run = self.in_flight
        if run is not None and any(r is request for r in run.step.requests):
            self.pending_aborts.append(request)
        else:
            self.scheduler.abort(request)

    def add(self, request: Request, now_s: float) -> None:
        """A request joins this replica's queue; an idle replica wakes up (after the other events at now_s)."""
        request.replica = self.index
        self.scheduler.add(request)
        if not self.busy and not self.wake_pending:
            self.wake_pending = True
            self.loop.push(now_s, WAKE, Wake(self))

    # -- steps -----------------------------------------------------------------------------------
    def start_step(self, now_s: float) -> None:
        step = self.scheduler.schedule(now_s)
        self.busy = step is not None
        if step is None:
            return
        if self.on_step_start is not None:
            self.on_step_start(step, now_s)
        if self.plan_runs and step.is_pure_decode:
            num_steps = self.scheduler.decode_run_length(step)
            if num_steps > 1 and self._start_run(step, now_s, num_steps):
                return
        batch = step.batch
        if step.draft_lens is None:
            row = feature_row(batch.q_lens, batch.kv_lens)
        else:   # verified drafts are decode tokens, not a prefill chunk
            row = verify_feature_row(batch.q_lens, batch.kv_lens, step.draft_lens)
        duration_ms = self.model.row_ms(row) if self.is_feature_model else float(self.model.step_ms(batch))
        if self.scatter is not None:
            duration_ms = duration_ms * float(self.scatter.take(self.num_steps_done, 1)[0])
        duration_ms = duration_ms + self.step_overhead_ms
        self.in_flight = InFlight(self, step, now_s, duration_ms, row)   # positional: this runs every step
        self.loop.push(now_s + duration_ms / 1000.0, STEP_DONE, self.in_flight)

    def _start_run(self, step: ScheduledStep, now_s: float, num_steps: int) -> bool:
        """Advance up to num_steps decode steps in one move, up to the horizon; False if fewer than 2 fit."""
        kv_lens = step.batch.kv_lens
        features = None
        if self.is_feature_model:
            features = StepFeatures.decode_run(kv_lens, num_steps)
            durations_ms = self.model.features_ms(features)
        else:
            durations_ms = np.asarray(self.model.decode_run_ms(kv_lens, num_steps), dtype=np.float64)
        if self.scatter is not None:
            durations_ms = durations_ms * self.scatter.take(self.num_steps_done, num_steps)
        durations_ms = durations_ms + self.step_overhead_ms
        ends_s = np.cumsum(np.concatenate(([now_s], durations_ms / 1000.0)))   # sequential: same bits as one by one
        if self.run_horizon is not None:
            horizon_s, keep_step_in_flight = self.run_horizon()
            # Steps ending strictly before the horizon; an end tied with it is handled after the event there.
            num_before = int(np.searchsorted(ends_s[1:], horizon_s, side="left"))
            num_steps = min(num_steps, num_before + (1 if keep_step_in_flight else 0))
            if num_steps < 2:
                return False
        self.in_flight = InFlight(self, step, now_s, durations_ms[:num_steps], ends_s=ends_s[: num_steps + 1],
                                  features=features)
        self.loop.push(float(ends_s[num_steps]), STEP_DONE, self.in_flight)
        return True

    def cut_run(self, now_s: float) -> None:
        """Keep the planned steps that end before `now_s` and the one in flight at `now_s`; drop the rest.

        Step by step, the scheduler would see a request added at `now_s` at the first step start at or
        after it: the end of the step in flight (an end tied with `now_s` comes after the event)."""
        run = self.in_flight
        if run is None or not run.is_run:
            return
        keep = int(np.searchsorted(run.ends_s[1:], now_s, side="left")) + 1
        if keep >= len(run.durations_ms):
            return
        # A new event for the shorter run; the planned one finds itself replaced when it fires.
        self.in_flight = replace(run, ends_s=run.ends_s[: keep + 1], durations_ms=run.durations_ms[:keep])
        self.loop.push(float(run.ends_s[keep]), STEP_DONE, self.in_flight)

    def finish_step(self, now_s: float) -> None:
        run, self.in_flight = self.in_flight, None
        step, batch = run.step, run.step.batch
        if run.ends_s is not None:   # a decode run
            num_steps = len(run.durations_ms)
            self.num_steps_done += num_steps
            features = (run.features.head(num_steps) if run.features is not None
                        else StepFeatures.decode_run(batch.kv_lens, num_steps))
            self.log.add_steps(run.ends_s[:-1], run.durations_ms, features, batch.request_ids, batch.q_lens,
                               batch.kv_lens)
            finished = self.scheduler.on_decode_run_done(step, run.ends_s)
        else:
            self.num_steps_done += 1
            self.log.add_step(run.start_s, run.durations_ms, run.row, batch.request_ids, batch.q_lens, batch.kv_lens)
            finished = self.scheduler.on_step_done(step, now_s)
        if self.pending_aborts:
            finished = self._apply_aborts(finished)
        if finished and self.on_finished is not None:
            self.on_finished(finished, now_s)
        self.start_step(now_s)

    def _apply_aborts(self, finished: list[Request]) -> list[Request]:
        """Requests that timed out during the step just done: one that finished in it answered after
        its client left, so it counts as timed out; the others leave the scheduler now."""
        aborted, self.pending_aborts = self.pending_aborts, []
        late = set()
        for request in aborted:
            if request.status is Status.FINISHED:
                request.give_up()
                late.add(id(request))
            elif request.status is not Status.ABORTED:
                self.scheduler.abort(request)
        return [r for r in finished if id(r) not in late] if late else finished


def steps_table(replicas: list[Replica], with_pool: bool = False):
    """Every replica's step log in one Arrow table (with a `pool` column for disaggregated runs)."""
    import pyarrow as pa  # lazy: loads pyarrow
    tables = [r.log.to_table() for r in replicas]
    if with_pool:
        tables = [t.append_column("pool", pa.array([r.pool] * len(t), pa.string()))
                  for t, r in zip(tables, replicas)]
    return pa.concat_tables(tables)


def itl_arrays(replicas: list[Replica]) -> tuple[np.ndarray, np.ndarray]:
    """Inter-token latency samples (values in s, weights) of these replicas' schedulers."""
    itl = [r.scheduler.itl.arrays() for r in replicas]
    return np.concatenate([v for v, _ in itl]), np.concatenate([w for _, w in itl])
