"""`stepcal tables export`: a T_step table directory in Vidur's layout, plain CSV or JSON."""
from __future__ import annotations

import argparse

HELP = "work with T_step table directories"


def register(subparsers) -> None:
    p = subparsers.add_parser("tables", help=HELP, description=HELP + ".")
    sub = p.add_subparsers(dest="tables_command", metavar="ACTION")
    e = sub.add_parser(
        "export", help="export tables to other formats",
        description="Export a T_step table directory: vidur (mlp.csv and attention.csv in the "
                    "layout Vidur's profiling data takes, per layer, in ms), csv (one CSV per "
                    "grid, plus meta.json) or json (one tables.json).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("tables", metavar="DIR", help="a directory written by `stepcal fit`")
    e.add_argument("--format", required=True, choices=["vidur", "csv", "json"])
    e.add_argument("--out", required=True, metavar="DIR2", help="output directory")
    e.set_defaults(func=run_export)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(parser) -> int:
    parser.print_help()
    return 2


def run_export(args) -> int:
    from experiments.commands.output_paths import check_output
    check_output(args.out)
    from pathlib import Path

    from costmodel.export import export_tables
    from simulator.io import atomic_output_dir

    with atomic_output_dir(Path(args.out)) as staging:
        written = export_tables(args.tables, args.format, staging)
    print(f"wrote {', '.join(str(Path(args.out) / p.name) for p in written)}")
    return 0
