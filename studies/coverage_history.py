"""Does the device's history of run pairs make the 90% intervals right (issue 17)?

    .venv/bin/python studies/coverage_history.py CAMPAIGN [CAMPAIGN ...] [--model calibrated]
        [--replications 20] [--workers 2] [--out DIR]

The `--ranges` intervals of a calibrated model draw the device's speed from run to run (run_cv). A
quickstart campaign estimates it from three pairs of runs (each scheduler's calibration run and the
profile's two halves): a chi-square of three degrees of freedom, off by a factor of three either way.
For each campaign, in the order given (oldest first), this re-validates the held-out runs (every load
but the lowest) of OUT/<model>/<scheduler> with `--ranges`, run_cv taken from

  own:      the campaign's three pairs, as the quickstart does without --scatter-runs;
  history:  those and every pair of the campaigns before it in the list (all their runs of two
            repeats), as `--scatter-runs EARLIER ...` does;

each either as an exact run_cv (the level a normal draw of that spread; `--level exact`), with the
model's own level carrying its calibration run's speed (run_cv x sqrt(1 + 1/repeats); `--level
carried`, what `stepcal calibrate` stores), or that and run_cv taken as an estimate as well (`--level
estimate`: Student's t with as many degrees of freedom as pairs, `--scatter-run-cv-pairs`); `--level
all` (the default) runs the three. It prints the coverage of each (cells inside the interval, each
repeat on its own) and the median width. A campaign's cells move together (one speed level per repeat), so its coverage is a sample of
about eight repeats: the last lines bootstrap campaigns of 8 and 16 repeats from the pooled repeats
and give how often one lands inside issue 17's band of 80-97%.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

BAND = (0.80, 0.97)


def own_log_ratios(campaign: Path) -> list[float]:
    """The pairs the quickstart pools: each scheduler's lowest-load run and the profile's two halves."""
    from stepcal.experiments.validation.measured import load_measured_run
    from stepcal.experiments.validation.scatter import profile_log_ratio, speed_log_ratios
    ratios = [r for runs in load_runs(campaign).values() for r in speed_log_ratios(load_measured_run(runs[0]))]
    if (campaign / "profile_late").exists():
        ratios.append(profile_log_ratio(campaign / "profile", campaign / "profile_late"))
    return ratios


def all_log_ratios(campaign: Path) -> list[float]:
    """Every run of two or more repeats in the campaign: what --scatter-runs CAMPAIGN pools."""
    from stepcal.experiments.validation.measured import load_measured_run
    from stepcal.experiments.validation.scatter import scatter_run_dirs, speed_log_ratios
    return [r for run in scatter_run_dirs([campaign / "measured"]) for r in speed_log_ratios(load_measured_run(run))]


def load_runs(campaign: Path) -> dict[str, list[Path]]:
    """{scheduler: its measured runs by load, lowest first} (the saturation runs left out)."""
    root = campaign / "measured"
    return {s.name: sorted(s.glob("load_*")) for s in sorted(root.iterdir()) if s.is_dir() and not s.name.startswith(".")}


def calibration_repeats(campaign: Path) -> int:
    """Repeats of the runs the campaign's models were calibrated on (each scheduler's lowest load)."""
    from stepcal.core.measured_run import repeat_dirs
    return min(len(repeat_dirs(runs[0])) for runs in load_runs(campaign).values())


def coverage_of(campaign: Path, model: str, run_cv: float, args, out: Path,
                level: tuple[int, int] = (0, 0)) -> list[tuple[int, int, float]]:
    """(cells inside, cells, relative width) per held-out repeat, validated with this run_cv and
    `level`: (pairs behind run_cv, repeats of the model's calibration run); (0, 0) takes run_cv as exact."""
    from stepcal.experiments.cli import main
    from stepcal.experiments.validation.compare import read_record
    rows = []
    for scheduler, runs in load_runs(campaign).items():
        for run in runs[1:]:
            target = out / scheduler / run.name
            code = main(["validate", "--measured", str(run), "--step-model", str(campaign / model / scheduler),
                         "--ranges", str(args.replications), "--workers", str(args.workers), "--quiet",
                         "--scatter-run-cv", f"{run_cv:.6g}", "--scatter-run-cv-pairs", str(level[0]),
                         "--scatter-model-repeats", str(level[1]), "--out", str(target)])
            if code != 0:
                raise SystemExit(f"validate {run} failed (exit {code})")
            cells = read_record(target / "validation.json").ranges["coverage"]["cells"]
            flat = [cell for stats in cells.values() for cell in stats.values()]
            for k in range(len(flat[0]["repeats_inside"])):
                inside = [cell["repeats_inside"][k] for cell in flat]
                rows.append((sum(inside), len(inside), float(np.median([c["relative_width"] for c in flat]))))
    return rows


def bootstrap_band(rows: list[tuple[int, int, float]], num_repeats: int, draws: int = 20000) -> tuple[float, float, float]:
    """P(coverage below, inside, above the band) of a campaign of `num_repeats` repeats drawn from rows."""
    counts = np.array([(i, n) for i, n, _ in rows])
    pick = np.random.default_rng(0).integers(0, len(counts), (draws, num_repeats))
    coverage = counts[pick, 0].sum(1) / counts[pick, 1].sum(1)
    below, above = np.mean(coverage < BAND[0]), np.mean(coverage > BAND[1])
    return float(below), float(1.0 - below - above), float(above)


def main() -> None:
    from stepcal.experiments.validation.scatter import pooled_run_cv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("campaigns", nargs="+", type=Path, help="quickstart output directories, oldest first")
    parser.add_argument("--model", default="calibrated", help="calibrated (default) or profiled_cal")
    parser.add_argument("--replications", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep the validations here (default: a temporary directory)")
    parser.add_argument("--level", choices=["exact", "carried", "estimate", "all"], default="all",
                        help="run_cv taken as exact, with the model's calibration run's speed carried, that and "
                             "run_cv as an estimate (Student's t), or the three (default)")
    parser.add_argument("--policies", default="own,history", help="own, history or both (default own,history)")
    parser.add_argument("--history-only", type=int, default=0, metavar="N",
                        help="the first N campaigns only give history: validate the later ones (default 0)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="coverage_history_"))
    levels = ["exact", "carried", "estimate"] if args.level == "all" else [args.level]
    policies = [f"{p}-{lv}" for p in args.policies.split(",") for lv in levels]
    pooled = {policy: [] for policy in policies}
    history: list[float] = []
    print(f"{'campaign':24} {'policy':16} {'pairs':>5} {'run_cv':>7} {'coverage':>15} {'width':>6}")
    for index, campaign in enumerate(args.campaigns):
        if index < args.history_only:
            history += all_log_ratios(campaign)
            continue
        own = own_log_ratios(campaign)
        for policy in policies:
            ratios = own if policy.startswith("own") else own + history
            run_cv = pooled_run_cv(ratios)
            level = {"exact": (0, 0), "carried": (0, calibration_repeats(campaign)),
                     "estimate": (len(ratios), calibration_repeats(campaign))}[policy.rsplit("-", 1)[1]]
            rows = coverage_of(campaign, args.model, run_cv, args, out / campaign.name / policy, level)
            pooled[policy] += rows
            inside, cells = sum(r[0] for r in rows), sum(r[1] for r in rows)
            print(f"{campaign.name:24} {policy:16} {len(ratios):5d} {run_cv:7.3f} {inside:5d}/{cells:<4d} {inside / cells:5.0%} "
                  f"{np.median([r[2] for r in rows]):6.0%}", flush=True)
        history += all_log_ratios(campaign)
    for policy, rows in pooled.items():
        inside, cells = sum(r[0] for r in rows), sum(r[1] for r in rows)
        bands = ", ".join(f"{n} repeats: {b:.0%} below / {i:.0%} inside / {a:.0%} above"
                          for n in (8, 16) for b, i, a in [bootstrap_band(rows, n)])
        print(f"{policy:16}: pooled {inside}/{cells} = {inside / cells:.1%}; campaigns of {bands} the band {BAND[0]:.0%}-{BAND[1]:.0%}")
    print(f"validations in {out}")


if __name__ == "__main__":
    main()
