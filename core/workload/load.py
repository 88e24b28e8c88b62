"""The one entry point the simulate, measure and capacity commands use to get a workload."""
from __future__ import annotations

from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.trace import Trace
from stepcal.core.workload.generators import generate
from stepcal.core.workload.readers import read_trace
from stepcal.core.workload.spec import PROCESSES, looks_like_spec, parse_spec
from stepcal.core.workload.transforms import cut, rescale_rate


def load_workload(trace_arg: str, *, trace_format: str | None = None, rate_rps: float | None = None,
                  num_requests: int | None = None, duration_s: float | None = None, seed: int = 0,
                  prefix_block_tokens: int | None = None, arg_name: str = "--trace") -> Trace:
    """Read `trace_arg` if it names a file, else generate it from a spec; then cut and rescale.

    For a file, `num_requests` / `duration_s` first select requests as the file records them,
    then `rate_rps` rescales their inter-arrival times to that mean rate, so the rate is the
    rate of what is simulated (as `stepcal capacity` does). For a spec, `rate_rps` is
    the generation rate (overriding rate=, so one seed gives the same workload shape at every
    rate), and `num_requests` / `duration_s` / `seed` fill in what the spec leaves out. Then
    the trace is cut to `num_requests` and `duration_s`. `trace_format` and `prefix_block_tokens`
(the block size of the file's prefix hash ids; None: the format's own) apply to files only.
    `arg_name` is the flag named in error messages.
    """
    path = Path(trace_arg)
    if path.is_file():
        trace = cut(read_trace(path, trace_format, prefix_block_tokens), num_requests=num_requests, duration_s=duration_s)
        return rescale_rate(trace, rate_rps) if rate_rps is not None else trace
    if path.is_dir():
        raise InputError(f"{arg_name}: {trace_arg!r} is a directory, not a trace file")
    if not looks_like_spec(trace_arg):
        raise InputError(f"{arg_name}: {trace_arg!r} is neither an existing file nor a generator "
                         f"spec ({' | '.join(p + ':...' for p in PROCESSES)})")
    spec = parse_spec(trace_arg, label=arg_name).complete(
        rate_rps=rate_rps, num_requests=num_requests, duration_s=duration_s, seed=seed, label=arg_name)
    return cut(generate(spec), num_requests=num_requests, duration_s=duration_s)
