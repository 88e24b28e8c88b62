"""`stepcal profile`: resumable on-device sweeps; `stepcal profile merge`: join shards."""
from __future__ import annotations

import argparse
import sys

from stepcal.experiments.commands import argtypes
from stepcal.experiments.output_paths import check_output
from stepcal.experiments.profiling import OPS, REPLAY, describe_sweep, plan_profile, profile_kernels
from stepcal.profiler.noise_policy import NoisePolicy

EXIT_INCOMPLETE = 3

DESCRIPTION = """\
Time GEMMs, attention (prefill and decode), element-wise work (norms, RoPE, activation,
residual adds, embedding, sampling, KV stores), whole model steps and host overhead for a model
shape over a grid of batch sizes and KV lengths, and write DIR/profile.parquet (one row per
point: op, shape, median / p10 / p90 time in ms, repeats, provenance) and DIR/meta.json
(configuration and hardware fingerprint; with engine ops, the measured runs' speed probe, one
fixed decode step timed before and after the sweep, which `validate` sets each run against).
Between whole-step and host points a shorter probe runs every 5 s or more (about 3% of the sweep);
where one finds the machine over 1.5x slower than the median of the sweep's normal probes, the
points timed on either side of it are timed again at the end, after waiting up to 30 s (within
--max-minutes) for the machine to recover, each keeping the faster of its two rounds (meta.json:
speed_guard).

The `serve` op times whole steps while the engine serves: closed-loop workloads (every request
waiting at time zero, at most C in flight, prompts and outputs log-uniform) under continuous
batching, Sarathi chunks and vLLM's budget, C from 1 to 64 on the quick grid, and continuous batching
at C = 16-64 with short (16-256) and with long (256-1,024) prompts, and at C = 128 and 256 with
short ones (a burst's big decode batches). Each served step
becomes two rows, its device part (op step) and its host part (op host), named `served`, which
`stepcal fit --ops step,host` takes beside the held points: a held batch repeats in a warm
engine, and on the CPU the held points alone priced a campaign's served prefill steps at 0.91 and
its decode steps of 4+ sequences at 0.88 of their device time. About 32 s per pass for `tiny` on
one CPU core, and 10-13 s more for the two workloads at 128 and 256 in flight.

The sweep is resumable: killed at any moment (even with SIGKILL) and run again with the same
arguments, it measures only the missing points. --max-minutes stops cleanly (exit status 3:
run again to resume). Failed points (out of memory, unsupported shape) are recorded with
their reason; --retry-failed measures them again.

--device replay:PROFILE answers each point from a profile measured before (ours, Vidur mlp.csv,
an AIConfigurator system directory or table, an LLMServingSim bundle shaped by --model-spec):
the measured time where the profile has the shape, else log-log linear interpolation between its
measured neighbours (the row's `error` column says "interpolated"), with the profile's own repeat
scatter drawn per point from --seed (its p10-p90 spread, else 2%). A shape outside the profile's
measured hull is refused (a failed row). Time is simulated: each point charges the device time its
calls would take, and --max-minutes counts that clock; meta.json's `replay` sums it.

--budget-s S measures only the grid's points worth their time (kernel ops): a space-filling
first batch per op, then batches chosen by the op's regressor (the physics-informed model the
fit's tuning starts from) where the spread of its trees, relative to its prediction, squared and
divided by the point's predicted measurement seconds is highest, until S seconds of timed calls
(warm-up included) are spent. Each batch is written to DIR/budget.json before it is measured, so a
killed campaign resumes where it stopped without measuring a point twice, and chooses what the
uninterrupted one would. The result is an ordinary profile that `stepcal fit` reads. `stepcal
profile plan` gives the time a grid or a budget takes before any is spent.

--for-trace TRACE weights that choice by where serving the trace puts its steps: the trace runs
once through the simulator (vllm scheduler at its defaults, unlimited KV cache) under a cheap
--trace-step-model, each step becomes its ops' shapes (GEMM m = its tokens; decode attention over
its decodes and their KV; prefill attention over its prefills, their tokens and cached context),
and each point is weighted by the steps nearest to it (log sizes), over its op's mean, plus 0.05.
meta.json's budget record names the weighting used (uniform or for-trace).

Grids: `quick` (minutes), `full` (a campaign), or a JSON / TOML file of the same shape
(see profiler/grid.py). CPU timing uses perf_counter with a fixed thread count (--threads,
default 1); CUDA timing uses events, rotates input buffers past the L2 cache, and replays
tiny kernels from CUDA graphs. On the CPU with glibc, STEPCAL_ALLOCATOR=warm keeps freed memory
in the process (mallopt: mmap threshold 32 MiB, trim threshold 1 GiB), as a long-running server's
warm heap does, instead of mapping a big step's activations afresh (see profiler/allocator.py for
what it changed on two machines); the default leaves glibc as it is. meta.json records the
setting as `allocator`: take the profile and the measured runs with the same one.

Examples:
  stepcal profile --model-spec tiny --device cpu --grid quick --out runs/prof-tiny
  stepcal profile --model-spec llama-3-8b --device cuda --ops gemm,step --grid full \\
      --shard 0/4 --out runs/prof-8b-0
  stepcal profile merge runs/prof-8b-0 runs/prof-8b-1 runs/prof-8b-2 runs/prof-8b-3 \\
      --out runs/prof-8b
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "profile", help="profile GEMM, attention, step and overhead times on this device",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-spec", metavar="NAME|FILE",
                        help="a preset (tiny, tiny-moe, llama-3-8b, mixtral-8x7b, ...), a JSON / TOML ModelSpec file, "
                             "or a Hugging Face config.json (or its directory)")
    parser.add_argument("--device", type=profile_device, default="cpu",
                        help="cpu, cuda (cuda:N), or replay:PROFILE: answer from a measured profile (ours, Vidur "
                             "mlp.csv, an AIConfigurator directory or table, an LLMServingSim bundle) [default: cpu]")
    parser.add_argument("--ops", default=None,
                        help=f"comma-separated ops to sweep, of {','.join(OPS)} [default: every op the model has: "
                             f"moe for mixture-of-experts models only]")
    parser.add_argument("--grid", default="quick", metavar="quick|full|FILE",
                        help="built-in grid or a JSON / TOML grid file [default: quick]")
    parser.add_argument("--dtype", default=None,
                        help="float32, bfloat16 or float16 [default: float32 on cpu, bfloat16 on cuda]")
    parser.add_argument("--threads", type=argtypes.count(1, 1024), default=1, metavar="N",
                        help="torch CPU threads, fixed and recorded [default: 1]")
    parser.add_argument("--max-minutes", type=argtypes.positive, default=None, metavar="M",
                        help="stop cleanly after M minutes (exit 3); the next run resumes")
    parser.add_argument("--budget-s", type=float, default=None, metavar="S",
                        help="budgeted adaptive sampling of the grid's points until S seconds of measurement "
                             "are spent (resumable; see above)")
    parser.add_argument("--for-trace", default=None, metavar="TRACE",
                        help="with --budget-s: weight each point by how many of this trace's simulated steps "
                             "land nearest to it (a trace file or generator spec, as simulate --trace takes)")
    parser.add_argument("--trace-format", default=None, help="force the --for-trace format (default: auto-detect)")
    parser.add_argument("--trace-step-model", default=None, metavar="const:MS|linear:A,B,C",
                        help="the cheap step model the --for-trace simulation runs under [default: linear:8,0.03,0.00005]")
    parser.add_argument("--shard", default="0/1", metavar="i/n",
                        help="run the i-th (from 0) of n disjoint parts of the grid [default: 0/1]")
    parser.add_argument("--seed", type=argtypes.seed, default=0, help="seed of weights and inputs [default: 0]")
    parser.add_argument("--retry-failed", action="store_true", help="measure failed points again")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--out", metavar="DIR", help="output directory (resumed if it exists)")
    parser.set_defaults(func=run, profile_command=None)

    sub = parser.add_subparsers(dest="profile_command", metavar="{merge,plan}")
    merge = sub.add_parser(
        "merge", help="join the profiles of several shards or hosts into one",
        description="Join profile directories (shards of one sweep, or resumed pieces) into one "
                    "DIR/profile.parquet with every point once; checks that they measured the same "
                    "model, dtype, device kind and grid.")
    merge.add_argument("inputs", nargs="+", metavar="DIR", help="profile directories to join")
    merge.add_argument("--out", required=True, metavar="DIR", help="output directory")
    merge.set_defaults(func=run_merge)
    register_plan(sub)


PLAN_DESCRIPTION = """\
Before any device time: per op, the points a campaign measures, the device time of their timed
calls (warm-up included) and the wall time with each point's setup (0.02 s assumed), counted as
the sweep's timing policy would spend them on each point's kernel (the grid's repeats, precision
target, time cap and rounds). Kernel times come from --device replay:PROFILE (the profile's own
times; shapes outside it are counted as refused) or from the roofline of a GPU's datasheet
(--device h100_sxm, a100_sxm, ..., or cuda on a machine whose GPU the datasheets list): the larger
of FLOPs at 70% of the dense BF16 peak and bytes at 80% of the bandwidth, plus a 6 us floor
(gemm, attention, element-wise and moe ops). With --budget-s the budget is shared between ops in
proportion to their whole grid's measurement time, as `stepcal profile --budget-s` spends it.
A device with neither a datasheet nor a replay profile is refused (exit 2).

Example:
  stepcal profile plan --model-spec llama-3-8b --device h100_sxm --ops gemm,attn_decode --grid full
"""


def register_plan(sub) -> None:
    plan = sub.add_parser("plan", help="expected points, measurement and wall time of a profile, per op",
                          description=PLAN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    plan.add_argument("--model-spec", metavar="NAME|FILE", help="a preset, a ModelSpec file or a config.json")
    plan.add_argument("--device", required=True, type=profile_plan_device,
                      help="a datasheet GPU (h100_sxm, a100_sxm, ...), cuda (this machine's GPU) or replay:PROFILE")
    plan.add_argument("--ops", default=None, help=f"comma-separated ops, of {','.join(OPS)} [default: every op the model has]")
    plan.add_argument("--grid", default="quick", metavar="quick|full|FILE", help="the grid [default: quick]")
    plan.add_argument("--budget-s", type=float, default=None, metavar="S",
                      help="a budget of measurement seconds spent on the grid's points")
    plan.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 [default: bfloat16 on a GPU]")
    plan.set_defaults(func=run_plan)


def profile_plan_device(text: str) -> str:
    """Any name: a datasheet's is checked when the plan is made (one line naming those known)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a device name is required")
    return text


def run_plan(args) -> int:
    from stepcal.experiments.budget.plan import describe_plan  # lazy: loads pandas, scipy
    plan = plan_profile(args.model_spec, args.device, ops=args.ops, grid=args.grid, dtype=args.dtype,
                        budget_s=args.budget_s)
    print(describe_plan(plan))
    return 0


def profile_device(text: str) -> str:
    """cpu, cuda, cuda:N or replay:PROFILE."""
    if text.startswith(REPLAY):
        if not text[len(REPLAY):]:
            raise argparse.ArgumentTypeError("replay: needs a profile: replay:PATH")
        return text
    return argtypes.device(text)


def run(args) -> int:
    if args.out:    # a missing --out is refused by profile_kernels
        check_output(args.out, staged=False)   # filled point by point, to resume
    result = profile_kernels(args.model_spec, args.out, device=args.device, ops=args.ops, grid=args.grid,
                             dtype=args.dtype, threads=args.threads, max_minutes=args.max_minutes, shard=args.shard,
                             seed=args.seed, retry_failed=args.retry_failed, progress=not args.no_progress,
                             noise=noise_policy(args), budget_s=args.budget_s, for_trace=args.for_trace,
                             trace_format=args.trace_format, trace_step_model=args.trace_step_model)
    print(describe_sweep(result), file=sys.stderr)
    return 0 if result.complete else EXIT_INCOMPLETE


def noise_policy(args):
    """The sweep's noise handling: the device's (profiler.noise_policy); no flag changes it. A
    replay has no machine noise of its own: it draws the profile's scatter (experiments.replay)."""
    return None if args.device.startswith(REPLAY) else NoisePolicy.for_device(args.device)


def run_merge(args) -> int:
    check_output(args.out, staged=False)
    from stepcal.profiler.merge import merge_profiles  # lazy: loads numpy, pandas
    result = merge_profiles(args.inputs, args.out)
    print(f"{args.out}/profile.parquet: {result.num_rows} points from {len(args.inputs)} "
          f"director{'y' if len(args.inputs) == 1 else 'ies'} "
          f"({result.num_duplicates} duplicates dropped, {result.num_failed} failed)"
          + (f"; {result.num_missing} grid points missing" if result.num_missing else ""),
          file=sys.stderr)
    return 0
