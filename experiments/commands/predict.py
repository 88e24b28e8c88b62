"""`stepcal predict`: T_step tables applied to every timed row of a profile file."""
from __future__ import annotations

from pathlib import Path

from stepcal.core.io import atomic_write_bytes, atomic_write_parquet
from stepcal.experiments.commands import flags
from stepcal.experiments.output_paths import check_output

HELP = "predict times of a profile file's rows from T_step tables"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "predict", help=HELP, description=HELP + ": one output row per input row and timed target "
        "(row, op, shape columns, measured_ms when the input has times, predicted_ms, spread_ms).",
        formatter_class=flags.DefaultsHelpFormatter)
    p.add_argument("--tables", required=True, metavar="DIR", help="a directory written by `stepcal fit`")
    p.add_argument("--input", required=True, metavar="FILE",
                   help="profile table, step log, Vidur mlp.csv, AIConfigurator or Splitwise file")
    p.add_argument("--format", default="auto",
                   choices=["auto", "profile", "steplog", "vidur", "aiconfigurator", "splitwise"],
                   help="input format (auto: detect from the columns)")
    p.add_argument("--out", required=True, metavar="FILE", help="output .parquet or .csv")
    p.set_defaults(func=run)


def run(args) -> int:
    out = check_output(args.out, kind="file", suffixes=(".parquet", ".csv"))


    from stepcal.costmodel.importers import load_file  # lazy: loads numpy, pandas
    from stepcal.costmodel.predict import predict_records  # lazy: loads numpy, pandas, sklearn

    table = predict_records(args.tables, load_file(Path(args.input), args.format))
    if out.suffix.lower() == ".parquet":
        atomic_write_parquet(table, out)
    else:
        atomic_write_bytes(out, table.to_csv(index=False).encode())
    done = table["predicted_ms"].notna()
    timed = done & table["measured_ms"].notna()
    line = f"wrote {out}: {int(done.sum())} of {len(table)} rows predicted"
    if timed.any():
        line += f"; MAPE {table.loc[timed, 'ape_percent'].mean():.2f}% on {int(timed.sum())} timed rows"
    print(line)
    return 0
