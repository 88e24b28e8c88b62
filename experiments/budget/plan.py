"""The plan of a profiling campaign before any device time: per op, the points it will measure,
the device time their timed calls take and the wall time with each point's setup.

Each point's kernel time comes from the replay device's profile (`replay:PROFILE`) or from the
roofline of a GPU's datasheet (experiments.budget.roofline_time; a datasheet name, or `cuda` on a
machine whose GPU the datasheets list); its cost is what profiler.timing.measure spends on a
kernel of that time at the grid's timing policy and rounds (profiler.simulated_timing, expected
run), so a plan counts the same calls as the sweep and the replay. With a budget the campaign
spends it on each op in proportion to the op's share of the whole grid's measurement time, and
the plan gives the points that share buys at the grid's mean cost per point.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stepcal.core.errors import InputError
from stepcal.costmodel.devices import find_device, known_devices
from stepcal.experiments.budget.roofline_time import kernel_ms
from stepcal.experiments.replay.device import DEFAULT_REL_SCATTER, PREFIX, ReplayDevice
from stepcal.profiler.grid import Grid
from stepcal.profiler.simulated_timing import simulate_rounds
from stepcal.profiler.sweep import shape_columns
from stepcal.profiler.timing import TimingPolicy

# shape row -> (time_ms, rel_scatter), or why the point will not be measured
KernelTime = Callable[[dict], "tuple[float, float] | str"]


@dataclass(frozen=True)
class OpPlan:
    op: str
    num_points: int          # points measured (with a budget: expected)
    num_refused: int         # replay: shapes outside the profile, never measured
    measure_s: float         # device time of the timed calls (warm-up included)
    wall_s: float            # and each point's setup
    grid_points: int         # the grid's points of this op
    grid_measure_s: float    # the whole grid's measurement time


@dataclass(frozen=True)
class Plan:
    device: str
    time_source: str
    budget_s: float | None
    ops: tuple[OpPlan, ...]


def kernel_time_source(device: str, spec, dtype: str) -> tuple[KernelTime, str]:
    """How the plan prices a kernel on `device`, and a line saying so; InputError where it cannot."""
    if device.startswith(PREFIX):
        replay = ReplayDevice.load(device[len(PREFIX):], spec)

        def replayed(shape: dict):
            found = replay.estimate(shape, dtype)
            return found if isinstance(found, str) else (found.time_ms, found.rel_scatter)
        return replayed, f"the replayed profile {device[len(PREFIX):]} ({replay.device_name})"
    sheet = find_device(_cuda_name(device) if device.startswith("cuda") else device)
    if sheet is None:
        raise InputError(f"profile plan: --device {device}: no datasheet entry (known: {', '.join(known_devices())}) "
                         f"and no replay profile; name a datasheet device or replay:PROFILE")
    peak, bandwidth = sheet.bf16_dense_tflops * 1e12, sheet.memory_bandwidth_bytes_per_s

    def roofline(shape: dict):
        return kernel_ms(shape, dtype, peak, bandwidth), DEFAULT_REL_SCATTER
    return roofline, (f"the roofline of {sheet.title}'s datasheet ({sheet.bf16_dense_tflops:g} TFLOP/s, "
                      f"{sheet.memory_bandwidth_bytes_per_s / 1e12:g} TB/s)")


def _cuda_name(device: str) -> str | None:
    import torch  # lazy: loads torch
    if not torch.cuda.is_available():
        raise InputError(f"profile plan: --device {device}: CUDA is not available here; name the GPU's "
                         f"datasheet (one of {', '.join(known_devices())}) or replay:PROFILE")
    return torch.cuda.get_device_name(device)


def point_costs(grid: Grid, spec, price: KernelTime) -> dict[str, list]:
    """Per op, the (point, measure_s, wall_s) of every grid point priced, or (point, reason) refused."""
    policy = TimingPolicy().updated(**grid.timing)
    out: dict[str, list] = {}
    for point in grid.points:
        found = price(shape_columns(point, spec))
        if isinstance(found, str):
            out.setdefault(point.op, []).append((point, found))
            continue
        sim = simulate_rounds(found[0], found[1], policy, grid.rounds_of(point, policy.rounds))
        out.setdefault(point.op, []).append((point, sim.measure_s, sim.wall_s))
    return out


def plan_campaign(grid: Grid, spec, price: KernelTime, budget_s: float | None = None) -> tuple[OpPlan, ...]:
    """The plan per op of measuring `grid` (or a budget of it: see the module's docstring)."""
    costs = point_costs(grid, spec, price)
    totals = {op: sum(c[1] for c in items if len(c) == 3) for op, items in costs.items()}
    whole_s = sum(totals.values())
    plans = []
    for op, items in costs.items():
        priced = [c for c in items if len(c) == 3]
        refused = len(items) - len(priced)
        measure_s, wall_s, count = totals[op], sum(c[2] for c in priced), len(priced)
        if budget_s is not None and whole_s > budget_s and priced:
            share_s = budget_s * totals[op] / whole_s
            count = min(len(priced), max(1, round(share_s * len(priced) / totals[op])))
            measure_s = count * totals[op] / len(priced)
            wall_s = measure_s + count * (sum(c[2] - c[1] for c in priced) / len(priced))
        plans.append(OpPlan(op, count, refused, measure_s, wall_s, len(items), totals[op]))
    return tuple(plans)


def describe_plan(plan: Plan) -> str:
    """The table `stepcal profile plan` prints."""
    head = f"plan on {plan.device}: kernel times from {plan.time_source}"
    if plan.budget_s is not None:
        head += f"; budget {plan.budget_s:g} s of measurement"
    lines = [head, f"{'op':<14}{'points':>8}{'of grid':>9}{'refused':>9}{'measure_s':>12}{'wall_s':>10}"
                   f"{'grid measure_s':>16}"]
    for p in plan.ops:
        lines.append(f"{p.op:<14}{p.num_points:>8}{p.grid_points:>9}{p.num_refused:>9}{p.measure_s:>12.2f}"
                     f"{p.wall_s:>10.2f}{p.grid_measure_s:>16.2f}")
    total = [sum(getattr(p, f) for p in plan.ops) for f in ("num_points", "grid_points", "num_refused")]
    sums = [sum(getattr(p, f) for p in plan.ops) for f in ("measure_s", "wall_s", "grid_measure_s")]
    lines.append(f"{'total':<14}{total[0]:>8}{total[1]:>9}{total[2]:>9}{sums[0]:>12.2f}{sums[1]:>10.2f}{sums[2]:>16.2f}")
    return "\n".join(lines)
