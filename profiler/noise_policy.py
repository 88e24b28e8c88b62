"""How the profiler, the measured runs, the fit and the campaign handle measurement noise: one object.

Some mechanisms answer noise any device has: the machine's speed drifting between profile and runs
(the speed probe), a stretch of minutes in which the engine runs slower (the speed guard: seen on an
H200, 2.5x for a minute of a sweep), the run-to-run spread (two or more repeats per run). Others
answer this project's small shared 2-core CPU VM, where another process takes the cores for a second
or two and the speed drifts 5-30% within minutes: serving a slowed repeat again, marking its slowed
windows, leaving the slowed stretches of a profile's servings out of the fit. Their thresholds were
read off that VM's quickstarts, and on a GPU serving again costs device time a lent GPU does not
have. One more is about the CPU device itself, shared or not: glibc's allocator setting
(profiler.allocator), which only a CPU's activations go through.

`NoisePolicy.for_device(device)` gives the CPU every mechanism as it always ran; CUDA the
any-device ones, without the shared-CPU ones and the CPU allocator. `with_retry_slowed(n)` is
`stepcal measure --retry-slowed N`; `dataclasses.replace` changes any other field.

The thresholds that judge a window or a serving slowed are module constants, not fields: validate
judges a measured run's step logs again with the same ones (profiler.engine.slowdown), and a
per-run threshold would make the two disagree.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

# Two quickstarts on a 2-core VM (24 runs, 2 repeats each): clean windows reached 1.12x the other
# repeat's same stretch (1.34x their shapes' usual time, in both repeats at once); the one slowed
# repeat, 1.5x. Servings of the profile (profiler.slowed_servings) are judged by the same two.
SLOWED_RATIO = 1.25          # a window's steps over the other repeats' (servings') same stretch
SLOWED_ALONE_RATIO = 1.4     # a run of one repeat: its window over its shapes' usual time
SLOWED_WINDOW_STEPS = 32     # consecutive steps of a window
NOISE_FLOOR_REPEATS = 2      # the campaign's repeats per run: the fewest that give a noise floor


@dataclass(frozen=True)
class NoisePolicy:
    """Which noise mechanisms run, and their settings (the defaults: the CPU's, as they always ran)."""

    speed_probe_steps: int = 200
    """Any device. Decode steps of the speed probe, the fixed step timed before and after each measured
    repeat and each sweep (median of these): the device's drift between profile and runs, which
    validate tells from the model's error."""

    speed_guard: bool = True
    """Any device. Between a sweep's whole-step and host points a short probe runs; the points timed
    around one that finds the machine slow are timed again at the sweep's end (profiler.speed_guard).
    On an H200 a minute of a sweep ran 2.5x slow while the probes at its ends were normal."""

    guard_probe_steps: int = 20
    """Any device. Decode steps of one guard probe (the measured runs' probe times 200)."""

    guard_slow_factor: float = 1.5
    """Any device. A guard probe this many times the sweep's normal probe marks a slow stretch."""

    guard_probe_share: float = 0.03
    """Any device. Share of the sweep's time the guard's probes take at most: sets their spacing."""

    guard_min_every_s: float = 5.0
    """Any device. Seconds between guard probes, at least."""

    guard_wait_step_s: float = 3.0
    """Any device. Before timing slowed points again: seconds between probes while waiting."""

    guard_wait_max_s: float = 30.0
    """Any device. Before timing slowed points again: seconds to wait for the machine, at most."""

    mark_slowed_windows: bool = True
    """Shared CPU only. Each measured repeat's slowest window of SLOWED_WINDOW_STEPS steps, judged against
    the other repeats, goes into its summary.json (slowest_window), and a slowed one is named on stderr:
    another process took the cores for a second or two. Needed by retry_slowed_repeats."""

    retry_slowed_repeats: int = 2
    """Shared CPU only. Times in all a run's slowed repeats are served again (the campaign's runs;
    `stepcal measure --retry-slowed`, default 0). Costs a repeat's device time each."""

    drop_slowed_servings: bool = True
    """Shared CPU only. `stepcal fit` leaves out the stretches of a profile's served workloads that the
    machine slowed in one serving, against another serving of the same workload, drift taken out
    (profiler.slowed_servings)."""

    cpu_allocator: bool = True
    """CPU device (shared or not). Apply STEPCAL_ALLOCATOR (profiler.allocator) and record it in
    meta.json: glibc's heap holds a CPU's activations; on CUDA they live in torch's GPU allocator."""

    def __post_init__(self) -> None:
        if self.retry_slowed_repeats < 0:
            raise ValueError(f"retry_slowed_repeats must be 0 or more, got {self.retry_slowed_repeats}")
        if self.retry_slowed_repeats and not self.mark_slowed_windows:
            raise ValueError("retry_slowed_repeats needs mark_slowed_windows: a slowed repeat is found by its windows")

    @classmethod
    def for_device(cls, device: str) -> NoisePolicy:
        """cpu: every mechanism; cuda (cuda:N): the any-device ones only (the shared-CPU ones and the
        CPU allocator off)."""
        if str(device).startswith("cuda"):
            return cls(mark_slowed_windows=False, retry_slowed_repeats=0, drop_slowed_servings=False,
                       cpu_allocator=False)
        return cls()

    def with_retry_slowed(self, retries: int) -> NoisePolicy:
        """Serve slowed repeats again `retries` times in all (`--retry-slowed N`); N > 0 marks the
        windows too, which finding them needs."""
        return replace(self, retry_slowed_repeats=retries, mark_slowed_windows=self.mark_slowed_windows or retries > 0)

    def guard_every_s(self, start_probe_ms: float) -> float:
        """Seconds between guard probes for a machine whose start probe took `start_probe_ms` a step: 5 s
        for the tiny model on a CPU (a probe there takes about 0.1 s), about 20 s on an H200 (0.6 s)."""
        probe_s = self.guard_probe_steps * 1.2 * start_probe_ms / 1000.0   # the untimed warm-up fifth included
        return max(self.guard_min_every_s, probe_s / self.guard_probe_share)


__all__ = ["NOISE_FLOOR_REPEATS", "SLOWED_ALONE_RATIO", "SLOWED_RATIO", "SLOWED_WINDOW_STEPS", "NoisePolicy"]
