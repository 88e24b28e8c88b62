"""The one entry point the simulate, measure and capacity commands use to get a workload."""
from __future__ import annotations

from pathlib import Path

from simulator.errors import InputError
from simulator.trace import Trace
from simulator.workload.generators import generate
from simulator.workload.readers import read_trace
from simulator.workload.spec import PROCESSES, looks_like_spec, parse_spec
from simulator.workload.transforms import cut, rescale_rate


def load_workload(trace_arg: str, *, trace_format: str | None = None, rate_rps: float | None = None,
                  num_requests: int | None = None, duration_s: float | None = None, seed: int = 0,
                  arg_name: str = "--trace") -> Trace:
    """Read `trace_arg` if it names a file, else generate it from a spec; then rescale and cut.

    For a file, `rate_rps` rescales inter-arrival times to that mean rate. For a spec, it is
    the generation rate (overriding rate=, so one seed gives the same workload shape at every
    rate), and `num_requests` / `duration_s` / `seed` fill in what the spec leaves out. Then
    the trace is cut to `num_requests` and `duration_s`. `trace_format` applies to files only.
    `arg_name` is the flag named in error messages.
    """
    path = Path(trace_arg)
    if path.is_file():
        trace = read_trace(path, trace_format)
        if rate_rps is not None:
            trace = rescale_rate(trace, rate_rps)
    elif looks_like_spec(trace_arg):
        spec = parse_spec(trace_arg, label=arg_name).complete(
            rate_rps=rate_rps, num_requests=num_requests, duration_s=duration_s, seed=seed,
            label=arg_name)
        trace = generate(spec)
    elif path.is_dir():
        raise InputError(f"{arg_name}: {trace_arg!r} is a directory, not a trace file")
    else:
        raise InputError(f"{arg_name}: {trace_arg!r} is neither an existing file nor a generator "
                         f"spec ({' | '.join(p + ':...' for p in PROCESSES)})")
    return cut(trace, num_requests=num_requests, duration_s=duration_s)
