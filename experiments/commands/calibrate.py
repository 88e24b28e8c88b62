"""`stepcal calibrate`: add fitted host terms to a step model, from one measured run."""
from __future__ import annotations

import argparse

HELP = """Tables composed from kernel profiles miss what the serving engine adds on the host (scheduling,
input preparation, sampling, the request path). Calibration fits four such terms — per step, per
sequence and per token of a step, and per request (before the scheduler sees it: TTFT and E2E) —
from one measured run's request-level metrics (TTFT, TPOT, E2E: what a user of a real deployment
has), by simulating the measured workload until the simulated mean/P50/P90 match. P99 is not fitted.
Writes OUT as a step-model directory for --step-model: the input tables with `host_terms` and a
`calibration` record in meta.json (for const:/linear: models, a small directory naming the model).

The honest test is split by load: calibrate on the lowest load, validate on the others."""


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="fit host terms of a step model from a measured run",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--measured", required=True, help="measured run directory (`stepcal measure` or `import vllm-bench`)")
    p.add_argument("--step-model", required=True, help="const:MS, linear:A,B,C or a T_step table directory")
    p.add_argument("--max-simulations", type=int, default=300, help="search budget (default 300)")
    p.add_argument("--out", required=True, help="output step-model directory")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from experiments.calibration import calibrate
    from experiments.step_models import resolve_step_model
    from experiments.validation import format_pct, load_measured_run
    from simulator.io import atomic_output_dir, atomic_write_json
    from simulator.metrics import clean_json
    from simulator.step_model import HostTermsModel

    measured = load_measured_run(args.measured)
    model = resolve_step_model(args.step_model)
    base = model.base if isinstance(model, HostTermsModel) else model   # re-fit from the base, not on top
    result = calibrate(measured, base, max_simulations=args.max_simulations)
    source = Path(args.step_model)
    with atomic_output_dir(args.out) as staging:
        if source.is_dir():
            with tempfile.TemporaryDirectory() as tmp:   # copy first: --out may equal --step-model
                shutil.copytree(source, Path(tmp) / "t")
                for item in (Path(tmp) / "t").iterdir():
                    shutil.move(str(item), staging / item.name)
            meta = json.loads((staging / "meta.json").read_text())
        else:
            meta = {"kind": "builtin", "step_model": args.step_model}
        meta["host_terms"] = result.terms.to_dict()
        meta["calibration"] = clean_json({**result.to_dict(), "measured_run": str(args.measured)})
        atomic_write_json(staging / "meta.json", meta)
    if not args.quiet:
        t = result.terms
        print(f"host terms: {t.per_step_ms:.4g} ms per step, {t.per_seq_ms:.4g} ms per sequence, "
              f"{t.per_token_ms:.4g} ms per token, {t.per_request_ms:.4g} ms per request "
              f"({result.num_simulations} simulations, {result.wall_s:.1f} s)")
        print(f"{'metric':<16}{'before':>10}{'after':>10}")
        for key, before in result.errors_before.items():
            after = result.errors_after[key]
            print(f"{key:<16}{format_pct(before):>10}{format_pct(after):>10}")
        print(f"wrote {args.out}")
    return 0

