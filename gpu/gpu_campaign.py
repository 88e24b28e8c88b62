"""The quickstart's campaign in two halves: `measure` (profile, capacity and load runs inside a
fixed time budget; needs the GPU and the `torch` extra) and `model` (fit, calibrate, validate,
report; needs no GPU, but the ML extras: MLflow, Optuna, scikit-learn). Both may run on the same
machine, or `measure` on a GPU machine without the ML extras and `model` on another.

Run from the repository root of a checkout where stepcal is installed (a venv with a CUDA build of
torch, then `pip install -e '.[all]'`, or `'.[torch]'` on a machine that only measures):

    .venv/bin/python gpu/gpu_campaign.py measure --work runs/gpu-campaign/work --budget-s 480

writes campaign.tar.gz to the results folder (--results, default $OUT, else runs/gpu-campaign):
the campaign directory (profiles, measured runs, capacity.json); each stage's line goes to stderr.
Then, on the same machine, model the campaign directory itself:

    .venv/bin/python gpu/gpu_campaign.py model --work runs/gpu-campaign/work

or on another machine, from the archive (unpacked into --work, which must not exist yet):

    .venv/bin/python gpu/gpu_campaign.py model --archive campaign.tar.gz --work runs/gpu-campaign-model

Either prints the quickstart's headline table (WORK/headline.json, WORK/report/).

`measure` keeps to its budget: it sizes the load runs from a pilot run's pace (requests per run
are what the time left holds, at most --num-requests), does not start a repeat that would end past
the budget, and packs whatever was measured even when a stage fails. (Sized from the saturation
runs' pace instead, the runs would not fit: on an H200 with llama-3-8b a request cost 0.55 s in a
saturation run and 1.5-2.4 s at 30-90% load.) The profile takes one pass of the quick grid before
the runs and, if time is left, one after (the reproducibility arm).
On an H200 a llama-3-8b step of our engine is launch-bound (20-25 ms for one decode, the same for
a 512-token prefill), so a request served alone costs ~1.6-2 s: with the profile's 2 minutes, the
default 8-minute budget leaves room for one scheduler's six runs of ~20 requests each; give it the
time you have, e.g. --budget-s 3600 --schedulers continuous,sarathi.
Dry run on a CPU: --device cpu --model-spec tiny --prompt lognormal:128:0.8 --output
lognormal:32:0.8 --chunk-size 64 --warm-up-s 5 --profile-minutes 1 --budget-s 150.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

PILOT_REQUESTS = 8      # the pilot run that sizes the load runs
PILOT_MARGIN = 1.25     # its pace, padded: its model build is shared by fewer requests, but prompts vary
OPS = "gemm,attn_prefill,attn_decode,elementwise,overhead,step,host,serve"


def config_of(args, device: str | None = None):
    """The campaign the flags describe, on `device` (default: --device)."""
    from stepcal.experiments.campaign import CampaignConfig
    from stepcal.profiler.noise_policy import NOISE_FLOOR_REPEATS, NoisePolicy
    device = device or args.device
    # a device lent for minutes has no time for repeats served again, on a CPU dry run too
    noise = NoisePolicy.for_device(device).with_retry_slowed(0)
    return CampaignConfig(out=Path(args.work), model_spec=args.model_spec, device=device,
                          schedulers=tuple(args.schedulers.split(",")), num_requests=args.num_requests,
                          prompt=args.prompt, output=args.output, chunk_size=args.chunk_size,
                          repeats=NOISE_FLOOR_REPEATS, trials=args.trials, profile_ops=OPS, history_file=None,
                          noise=noise, seed=args.seed)


def profile_pass(campaign, name: str, minutes: float, *, whole: bool = False) -> None:
    """One pass of the quick grid into WORK/name, stopped after `minutes` (what is measured stays).
    `whole`: the profile joins the campaign only if the pass finished (the late pass: the
    reproducibility stage fits each profile alone, and a part of the grid may hold too few steps)."""
    from stepcal.experiments.profiling import describe_sweep, profile_kernels
    c = campaign.c
    result = profile_kernels(c.model_spec, str(c.out / name), device=c.device, ops=c.profile_ops, grid=c.grid,
                             progress=False, rounds=1, max_minutes=minutes, noise=c.noise)
    print(describe_sweep(result), file=sys.stderr, flush=True)
    if result.complete or not whole:
        campaign.profiled.append(name)
    else:
        print(f"{name}: cut short, left out of the campaign", file=sys.stderr, flush=True)


def measure(args) -> None:
    from stepcal.experiments.campaign import Campaign
    from stepcal.experiments.output_paths import check_output
    deadline = time.monotonic() + args.budget_s
    campaign = Campaign(config_of(args))
    c = campaign.c
    check_output(c.out, staged=False)
    c.out.mkdir(parents=True, exist_ok=True)
    record = {"model_spec": c.model_spec, "device": c.device, "schedulers": list(c.schedulers),
              "profiled": campaign.profiled, "timings_s": c.timings}
    try:
        campaign.stage("warm up (throwaway runs)", "measure", lambda: warm_up(campaign, args.warm_up_s))
        campaign.stage("profile, one pass", "profile", lambda: profile_pass(campaign, "profile", args.profile_minutes))
        record["capacity_rps"] = campaign.measure_capacity(60)
        record["runs"] = measure_loads(campaign, record["capacity_rps"], deadline - args.reserve_s)
        record["num_requests"] = c.num_requests
        late_minutes = (deadline - time.monotonic() - 20) / 60
        if late_minutes > 0.5:
            campaign.stage("profile again, one pass", "profile",
                           lambda: profile_pass(campaign, "profile_late", min(late_minutes, args.profile_minutes),
                                                whole=True))
    finally:    # whatever was measured comes back, also when a stage failed
        (c.out / "capacity.json").write_text(json.dumps(record, indent=2))
        pack(c.out, Path(args.results) / "campaign.tar.gz")


def warm_up(campaign, seconds: float) -> None:
    """Throwaway saturation runs of the first scheduler for `seconds`. On an H200 the engine's
    steps ran 2.5 times slower for 45-90 s stretches early in a process (the first try's profile, which
    then priced the runs' steps 2-6 times too high, and the first run of a fresh process), while the speed
    probe before and after was normal; each run's pace is printed to show when it settles."""
    c, scratch = campaign.c, campaign.c.out / "warm_up"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        campaign.measure(c.schedulers[0], c.workload(10_000.0, PILOT_REQUESTS), scratch)
        shutil.rmtree(scratch)
        print(f"warm-up run: {(time.monotonic() - started) * 1000 / PILOT_REQUESTS:.0f} ms/request",
              file=sys.stderr, flush=True)


def measure_loads(campaign, capacity: dict, deadline: float) -> dict:
    """The load runs, interleaved as the quickstart's (every run's first repeat, then every run's
    second, the pass rotated by half), with as many requests each as the time left holds, from a pilot run's pace:
    PILOT_REQUESTS at the lowest load, the slowest per request (on a GPU a request at 30% load costs
    several times what it does in a saturation run, whose big batches share each step's weight
    reads). A repeat that would end past the deadline is not started. Returns the repeats each run
    kept."""
    from stepcal.experiments.campaign.config import load_name
    from stepcal.profiler.engine.measure import combine_repeats
    c, parts = campaign.c, campaign.c.out / "measured" / ".repeats"
    order = c.interleaved()
    pace_s = pilot_pace_s(campaign, capacity)
    left_s = deadline - time.monotonic()
    c.num_requests = max(8, min(c.num_requests, int(left_s / (len(order) * pace_s))))
    print(f"pilot: {pace_s * 1000:.0f} ms/request, {left_s:.0f} s left: {c.num_requests} requests per run",
          file=sys.stderr, flush=True)
    done = {(s, load): [] for s in c.schedulers for load in c.loads}
    for k, s, load in order:
        if pace_s * c.num_requests > deadline - time.monotonic():
            print(f"out of time: {s} at {load:.0%} repeat {k + 1} and later not served", file=sys.stderr)
            break
        part, started = parts / s / load_name(load) / str(k), time.monotonic()
        campaign.stage(f"measure {s} at {load:.0%} load (repeat {k + 1} of {c.repeats})", "measure",
                       lambda s=s, load=load, part=part: campaign.measure(s, c.workload(load * capacity[s]), part))
        done[(s, load)].append(k)
        pace_s = max(pace_s, (time.monotonic() - started) / c.num_requests)   # the machine may have slowed
    for (s, load), kept in done.items():
        if kept:
            combine_repeats([parts / s / load_name(load) / str(k) for k in kept], c.measured_dir(s, load), (),
                            noise=c.noise)
    shutil.rmtree(parts, ignore_errors=True)
    return {f"{s}/{load_name(load)}": kept for (s, load), kept in done.items()}


def pilot_pace_s(campaign, capacity: dict) -> float:
    """Seconds per request of a short run of the first scheduler at the lowest load (discarded)."""
    c = campaign.c
    scheduler, pilot = c.schedulers[0], c.out / "pilot"
    started = time.monotonic()
    campaign.stage("pilot run (discarded)", "measure", lambda: campaign.measure(
        scheduler, c.workload(c.loads[0] * capacity[scheduler], PILOT_REQUESTS), pilot))
    shutil.rmtree(pilot)
    return PILOT_MARGIN * (time.monotonic() - started) / PILOT_REQUESTS


def pack(work: Path, archive: Path) -> None:
    """The campaign directory, less the sweep's locks and parts (the parquet files hold every row)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            if path.is_file() and "parts" not in path.relative_to(work).parts and not path.name.endswith(".lock"):
                tar.add(path, arcname=str(path.relative_to(work)))
    print(f"{archive}: {archive.stat().st_size / 1e6:.1f} MB", file=sys.stderr)


def model(args) -> None:
    from stepcal.experiments.campaign import Campaign, format_headline
    work = Path(args.work)
    if args.archive:
        work.mkdir(parents=True, exist_ok=False)
        with tarfile.open(args.archive) as tar:
            tar.extractall(work, filter="data")
    record = json.loads((work / "capacity.json").read_text())
    missing = [run for run, kept in record.get("runs", {}).items() if not kept]
    if "num_requests" not in record or missing:
        print(f"error: {work}: `measure` measured no {', '.join(missing) or 'load runs'} (its timings: "
              f"{record.get('timings_s')}); nothing to model", file=sys.stderr)
        sys.exit(2)
    # the model, device and schedulers are the measured ones, whatever the flags say: the device
    # decides the noise policy (a CPU dry run drops slowed servings, a GPU run keeps them)
    config = config_of(args, record.get("device"))   # None: an archive from before the device was recorded
    config.model_spec, config.schedulers = record["model_spec"], tuple(record["schedulers"])
    config.num_requests = record["num_requests"]
    campaign = Campaign(config)
    campaign.profiled = list(record["profiled"])
    headline = campaign.model(record["capacity_rps"])
    print(format_headline(headline))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["measure", "model"])
    parser.add_argument("--work", required=True, help="the campaign directory")
    parser.add_argument("--results", default=os.environ.get("OUT", "runs/gpu-campaign"),
                        help="measure: the results folder, where campaign.tar.gz goes (default $OUT, else runs/gpu-campaign)")
    parser.add_argument("--archive", help="model: campaign.tar.gz from `measure` (unpacked into --work, which must not exist); without it, model the campaign directory --work itself")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-spec", default="llama-3-8b")
    parser.add_argument("--schedulers", default="sarathi",
                        help="comma-separated (default sarathi: one scheduler's six runs are what the default 8 minutes hold)")
    parser.add_argument("--prompt", default="lognormal:512:0.8")
    parser.add_argument("--output", default="lognormal:64:0.8")
    parser.add_argument("--chunk-size", type=int, default=512)
    parser.add_argument("--num-requests", type=int, default=200, help="at most this many per load run")
    parser.add_argument("--budget-s", type=float, default=480, help="measure: wall-clock budget")
    parser.add_argument("--reserve-s", type=float, default=40, help="measure: kept back for packing and slack")
    parser.add_argument("--profile-minutes", type=float, default=2.0, help="measure: cap on each profile pass")
    parser.add_argument("--warm-up-s", type=float, default=30,
                        help="measure: seconds of throwaway runs before the profile (default 30)")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    require(["stepcal.experiments", "torch"] if args.phase == "measure"
            else ["stepcal.experiments", "sklearn", "optuna", "mlflow", "matplotlib"])
    measure(args) if args.phase == "measure" else model(args)


def require(modules: list[str]) -> None:
    """Stop with one line where a module the phase needs is not installed."""
    missing = [name for name in modules if not installed(name)]
    if missing:
        extra = "torch" if missing == ["torch"] else "all"
        sys.exit(f"error: {', '.join(name.split('.')[0] for name in missing)} not installed; from the repository root: python3 -m venv .venv && "
                 f".venv/bin/pip install -e '.[{extra}]' (with a CUDA build of torch to measure on a GPU)")


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:     # a dotted name whose parent is missing
        return False


if __name__ == "__main__":
    main()
