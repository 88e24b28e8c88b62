"""`stepcal trace`: summarise a workload, or write one (generated or converted) in our format."""
from __future__ import annotations

import argparse
import json

from stepcal.core.errors import print_warnings
from stepcal.experiments.commands import argtypes
from stepcal.experiments.output_paths import check_output

FORMATS = ("stepcal", "azure", "mooncake", "vidur")   # core.workload.TRACE_FORMATS, kept
                                                      # here so --help loads no numpy
SUFFIXES = (".csv", ".parquet")                       # core.workload.writer.TRACE_SUFFIXES, likewise

DESCRIPTION = """\
Summarise a workload trace, or write one in stepcal's format.

Prefix reuse: a trace may say which prompt blocks its requests share. Our column
prefix_hash_ids (Mooncake's hash_ids) is a list of integer ids in [0, 2^63) (a Parquet
list, or space-separated in CSV: "0 14 15"), one per block of --prefix-block-tokens tokens
from the start of the prompt (default 16; 512 for Mooncake, whose hash_ids are 512-token
blocks). An id stands for its block's tokens and everything before them, so two requests
with the same id share the whole prompt up to that block's end; a prompt's last partial
block has an id of its own. A list holds at most ceil(num_prompt_tokens / block) ids and
may stop short: the blocks it leaves out are shared with no one. Empty: nothing shared.
Our files carry the block size in a prefix_block_tokens column (the same on every row),
which --prefix-block-tokens may not contradict. `stats` reports the share of prompt tokens
an unbounded prefix cache would hit (and, with --cache-tokens, an LRU cache of that size).
`stepcal simulate --prefix-caching on` reuses the blocks these ids share."""

TRACE_HELP = """\
TRACE is a trace file or a generator spec.

Files: our CSV/Parquet (arrival_s,num_prompt_tokens,num_output_tokens[,request_id,priority,
slo_ttft_ms,slo_tpot_ms,prefix_hash_ids,prefix_block_tokens]), Azure LLM 2023 CSV, Mooncake JSONL, Vidur trace CSV;
the format is detected from the columns or forced with --trace-format. Imported traces start at 0 s.

Generator spec: PROCESS:KEY=VALUE,KEY=VALUE,...
  PROCESS    poisson | gamma (cv=X: CV of inter-arrival times, 0.01 to 10; 1 = Poisson, >1 bursty)
             | onoff (on=S,off=S: Poisson at rate= for on= seconds, then off= seconds of silence)
  rate=RPS   request rate while arriving (requests/s); --rate overrides it
  n=INT, duration=SECONDS   size (one or both; with both, whichever ends first)
  seed=INT   random seed (default: --seed, 0)
  prompt=DIST, output=DIST  independent length distributions, DIST one of
             fixed:N | uniform:LO:HI (inclusive) | lognormal:MEAN:SIGMA[:MAX] (mean in tokens,
             sigma of the underlying normal, at most 3, clamped to [1, MAX]) | empirical:PATH (resampled
             from a trace file; the same file for both resamples (prompt, output) pairs)
  lengths=empirical:PATH    both lengths, as pairs, from one trace file
  system=TOKENS[:COUNT]     a shared system prompt of TOKENS in front of every prompt, one of
             COUNT (default 1) picked per session; prompt= then sizes the user part
  turns=DIST multi-turn sessions (DIST: fixed:N | uniform:LO:HI turns): each arrival starts a
             session; turn k's prompt is the system prompt, every earlier turn's user part and
             answer, and its own user part; n= / duration= count sessions
  think=SECONDS  mean think time between turns (exponential; default 0)
  loop=closed|open  closed (default): a turn is sent a think time after the previous answer
             finished (the simulator releases it; columns session_id, turn, think_time_s);
             open: a think time after the previous turn was sent
  Reuse is written as prefix_hash_ids of 16-token blocks. A spec whose prompts (system prompt
  and earlier turns included) would pass 10M tokens, or whose arrivals would pass a year, is
  refused, naming the parameter, before anything is written (limits: stepcal.core.bounds).
Examples:
  poisson:rate=5,n=1000,prompt=lognormal:512:1.0,output=uniform:16:256,seed=0
  gamma:rate=5,cv=3,duration=600,prompt=fixed:1024,output=fixed:128
  onoff:rate=20,on=10,off=30,n=2000,lengths=empirical:AzureLLMInferenceTrace_conv.csv
  poisson:rate=2,n=200,system=1024:4,turns=uniform:2:6,think=5,prompt=lognormal:200:0.8,output=uniform:50:300"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "trace", help="summarise a workload, or generate / convert one",
        description=DESCRIPTION,
        epilog=TRACE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    stats = _add_action(actions, "stats", "print requests, duration, rate, burstiness, lengths and prefix reuse",
                        "Print a summary of TRACE: number of requests, duration, mean rate,\n"
                        "burstiness (CV of inter-arrival times), prompt / output length percentiles and,\n"
                        "when it carries prefix hash ids, the share of prompt tokens an unbounded prefix\n"
                        "cache would hit: requests in arrival order, each hitting the longest run of its\n"
                        "leading block ids seen before (up to its prompt length minus one token, which is\n"
                        "always computed), and the number of requests with any hit.")
    stats.add_argument("trace", metavar="TRACE", help="trace file or generator spec")
    _add_workload_flags(stats)
    stats.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    stats.add_argument("--cache-tokens", type=argtypes.count(1, 2**50), default=None, metavar="N",
                       help="also report the prefix hit share of an LRU cache holding N tokens "
                            "(e.g. a KV cache's blocks x block size)")
    stats.set_defaults(func=run)

    gen = _add_action(actions, "generate", "write a generated (or converted) trace in stepcal's format",
                      "Write TRACE (a generator spec, or a file in any supported format) as a\n"
                      "stepcal trace: CSV or Parquet by the suffix of --out, written atomically.")
    gen.add_argument("trace", metavar="TRACE", help="generator spec or trace file")
    gen.add_argument("--out", required=True, metavar="FILE", help="output path, .csv or .parquet")
    _add_workload_flags(gen)
    gen.set_defaults(func=run)


def _add_action(actions, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    return actions.add_parser(name, help=summary, description=description, epilog=TRACE_HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)


def _add_workload_flags(parser) -> None:
    parser.add_argument("--trace-format", choices=FORMATS, default=None,
                        help="force the format of a trace file (default: detect)")
    parser.add_argument("--rate", type=argtypes.rate, default=None, metavar="RPS",
                        help="mean request rate: rescales a file, overrides a spec's rate=")
    parser.add_argument("--num-requests", type=argtypes.count(), default=None, metavar="N",
                        help="keep the first N requests (sizes a spec that has no n= / duration=)")
    parser.add_argument("--duration", type=argtypes.seconds, default=None, metavar="SECONDS",
                        help="keep requests arriving within SECONDS of the first")
    parser.add_argument("--seed", type=argtypes.seed, default=0, help="seed for a spec without seed= (default 0)")
    parser.add_argument("--prefix-block-tokens", type=argtypes.count(1, 1_000_000), default=None, metavar="N",
                        help="tokens per block of a trace file's prefix hash ids (default: 16; Mooncake: 512)")


def run(args) -> int:
    if args.trace_command == "generate":
        check_output(args.out, kind="file", suffixes=SUFFIXES)
    from stepcal.core.workload import load_workload, trace_stats, write_trace  # lazy: loads numpy

    trace = load_workload(args.trace, trace_format=args.trace_format, rate_rps=args.rate,
                          num_requests=args.num_requests, duration_s=args.duration, seed=args.seed,
                          prefix_block_tokens=args.prefix_block_tokens, arg_name="TRACE")
    print_warnings(trace.warnings)
    stats = trace_stats(trace, getattr(args, "cache_tokens", None))
    if args.trace_command == "generate":
        path = write_trace(trace, args.out)
        print(f"wrote {stats['num_requests']} requests over {stats['duration_s']:.1f} s "
              f"({_number(stats['rate_rps'])} req/s) to {path}")
    elif args.json:
        print(json.dumps(stats, indent=2))
    else:
        print(format_stats(stats))
    return 0


def format_stats(stats: dict) -> str:
    """A short human-readable table of trace_stats(...)."""
    lines = [
        f"trace        {stats['source']}",
        f"requests     {stats['num_requests']}",
        f"duration     {stats['duration_s']:.1f} s",
        f"rate         {_number(stats['rate_rps'])} req/s",
        f"burstiness   {_number(stats['burstiness_cv'])} (CV of inter-arrival times; Poisson = 1)",
        "",
        f"{'tokens':<8}" + "".join(f"{s:>10}" for s in ("mean", "p50", "p90", "p99", "max")),
    ]
    for label, prefix in (("prompt", "num_prompt_tokens"), ("output", "num_output_tokens")):
        lines.append(f"{label:<8}" + "".join(f"{stats[f'{prefix}_{s}']:>10.1f}"
                                             for s in ("mean", "p50", "p90", "p99", "max")))
    if stats.get("prefix_hit_share") is not None:
        lines += ["", f"prefix reuse {100 * stats['prefix_hit_share']:.1f}% of prompt tokens hit an unbounded "
                      f"cache ({stats['prefix_block_tokens']}-token blocks); "
                      f"{stats['prefix_hit_requests']} of {stats['num_requests']} requests hit"]
        if stats.get("prefix_hit_share_lru") is not None:
            lines.append(f"             {100 * stats['prefix_hit_share_lru']:.1f}% with an LRU cache of "
                         f"{stats['cache_tokens']} tokens")
    return "\n".join(lines)


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
