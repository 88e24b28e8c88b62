"""`stepcal calibrate`: add fitted host terms to a step model, from one measured run."""
from __future__ import annotations

from experiments.commands import argtypes
from experiments.commands.flags import add_command, add_measured_run_flags

HELP = """Tables composed from kernel profiles miss what the serving engine adds on the host (scheduling,
input preparation, sampling, the request path). Calibration fits four such terms — per step, per
sequence and per token of a step, and per request (before the scheduler sees it: TTFT and E2E) —
from one measured run's request-level metrics (TTFT, TPOT, E2E: what a user of a real deployment
has), by simulating the measured workload until the simulated mean/P50/P90 match. P99 is not fitted.
Writes OUT as a step-model directory for --step-model: the input tables with `host_terms` and a
`calibration` record in meta.json (for const:/linear: models, a small directory naming the model).

The honest test is split by load: calibrate on the lowest load, validate on the others."""


def register(subparsers) -> None:
    p = add_command(subparsers, "calibrate", "fit host terms of a step model from a measured run", HELP, run)
    add_measured_run_flags(p)
    p.add_argument("--max-simulations", type=argtypes.count(1, 100_000), default=300, help="search budget (default 300)")
    p.add_argument("--out", required=True, help="output step-model directory")
    p.add_argument("--quiet", action="store_true")


def run(args) -> int:
    from experiments.commands.output_paths import check_output
    check_output(args.out)
    from experiments.validation.calibration import calibrate_step_model
    from experiments.validation.table import format_pct
    result = calibrate_step_model(args.measured, args.step_model, args.out, max_simulations=args.max_simulations)
    if not args.quiet:
        t = result.terms
        print(f"host terms: {t.per_step_ms:.4g} ms per step, {t.per_seq_ms:.4g} ms per sequence, "
              f"{t.per_token_ms:.4g} ms per token, {t.per_request_ms:.4g} ms per request "
              f"({result.num_simulations} simulations, {result.wall_s:.1f} s)")
        print(f"{'metric':<16}{'before':>10}{'after':>10}")
        for (metric, stat), before in result.errors_before.items():
            after = result.errors_after[(metric, stat)]
            print(f"{metric + '.' + stat:<16}{format_pct(before):>10}{format_pct(after):>10}")
        print(f"wrote {args.out}")
    return 0
