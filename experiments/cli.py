"""The `stepcal` command line. Each subcommand lives in experiments/commands/<name>.py.

Command modules import only argparse at load time (torch, sklearn and mlflow load inside
the handlers), so `stepcal --help` stays instant.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from stepcal import __version__
from stepcal.core.errors import InputError

# Module names under experiments.commands; each defines register(subparsers).
COMMAND_MODULES = ("quickstart", "simulate", "measure", "validate", "calibrate", "trace", "profile", "fit", "predict", "tables", "capacity", "sweep", "import_cmd", "report")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (`stepcal simulate: ...`) and exit code 2, like every other input error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def avoid_huge_page_stalls() -> None:
    """Before numpy and pyarrow load, ask them to stay off transparent huge pages.

    Where the kernel compacts memory for such pages on first touch (THP defrag "madvise", a common
    default), fresh large arrays can stall the process. On a 2-core VM, building the Azure conv
    simulation's step log (a few hundred MB of short-lived arrays) took 1.2 s of system time with
    numpy's huge-page advice and 0.1 s without; Arrow's mimalloc pool added 0.1-0.7 s of system time
    and 47 MB of peak memory over the system allocator. Our arrays are read once or twice, so huge
    pages buy nothing back. A setting in the environment wins."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="stepcal",
        description="Calibrate LLM-serving performance models on real hardware: profile kernels, "
                    "fit step-time models, simulate schedulers, and measure how right they are.")
    parser.add_argument("--version", action="version", version=f"stepcal {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"stepcal.experiments.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    avoid_huge_page_stalls()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:       # a usage error (already printed as one line), or --help
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"stepcal: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stepcal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
