"""The event core: time order, then priority, then push order; trace arrivals before heap events at a tie."""
from dataclasses import dataclass

import pytest

from stepcal.simulator.events import ARRIVAL, STEP_DONE, WAKE, EventLoop


@dataclass
class Recorded:
    log: list
    name: str

    def fire(self, now_s: float) -> None:
        self.log.append((now_s, self.name))


def test_events_fire_by_time_then_priority_then_push_order():
    log = []
    loop = EventLoop([], lambda i, now: None)
    loop.push(2.0, WAKE, Recorded(log, "wake at 2"))
    loop.push(1.0, WAKE, Recorded(log, "wake at 1"))
    loop.push(1.0, STEP_DONE, Recorded(log, "step done at 1, pushed first"))
    loop.push(1.0, STEP_DONE, Recorded(log, "step done at 1, pushed second"))
    loop.push(1.0, ARRIVAL, Recorded(log, "kv ready at 1"))
    loop.run()
    assert [name for _, name in log] == ["kv ready at 1", "step done at 1, pushed first",
                                         "step done at 1, pushed second", "wake at 1", "wake at 2"]


def test_trace_arrivals_come_before_heap_events_at_the_same_time_and_can_push_more():
    log = []
    loop = EventLoop([0.5, 1.0, 1.0], lambda i, now: None)

    def on_arrival(i, now):
        log.append((now, f"arrival {i}"))
        if i == 0:   # handlers push events; they fire in order with the remaining arrivals
            loop.push(1.0, ARRIVAL, Recorded(log, "pushed at arrival 0"))
            assert loop.next_arrival_s() == 1.0

    loop.on_arrival = on_arrival
    loop.push(0.2, STEP_DONE, Recorded(log, "step done"))
    loop.run()
    assert log == [(0.2, "step done"), (0.5, "arrival 0"), (1.0, "arrival 1"), (1.0, "arrival 2"),
                   (1.0, "pushed at arrival 0")]
    assert loop.next_arrival_s() == float("inf")


def test_simulations_pause_the_garbage_collector_and_restore_it(monkeypatch):
    import gc

    import stepcal.simulator.simulation as simulation
    from stepcal.simulator.simulation import SimConfig, simulate
    from stepcal.simulator.step_model import ConstStepModel
    from tests.simulator.factories import make_trace
    seen = []
    log_builder = simulation.request_log
    monkeypatch.setattr(simulation, "request_log", lambda requests: seen.append(gc.isenabled()) or log_builder(requests))
    model = ConstStepModel(1.0)
    monkeypatch.setattr(model.__class__, "row_ms", lambda self, row: seen.append(gc.isenabled()) or 1.0)
    assert gc.isenabled()
    simulate(make_trace([0.0], [4], [2]), model, SimConfig(fast_path=False))
    assert seen == [False, False, False] and gc.isenabled()   # two steps, then the request log


@pytest.mark.parametrize("progress", [False, True])
def test_every_arrival_is_handled_once_in_order(progress):
    handled = []
    loop = EventLoop([0.1 * i for i in range(2500)], lambda i, now: handled.append(i))
    loop.run(progress=progress)
    assert handled == list(range(2500))
