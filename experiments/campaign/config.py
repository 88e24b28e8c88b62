"""What a campaign runs: the model, device, schedulers, loads and workload, and where it writes."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stepcal.profiler.noise_policy import NOISE_FLOOR_REPEATS, NoisePolicy

KERNEL_OPS = ("gemm", "attn_prefill", "attn_decode", "elementwise", "overhead", "moe")   # moe: MoE models only
CALIBRATED = ("calibrated", "profiled_cal")   # the step models with host terms fitted to a request log
PROFILED_OPS = ("step", "host")    # what the "profiled" tables need: whole-step device time and host time


@dataclass
class CampaignConfig:
    out: Path
    model_spec: str = "tiny"
    device: str = "cpu"
    schedulers: tuple[str, ...] = ("continuous", "sarathi")
    loads: tuple[float, ...] = (0.3, 0.6, 0.9)      # shares of each scheduler's measured capacity
    num_requests: int = 200
    prompt: str = "lognormal:128:0.8"
    output: str = "lognormal:32:0.8"
    chunk_size: int = 64
    repeats: int = NOISE_FLOOR_REPEATS
    trials: int = 4
    grid: str = "quick"
    profile_ops: str | None = None                  # e.g. "step,overhead" (None: every op of the grid)
    arrivals: str = "poisson"                       # or gamma:CV (bursty: CV > 1)
    ranges: int = 0                                 # replications per held-out run of the calibrated model
    workers: int = 1                                # processes for those replications
    scatter_runs: tuple[str, ...] = ()              # earlier runs or campaigns of this device: run_cv's history
    history_file: Path | None = None                # the device's ledger of run pairs, read and added to (None: off)
    # how the profile, the runs and the fit handle noise (its retry_slowed_repeats: times a run's
    # slowed repeats are served again, in all); None: NoisePolicy.for_device(device)
    noise: NoisePolicy | None = None
    seed: int = 0
    timings: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.noise is None:
            self.noise = NoisePolicy.for_device(self.device)

    def workload(self, rate_rps: float, num_requests: int | None = None) -> str:
        n = num_requests or self.num_requests
        process, _, cv = self.arrivals.partition(":")
        shape = f",cv={cv}" if cv else ""
        return f"{process}:rate={rate_rps:.6g}{shape},n={n},prompt={self.prompt},output={self.output},seed={self.seed}"

    def profiled_ops(self) -> bool:
        """Whether the profile has what tables from the profile alone need (step and host)."""
        profiled = self.profile_ops.split(",") if self.profile_ops else list(PROFILED_OPS)
        return all(op in profiled for op in PROFILED_OPS)

    def kernel_ops(self) -> list[str]:
        """The profiled per-operator kernels (the whole-step points left out), if GEMMs are among them."""
        profiled = self.profile_ops.split(",") if self.profile_ops else list(KERNEL_OPS)
        ops = [op for op in KERNEL_OPS if op in profiled]
        return ops if "gemm" in ops else []

    def interleaved(self) -> list[tuple[int, str, float]]:
        """(repeat, scheduler, load) of every load run in the order they are served: every run's first
        repeat, then every run's second with the pass rotated by half its length, ... Rotated, every
        run's two repeats lie at least half a pass apart, and each run's mean place in the campaign
        is within a quarter pass of the middle (the same order each pass: half a pass), so a steady
        trend favours no load much. A reversed pass (as before) cancels a steady trend exactly but
        serves the middle runs' repeats back to back: in one quickstart the sarathi 90% run's two
        repeats fell in one slow stretch of the machine (33% slower than while profiled), their TPOT
        agreed within 0-5%, and that noise floor said nothing of the drift its prediction faced."""
        runs = [(s, load) for s in self.schedulers for load in self.loads]
        half = len(runs) // 2
        return [(k, s, load) for k in range(self.repeats)
                for s, load in (runs if k % 2 == 0 else runs[half:] + runs[:half])]

    def measured_dir(self, scheduler: str, load: float | None = None) -> Path:
        """OUT/measured/<scheduler>/load_<percent>, or .../saturation without a load."""
        return self.out / "measured" / scheduler / ("saturation" if load is None else load_name(load))


def load_name(load: float) -> str:
    return f"load_{round(100 * load):02d}"
