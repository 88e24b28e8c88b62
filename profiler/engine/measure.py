"""Measured runs: serve a trace R times on the engine and write them (core.measured_run's layout)."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from stepcal.core.errors import InputError
from stepcal.core.measured_run import SAME_PLACE, read_measured_run, write_measured_run
from stepcal.core.run_meta import RunMeta
from stepcal.profiler.allocator import configure_allocator
from stepcal.profiler.engine import Engine
from stepcal.profiler.engine.paged import PagedKVCache, default_read_copies
from stepcal.profiler.engine.slowdown import SlowestWindow, slowest_windows
from stepcal.profiler.fingerprint import hardware_fingerprint
from stepcal.profiler.model import build_model, default_dtype, step_inputs
from stepcal.profiler.noise_policy import NoisePolicy
from stepcal.profiler.timing import torch_threads


def warm_up(model, num_steps: int = 3) -> None:
    """A few untimed steps so the first measured step pays no allocator or kernel-selection cost:
    over a contiguous cache (the speed probe's path) and over a paged pool (the engine's)."""

    cache = model.new_cache()
    prompt = torch.arange(64) % model.spec.vocab_size
    model.forward_step([prompt], [cache], [True])
    for _ in range(num_steps):
        model.forward_step([torch.tensor([1])], [cache], [True])
    block_size = 16
    pool = PagedKVCache.for_model(model, block_size, max_blocks=8, read_copies=default_read_copies(model.device))
    blocks = list(range(8))
    for start, tokens in [(0, prompt)] + [(64 + k, torch.tensor([1])) for k in range(num_steps)]:
        kv = pool.step_kv([0], [blocks], [start], [len(tokens)])
        model.run_step(step_inputs([tokens], [start], [True], model.device, kv))


def speed_probe_ms(model, num_steps: int = NoisePolicy.speed_probe_steps, num_seqs: int = 4, kv_len: int = 128) -> float:
    """Median time of one fixed decode step, timed back to back: the machine's speed at this
    moment, recorded before and after each repeat. On a shared CPU the same batch can cost 30%
    more a few minutes later; the probe lets validation tell that drift from model error."""

    caches = [model.new_cache() for _ in range(num_seqs)]
    with torch.inference_mode():
        for cache in caches:
            cache.fill_random(kv_len)
        tokens, emit = [torch.tensor([1])] * num_seqs, [True] * num_seqs
        sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
        times_ms = []
        for k in range(num_steps + num_steps // 5):      # the first fifth warms up, untimed
            t0 = time.perf_counter()
            model.forward_step(tokens, caches, emit)
            sync()
            if k >= num_steps // 5:
                times_ms.append((time.perf_counter() - t0) * 1000.0)
            for cache in caches:
                cache.truncate(kv_len)
    return float(sorted(times_ms)[len(times_ms) // 2])


def measure_trace(trace, spec, config, out: str | Path, *, device: str = "cpu", dtype: str | None = None,
                  num_threads: int = 1, repeats: int = 1, trace_source: str,
                  on_repeat: Callable[[int, object], None] | None = None, noise: NoisePolicy | None = None,
                  on_slowed: Callable[[int, dict, str], None] | None = None) -> dict:
    """Serve `trace` `repeats` times on the engine (a ModelSpec's model with random weights from
    config.seed) and write the measured run to `out`; on_repeat(k, result) after each repeat.
    `noise` (default: `stepcal measure`'s for the device, NoisePolicy.for_device with no repeat served
    again): where it marks slowed windows, a repeat the machine slowed (profiler.engine.slowdown) is
    served again, up to noise.retry_slowed_repeats times in all (serve_slowed_again);
    on_slowed(k, window, "again") before each, and for each one kept on_slowed(k, window, "same place")
    where it was slow again in the same place, else "kept".
    Returns OUT/summary.json's content. The work of `stepcal measure` and the campaign's runs."""

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {device}: CUDA is not available on this machine")
    dtype = dtype or default_dtype(device)
    noise = noise if noise is not None else NoisePolicy.for_device(device).with_retry_slowed(0)
    allocator = configure_allocator() if noise.cpu_allocator else None
    with torch_threads(num_threads):   # restored after: the campaign runs many of these in one process
        model = build_model(spec, device=device, dtype=dtype, seed=config.seed)
        warm_up(model)
        serve = _Server(model, trace, config, noise.speed_probe_steps)
        results = [serve.repeat(k, on_repeat) for k in range(repeats)]

        def again(k: int, window: dict) -> None:
            if on_slowed is not None:
                on_slowed(k, window, "again")
            results[k] = serve.repeat(k, on_repeat)
        slowed = serve_slowed_again(lambda: results, again, noise.retry_slowed_repeats) \
            if noise.mark_slowed_windows else []
        for k in slowed:    # kept: said, and recorded in the repeat's summary
            if on_slowed is not None:
                on_slowed(k, results[k].summary["slowest_window"],
                          "same place" if results[k].summary.get(SAME_PLACE) else "kept")
    meta = engine_meta(spec, config, device=device, dtype=dtype, num_threads=num_threads, trace_source=trace_source,
                       repeats=repeats, fingerprint=hardware_fingerprint(device, num_threads), allocator=allocator)
    return write_measured_run(out, trace, results, meta)


class _Server:
    """Serves the trace once per call, with the speed probe before and after each repeat."""

    def __init__(self, model, trace, config, probe_steps: int = NoisePolicy.speed_probe_steps) -> None:
        self.model, self.trace, self.config, self.probe_steps = model, trace, config, probe_steps
        self.last_probe_ms = speed_probe_ms(model, num_steps=probe_steps)

    def repeat(self, k: int, on_repeat: Callable[[int, object], None] | None):
        result = Engine(self.model, self.trace, self.config).run()
        probe_ms = speed_probe_ms(self.model, num_steps=self.probe_steps)
        # the machine's speed during this repeat: the probes just before and just after it
        result.summary["speed_probe_ms"] = (self.last_probe_ms + probe_ms) / 2
        self.last_probe_ms = probe_ms
        if on_repeat is not None:
            on_repeat(k, result)
        return result


def serve_slowed_again(current: Callable[[], list], serve_again: Callable[[int, dict], None],
                       retries: int) -> list[int]:
    """The rule of `stepcal measure --retry-slowed` and of the campaign's runs: while a repeat is
    slowed (mark_slowest_windows), the most slowed one is served again, `retries` times in all. One
    slow again in the same place (its windows overlap) is kept and not served again: that stretch is
    the engine's own (seen in 2 of 11 quickstarts: the last request's decodes at 1.6x in all three
    serves), and serving again would only find it once more.
    current() gives the repeats as they stand (objects with steps and summary); serve_again(k, window)
    serves repeat k again, window its slowest_window record. Returns the repeats slowed after the last
    serve; those kept in the same place carry summary[SAME_PLACE] = True."""
    results, kept = current(), set()
    slowed = mark_slowest_windows(results)
    for _ in range(retries):
        left = [k for k in slowed if k not in kept]
        if not left:
            break
        k, window = left[0], results[left[0]].summary["slowest_window"]
        serve_again(k, window)
        results = current()
        slowed = mark_slowest_windows(results)
        if k in slowed and same_place(results[k].summary["slowest_window"], window):
            kept.add(k)
    for k in kept.intersection(slowed):
        results[k].summary[SAME_PLACE] = True
    return slowed


def same_place(window: dict, other: dict) -> bool:
    """Whether two slowest windows (SlowestWindow.to_dict records) share some of the run's time."""
    return SlowestWindow.from_dict(window).overlaps(SlowestWindow.from_dict(other))


def mark_slowest_windows(results: list) -> list[int]:
    """Each repeat's slowest window (against all the repeats' steps) into its summary as
    `slowest_window`; returns the repeats the machine slowed, the most slowed first: by excess over the
    other repeats at the same stretch, the rule that judged them slowed (a window slow in every repeat
    is the engine's, whatever its ratio)."""
    windows = slowest_windows([r.steps for r in results])
    for result, window in zip(results, windows):
        if result.summary is not None:
            result.summary["slowest_window"] = window.to_dict() if window is not None else None
    slowed = [k for k, w in enumerate(windows) if w is not None and w.slowed]
    return sorted(slowed, key=lambda k: -windows[k].excess)


# Settings that must agree for single-repeat runs to be one measured run's repeats.
_SAME_RUN_KEYS = ("model_spec", "device", "dtype", "num_threads", "scheduler", "scheduler_config", "block_size",
                  "kv_blocks", "clock", "seed", "prefix_caching")


def _run_setting(meta: RunMeta, key: str):
    """A setting of a measured run. Runs written before the engine cached prefixes lack
    "prefix_caching": they ran without it, whatever their scheduler (as validation reads them)."""
    if key == "prefix_caching":
        return meta.prefix_caching_on
    return getattr(meta, key)


def combine_repeats(parts: list[str | Path], out: str | Path, kept_same_place: tuple[int, ...] = (),
                    noise: NoisePolicy | None = None) -> dict:
    """One measured run from single-repeat runs of the same workload taken at different times.

    The quickstart interleaves repeats across its runs (every run's repeat 0, then every run's
    repeat 1), so that each run's repeats sample the machine's speed at different moments of
    the campaign instead of two back-to-back minutes. Writes the layout `write_measured_run`
    writes; raises InputError when the parts differ in trace or settings. `kept_same_place`: the parts
    serve_slowed_again kept, slow again in the same place, flagged so in their summary. The repeats'
    slowest windows are marked where `noise` (default: the parts' device's) marks them."""
    runs = [read_measured_run(p) for p in parts]
    first_trace = runs[0].trace.to_frame()
    for run in runs[1:]:
        differ = [k for k in _SAME_RUN_KEYS if _run_setting(run.meta, k) != _run_setting(runs[0].meta, k)]
        if differ or not run.trace.to_frame().equals(first_trace):
            raise InputError(f"{run.path}: not a repeat of {runs[0].path} (differs in {', '.join(differ) or 'trace'})")
    repeats = [repeat for run in runs for repeat in run.repeats]
    noise = noise if noise is not None else NoisePolicy.for_device(str(runs[0].meta.device or "cpu"))
    # each part was judged against its own steps alone
    slowed = mark_slowest_windows(repeats) if noise.mark_slowed_windows else []
    for k in set(kept_same_place).intersection(slowed):
        repeats[k].summary[SAME_PLACE] = True
    return write_measured_run(out, runs[0].trace, repeats, runs[0].meta.with_repeats(len(repeats)))


def engine_meta(spec, config, *, device: str, dtype: str, num_threads: int, trace_source: str,
                repeats: int, fingerprint: dict, allocator: dict | None = None) -> RunMeta:
    """The meta.json of a run the engine served: its settings, the device and the machine."""
    return RunMeta(model_spec=spec.to_dict(), device=device, dtype=dtype, num_threads=num_threads,
                   fingerprint=fingerprint, trace_source=trace_source, repeats=repeats,
                   scheduler=config.scheduler, scheduler_config=asdict(config.scheduler_config),
                   block_size=config.block_size, kv_blocks=config.kv_blocks, clock=config.clock, seed=config.seed,
                   prefix_caching=config.uses_prefix_caching, timeout_s=config.timeout_s, allocator=allocator)


__all__ = ["combine_repeats", "engine_meta", "mark_slowest_windows", "measure_trace", "serve_slowed_again",
           "speed_probe_ms", "warm_up"]
