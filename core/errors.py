"""Errors and warnings a person can act on."""
import sys


class InputError(Exception):
    """Bad user input (a file, a row, a flag). The CLI prints `stepcal: <message>` and exits 2."""


def shown(value) -> str:
    """A value as a person would write it, for messages: numpy scalars as plain numbers (never
    `np.float64(nan)`), numpy arrays (a list-valued cell) as lists."""
    if hasattr(value, "tolist") and hasattr(value, "dtype"):     # numpy scalar or array
        value = value.tolist()
    return repr(value)


def print_warnings(warnings) -> None:
    """Input warnings (e.g. a workload's rows dropped on import), one `stepcal: warning:` line each on stderr."""
    for warning in warnings:
        print(f"stepcal: warning: {warning}", file=sys.stderr)
