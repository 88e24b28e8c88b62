"""A resumable sweep: measure every grid point not yet in the profile directory.

Rows are flushed in small atomic part files (every few points or seconds), so a run killed at
any moment, SIGKILL included, resumes where it stopped when started again with the same
arguments. A point that fails (out of memory, an unsupported shape) is recorded with its reason
and the sweep goes on.
"""
from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from stepcal.core.batch import batch_row
from stepcal.core.errors import InputError
from stepcal.core.model_spec import ModelSpec
from stepcal.core.profile_meta import ProfileMeta
from stepcal.core.schemas import SCHEMA_VERSION, TOOL_VERSION
from stepcal.profiler.allocator import configure_allocator
from stepcal.profiler.fingerprint import (
    available_bytes,
    cpu_l2_bytes,
    device_name,
    fingerprint_id,
    hardware_fingerprint,
)
from stepcal.profiler.grid import Grid
from stepcal.profiler.noise_policy import NoisePolicy
from stepcal.profiler.point import Point
from stepcal.profiler.serve import SERVED, Workload, serve
from stepcal.profiler.speed_guard import SpeedGuard
from stepcal.profiler.store import ProfileDir
from stepcal.profiler.timing import (
    CpuTimer,
    CudaTimer,
    HostTimer,
    Measurement,
    SelfTimer,
    TimingPolicy,
    cuda_graph_run,
    measure,
    summarize,
    torch_threads,
)

FLUSH_POINTS = 8        # rows per part file at most
FLUSH_S = 2.0           # and at least this often
MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class SweepConfig:
    spec: ModelSpec
    device: str
    dtype: str
    ops: tuple[str, ...]
    grid: Grid
    num_threads: int = 1
    shard: tuple[int, int] = (0, 1)
    seed: int = 0
    noise: NoisePolicy | None = None   # None: NoisePolicy.for_device(device); not part of the identity

    @property
    def noise_policy(self) -> NoisePolicy:
        return self.noise if self.noise is not None else NoisePolicy.for_device(self.device)

    def identity(self) -> dict:
        """What must match for a run to resume (or merge with) another."""
        return {"model_spec": self.spec.to_dict(), "device": self.device, "dtype": self.dtype,
                "ops": list(self.ops), "grid_fingerprint": self.grid.fingerprint,
                "num_threads": self.num_threads, "seed": self.seed}

    @property
    def policy(self) -> TimingPolicy:
        try:
            return TimingPolicy().updated(**self.grid.timing)
        except ValueError as exc:
            raise InputError(f"{self.grid.name}: [timing]: {exc}") from None

    def points(self) -> tuple[Point, ...]:
        return self.grid.shard(*self.shard)


@dataclass(frozen=True)
class SweepResult:
    out: Path
    num_points: int          # in this shard
    num_done_before: int     # points with every round done before this run
    num_measured: int        # measurements this run (a point once per round)
    num_failed: int          # in the directory, after this run
    complete: bool
    elapsed_s: float
    rounds: int = 1
    num_reused: int = 0      # measurements (point x round) done before this run, whole points or not


def run_sweep(config: SweepConfig, out: str | Path, *, max_minutes: float | None = None,
              retry_failed: bool = False, progress: bool = True, timer_factory=None,
              clock: Callable[[], float] = time.monotonic) -> SweepResult:
    """Measure the missing points (and missing rounds) of the grid into `out`, with torch's thread
    count set to the config's for the sweep and restored after it."""
    started = clock()
    _check_device(config.device)
    allocator = configure_allocator() if config.noise_policy.cpu_allocator else None
    with torch_threads(config.num_threads):
        return _run_sweep(config, Path(out), started, max_minutes, retry_failed, progress, timer_factory, clock,
                          allocator)


def _run_sweep(config: SweepConfig, out: Path, started: float, max_minutes, retry_failed, progress,
               timer_factory, clock, allocator: dict | None) -> SweepResult:
    import torch  # lazy: loads torch


    points = config.points()
    rounds = config.policy.rounds
    pdir = ProfileDir(out)
    check_profile_meta(pdir, config)      # before the lock and parts/ exist: a refused directory stays as it was
    with pdir:
        meta = check_profile_meta(pdir, config)
        fingerprint = hardware_fingerprint(config.device, config.num_threads)
        frame, _ = pdir.read_rows()
        previous = _previous_rows(frame, retry_failed)
        wanted = {p.key: config.grid.rounds_of(p, rounds) for p in points}
        done = {p.key: _rounds_done(previous.get(p.key), wanted[p.key]) for p in points}
        # Round r measures every point with r rounds done: pass after pass over the grid.
        tasks = [p for r in range(rounds) for p in points if done[p.key] <= r < wanted[p.key]]
        meta = meta.started(hardware=fingerprint, fingerprint_id=fingerprint_id(fingerprint), allocator=allocator,
                            started_at=utc_now())
        pdir.write_meta(meta)
        provenance = {
            "device": config.device, "device_name": device_name(fingerprint), "dtype": config.dtype,
            "model_spec": config.spec.name, "num_threads": config.num_threads,
            "torch_version": torch.__version__, "tool_version": TOOL_VERSION,
            "schema_version": SCHEMA_VERSION, "fingerprint_id": fingerprint_id(fingerprint)}
        measurer = PointMeasurer(config, timer_factory)
        noise = config.noise_policy
        start_probe_ms = engine_speed_probe_ms(tasks, measurer.ctx, noise.speed_probe_steps)
        guard = speed_guard(measurer, start_probe_ms, clock, noise)
        measured, measured_again = _measure_all(tasks, previous, measurer, pdir, provenance,
                                                sum(min(n, wanted[k]) for k, n in done.items()),
                                                sum(wanted.values()), started, max_minutes, progress, clock, guard)
        # each sweep's pair of probes, a resumed one's after the earlier ones
        probes_ms = [] if start_probe_ms is None else [start_probe_ms, engine_speed_probe_ms(tasks, measurer.ctx,
                                                                                            noise.speed_probe_steps)]
        meta = meta.with_speed(probes_ms, guard.record(measured_again) if guard is not None and guard.probes_ms
                               else None)
        frame = pdir.compact([p.key for p in config.grid.points])
        in_shard = frame[frame["point_key"].isin(done)]
        finished = in_shard["rounds"].fillna(0).ge(in_shard["point_key"].map(wanted)) | in_shard["status"].eq("failed")
        complete = len(in_shard) == len(points) and bool(finished.all())
        num_failed = int((in_shard["status"] == "failed").sum())
        meta = meta.finished(complete=complete, finished_at=utc_now(), num_points=len(points),
                             num_done=int(finished.sum()), num_failed=num_failed)
        pdir.write_meta(meta)
    num_done_before = sum(1 for k, n in done.items() if n >= wanted[k])
    # A resumed sweep may stop mid-pass: points with some rounds done count as measurements reused.
    num_reused = sum(min(n, wanted[k]) for k, n in done.items())
    return SweepResult(out, len(points), num_done_before, measured, num_failed,
                       complete, clock() - started, rounds, num_reused)


ENGINE_OPS = frozenset({"step", "host", "serve"})   # the ops that run the engine's own model


def engine_speed_probe_ms(tasks, ctx, num_steps: int = NoisePolicy.speed_probe_steps) -> float | None:
    """The machine's speed now, when the sweep times the engine (step, host or serve points): the
    fixed decode step each measured run times before and after its repeats
    (profiler.engine.measure.speed_probe_ms), on the profile's own model. meta.json keeps one before
    and one after each sweep; `fit` carries them into the tables and `validate` compares a run's
    probes with them, telling the machine's drift between profile and run from the model's error."""
    if not any(p.op in ENGINE_OPS for p in tasks):
        return None
    from stepcal.profiler.engine.measure import speed_probe_ms, warm_up  # lazy: loads torch
    model = ctx.model()
    warm_up(model)
    return speed_probe_ms(model, num_steps=num_steps)


def speed_guard(measurer, start_probe_ms: float | None, clock, noise: NoisePolicy) -> SpeedGuard | None:
    """The sweep's guard against slow stretches (profiler.speed_guard), where it times the engine and
    the policy runs one."""
    if start_probe_ms is None or not noise.speed_guard:
        return None
    from stepcal.profiler.engine.measure import speed_probe_ms  # lazy: loads torch
    return SpeedGuard.for_policy(noise, lambda: speed_probe_ms(measurer.ctx.model(), num_steps=noise.guard_probe_steps),
                                 clock, start_probe_ms)


def _faster(row: dict, other: dict) -> bool:
    """Whether `row` is an ok row timed faster than `other` (or `other` failed)."""
    if row.get("status") != "ok":
        return False
    return other.get("status") != "ok" or float(row["time_ms"]) < float(other["time_ms"])


def _previous_rows(frame, retry_failed: bool) -> dict[str, dict]:
    if retry_failed:
        frame = frame[frame["status"] == "ok"]
    return {row["point_key"]: row for row in frame.to_dict("records")}


def _rounds_done(row: dict | None, rounds: int) -> int:
    """Rounds a point has; a failed point counts as done (--retry-failed drops it beforehand)."""
    if row is None:
        return 0
    if row["status"] != "ok":
        return rounds
    return _rounds_of(row)


def _rounds_of(row: dict) -> int:
    """Rounds pooled in an ok row (rows written without the column count as one)."""
    value = row.get("rounds")
    return 1 if value is None or pd.isna(value) else int(value)


def _measure_all(tasks, previous, measurer, pdir, provenance, num_done, total, started,
                 max_minutes, progress, clock, guard=None) -> tuple[int, list[str]]:
    """Every task, then the engine points `guard` (profiler.speed_guard) found a slow stretch in,
    once more each; returns the points measured and the keys measured again."""
    budget_s = None if max_minutes is None else max_minutes * 60.0
    pending: list[dict] = []
    last_flush, measured, again, measured_again = clock(), 0, [], []
    bar = tqdm(total=total, initial=num_done, unit="pt", desc="profile", disable=not progress,
               dynamic_ncols=True, mininterval=0.5)

    def out_of_time() -> bool:
        if budget_s is not None and clock() - started >= budget_s:
            bar.write(f"stepcal profile: --max-minutes {max_minutes:g} reached; run the same command again to resume")
            return True
        return False

    def measure(point, earlier: dict) -> None:
        nonlocal last_flush
        bar.set_postfix_str(f"{point.op}/{point.name}", refresh=False)
        stamp = {**provenance, "measured_at": utc_now()}
        rows = [{**row, **stamp} for row in measurer.measure_rows(point, earlier)]
        previous.update((row["point_key"], row) for row in rows)
        pending.extend(rows)
        if len(pending) >= FLUSH_POINTS or clock() - last_flush >= FLUSH_S:
            pdir.append(pending)
            pending.clear()
            last_flush = clock()
    try:
        for point in tasks:
            if out_of_time():
                break
            before = previous.get(point.key)
            measure(point, previous)
            measured += 1
            bar.update(1)
            again += guard.after(point, (before, previous[point.key])) if guard is not None else []
        else:
            again += guard.finish() if guard is not None else []
        if again and not out_of_time():   # the wait stays within --max-minutes
            guard.wait_recovered(max_s=float("inf") if budget_s is None else budget_s - (clock() - started))
        for point, (before, slowed) in again:   # timed again, pooled with the row before the slowed round
            if previous[point.key] is not slowed:   # timed in a later round since: pooled, outvoted
                continue
            if out_of_time():
                break
            measure(point, {} if before is None else {point.key: before})
            if _faster(slowed, previous[point.key]):   # the machine was no faster the second time
                previous[point.key] = slowed
                pending.append(slowed)
            measured_again.append(point.key)
    finally:
        # Also on Ctrl-C: what was measured is kept.
        pdir.append(pending)
        bar.close()
    return measured, measured_again


class PointMeasurer:
    """Builds and times one point at a time; failures become rows with a reason."""

    def __init__(self, config: SweepConfig, timer_factory=None) -> None:
        from stepcal.profiler.op_context import OpContext  # lazy: loads torch
        self.config = config
        self.policy = config.policy.for_round()
        self.ctx = OpContext(config.spec, config.device, config.dtype, seed=config.seed,
                             rotate_bytes=_rotate_bytes(config.device))
        self.timer_factory = timer_factory or default_timer

    def measure_rows(self, point: Point, previous: dict) -> list[dict]:
        """One round of a point: its row, and for a served workload its steps' rows too
        (profiler.serve); `previous` holds every row so far by key, for pooling rounds."""
        if point.op != "serve":
            return [self.measure_row(point, previous.get(point.key))]
        served = []
        row = self.measure_row(point, previous.get(point.key), lambda: self._serve(point, served))
        if not served:     # this round failed: the row says why
            return [row]
        head = {k: row[k] for k in ("num_heads", "num_kv_heads", "head_dim")}
        return [row, *served_rows(point.key, served[0], previous, head)]

    def measure_row(self, point: Point, previous: dict | None = None, measure=None) -> dict:
        """One round of a point (`measure()`, by default timing its kernel); its samples pooled with
        those of the earlier rounds in `previous`."""
        row = shape_columns(point, self.config.spec)
        error, oom = None, False
        try:
            measurement = measure() if measure is not None else self._measure(point)
        except Exception as exc:   # any failure of one point is recorded; the sweep goes on
            oom = _is_oom(exc)
            error = ("out of memory: " if oom else f"{type(exc).__name__}: ") + _first_line(exc)
        earlier = previous if previous is not None and previous.get("status") == "ok" else None
        if error is not None:
            if oom:
                _free_memory(self.config.device)
            if earlier is not None:       # keep the rounds that worked; say why this one did not
                return {**earlier, "rounds": _rounds_of(earlier) + 1,
                        "error": error[:MAX_ERROR_CHARS]}
            return {**row, "status": "failed", "error": error[:MAX_ERROR_CHARS]}
        rounds = 1
        if earlier is not None and earlier.get("samples_ms") is not None:
            samples = list(earlier["samples_ms"]) + list(measurement.samples_ms)
            measurement = summarize(samples, measurement.inner_repeats, measurement.stopped_by)
            rounds = _rounds_of(earlier) + 1
        return {**row, **timing_columns(measurement), "rounds": rounds, "status": "ok", "error": None}

    def _check_memory(self, point: Point) -> None:
        from stepcal.profiler.ops import estimate_bytes  # lazy: loads torch
        need, free = estimate_bytes(point, self.ctx), available_bytes(self.config.device)
        if free is not None and need > 0.9 * free:
            raise MemoryError(f"needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB available")

    def _serve(self, point: Point, served: list) -> Measurement:
        """Serve the point's workload once; its step log goes into `served`, its mean step time is
        the point's sample."""
        self._check_memory(point)
        steps = serve(self.ctx.model(), Workload.parse(point.name), self.config.seed)
        served.append(steps)
        return summarize([float(steps["duration_ms"].mean())], 1, SERVED)

    def _measure(self, point: Point) -> Measurement:
        from stepcal.profiler.ops import build_kernel  # lazy: loads torch
        self._check_memory(point)
        kernel = build_kernel(point, self.ctx)
        timer = self.timer_factory(self.config.device, kernel)
        graph = _graph_capture if (kernel.graph_safe and self.config.device.startswith("cuda")) else None
        return measure(kernel.run, timer, self.policy, graph=graph)


def default_timer(device: str, kernel):
    if kernel.self_timed:
        return SelfTimer()
    if not device.startswith("cuda"):
        return CpuTimer()
    if kernel.host_side:
        import torch  # lazy: loads torch
        return HostTimer(torch.cuda.synchronize)
    return CudaTimer()


def _graph_capture(run, num_calls: int):
    """A CUDA graph of num_calls calls, or the eager run when capture is not possible."""
    try:
        return cuda_graph_run(run, num_calls)
    except Exception:   # some kernels cannot be captured: time them eagerly
        import torch  # lazy: loads torch
        torch.cuda.synchronize()
        return _Repeat(run, num_calls)


class _Repeat:
    """num_calls eager calls as one 'replay', so measure() divides the same way as for a graph."""

    def __init__(self, run, num_calls: int) -> None:
        self.run, self.num_calls, self.call = run, num_calls, 0

    def __call__(self, _call: int) -> None:
        for _ in range(self.num_calls):
            self.run(self.call)
            self.call += 1


def shape_columns(point: Point, spec: ModelSpec) -> dict:
    row = {"point_key": point.key, "op": point.op, "name": point.name,
           "num_heads": spec.num_heads, "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim}
    if point.op == "gemm":
        return {**row, "m": point.m, "n": point.n, "k": point.k, "num_tokens": point.m}
    if point.op == "moe":
        return {**row, "num_tokens": point.m, **moe_shape_columns(spec)}
    if point.op == "elementwise":   # num_tokens: the rows (tokens, or sequences for sample and kv_store)
        return {**row, "num_tokens": point.m, "width": spec.elementwise_widths()[point.name], "tp": 1}
    if point.op == "serve":         # a workload: num_seqs is its concurrency
        return {**row, "num_seqs": point.m}
    return {**row, "q_lens": list(point.q_lens), "kv_lens": list(point.kv_lens),
            **batch_row(point.q_lens, point.kv_lens)}


def moe_shape_columns(spec: ModelSpec) -> dict:
    """The expert shape of a moe row, named as costmodel.records names it; the profiler times the
    whole layer on one device (tp = ep = 1). The profile table keeps these columns once
    profiler.store lists them; until then the importer reads them from meta.json's model spec."""
    return {"width": spec.hidden_size, "expert_ffn_size": spec.expert_ffn_size,
            "num_experts": spec.num_experts, "experts_per_token": spec.experts_per_token,
            "tp": 1, "ep": 1}


def served_rows(point_key: str, steps, previous: dict, head: dict) -> list[dict]:
    """Two rows per served step (profiler.serve): its device part as op `step`, its host part as op
    `host`, each pooled with the row of the same key from earlier rounds where that row holds the
    same batch (a workload forms the same batches every round)."""
    rows = []
    for i, step in enumerate(steps.itertuples(index=False)):
        q_lens, kv_lens = [int(q) for q in step.q_lens], [int(s) for s in step.kv_lens]
        shape = {**head, "q_lens": q_lens, "kv_lens": kv_lens, **batch_row(q_lens, kv_lens), "name": SERVED}
        for op, ms in (("step", step.device_ms), ("host", step.host_ms)):
            key = f"{point_key}/{i:05d}/{op}"
            earlier = previous.get(key)
            samples, rounds = [float(ms)], 1
            if earlier is not None and list(earlier.get("q_lens") or []) == q_lens \
                    and list(earlier.get("kv_lens") or []) == kv_lens and earlier.get("samples_ms") is not None:
                samples = list(earlier["samples_ms"]) + samples
                rounds = _rounds_of(earlier) + 1
            rows.append({**shape, "point_key": key, "op": op, **timing_columns(summarize(samples, 1, SERVED)),
                         "rounds": rounds, "status": "ok", "error": None})
    return rows


def timing_columns(m: Measurement) -> dict:
    return {"time_ms": m.time_ms, "time_ms_p10": m.time_ms_p10, "time_ms_p90": m.time_ms_p90,
            "repeats": m.repeats, "inner_repeats": m.inner_repeats, "rel_precision": m.rel_precision,
            "samples_ms": list(m.samples_ms)}


def _check_device(device: str) -> None:
    import torch  # lazy: loads torch
    if device == "cpu":
        return
    if not device.startswith("cuda"):
        raise InputError(f"--device: expected cpu or cuda (or cuda:N), got {device!r}")
    if not torch.cuda.is_available():
        raise InputError(f"--device {device}: CUDA is not available here "
                         f"(torch {torch.__version__})")


def check_profile_meta(pdir: ProfileDir, config: SweepConfig) -> ProfileMeta:
    """meta.json of the directory: new, or the same configuration (else mixing would corrupt it)."""
    identity = config.identity()
    shard = {"index": config.shard[0], "count": config.shard[1]}
    meta = pdir.read_meta()
    if meta is not None:
        old = meta.identity
        if not isinstance(old, dict):
            raise InputError(f"{pdir.meta_path}: identity must be an object (the sweep's settings), got {old!r}")
        diff = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
        if (meta.shard if meta.shard is not None else shard) != shard:
            diff.append("shard")
        if diff:
            raise InputError(f"{pdir.path}: holds a sweep with other settings ({', '.join(diff)}); "
                             "use another --out, or the same arguments to resume")
        return meta
    return ProfileMeta(identity=identity, shard=shard, grid=config.grid.name, grid_source=config.grid.source,
                       grid_num_points=len(config.grid.points), created_at=utc_now())


def _rotate_bytes(device: str) -> int:
    """Inputs to rotate through, so that a kernel is not timed from a cache warmer than a model's
    step leaves it: twice the GPU's L2 on CUDA, twice one core's L2 on the CPU (0 where unknown). In
    a step the next use of a weight comes after megabytes of other weights: on this project's CPU
    (2 MB L2 per core) a 768 x 256 fp32 GEMM at one row took 26 us from a warm L2, 46 us rotated
    past it, and 38 us inside the `tiny` model's step."""
    if not device.startswith("cuda"):
        return 2 * (cpu_l2_bytes() or 0)
    import torch  # lazy: loads torch
    props = torch.cuda.get_device_properties(torch.device(device))
    return 2 * int(getattr(props, "L2_cache_size", 50 * 2**20))


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text


def _free_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch  # lazy: loads torch
        torch.cuda.empty_cache()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def utc_now() -> str:   # the stamp of profile meta.json and rows: UTC, to the second
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
