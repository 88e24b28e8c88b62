"""`stepcal calibrate`: add fitted host terms to a step model, from one measured run."""
from __future__ import annotations

from stepcal.experiments.commands import argtypes
from stepcal.experiments.commands.flags import add_command, add_measured_run_flags
from stepcal.experiments.host_defaults import ENGINE_NAMES
from stepcal.experiments.output_paths import check_output

HELP = """Tables composed from kernel profiles miss what the serving engine adds on the host (scheduling,
input preparation, sampling, the request path). Calibration fits four such terms — per step, per
sequence and per token of a step, and per request (before the scheduler sees it: TTFT and E2E).
Where the run has a step log with batch shapes (`stepcal measure` writes one), the three step terms
are read off it: each logged step's time minus the tables' price, regressed on a constant, its
sequences and its tokens (non-negative least squares; standard errors clustered over blocks of 50
steps), and only the per-request term is searched. Otherwise (an imported `vllm bench` run, or
--no-step-log) all four come from the run's request-level metrics (TTFT, TPOT, E2E: what a user of a
real deployment has), by simulating the measured workload until the simulated mean/P50/P90 match,
and TTFT's slope on the prompt's tokens among the requests that arrived at light load (what a prompt
token costs), and TPOT's slope on the number of requests decoding alongside (what a sequence costs a
step) and on the prompt tokens other requests prefilled during its decode, per step (what a token
costs a step; each slope counts less where its bootstrap variance exceeds the other statistics').
Where TTFT's slope (or, without one, TPOT's on the prefills) exceeds the base tables', the per-token
term starts from the gap and is searched with the per-step and per-request ones; the per-request
term starts from what the light-load arrivals' median TTFT measures beyond the base. Without TTFT's
slope a light load could not tell a step's cost from a prefill token's: over the 60 held-out runs of
15 CPU campaigns the search's terms priced decode-only steps 13% too high (median measured/predicted
time 0.88; within 7% in 17 runs), the step log's 1% (0.99; within 7% in 54). Then the front end's
shape: the per-request delay as a log-normal (its sigma) plus a part per stream active at the
request's arrival, matched on TTFT P10/P50/P90 of the requests that arrived at light and at heavy
load; kept only where it cuts the loss by a quarter. P99 is not fitted. Tables with a profiled host
term (`stepcal profile`'s host op) get no per-sequence term: the profile timed the host path over the
number of sequences, which a run at low load cannot tell from a step's cost. Prompts of one length
(as `vllm bench`'s random dataset sends by default) give TTFT no slope, and the calibration run's
TTFTs fit a prompt token's cost and the request path's alike; the prefills alongside tell them
apart, for only a token's cost holds up the other requests' steps. A log where neither slope rises
gets no per-token term (held at zero, and said).
Every repeat of the run is used: statistics are averaged over the repeats, and each repeat's
requests are grouped by the streams active in that repeat.
Each fitted term is printed with its standard error (the least-squares sandwich: the sensitivity of
the statistics to the terms, from 2 simulations per term, and the noise of the measured statistics).
Step terms read off a step log get theirs the same way: the regression's own (meta.json's
calibration.step_log.std_err) count the log's scatter about its line, not what the line misses at
other loads.
That noise is the device's step scatter, measured on the run's repeats and simulated over 16 seeds:
the simulation replays the measured requests, so their variety is no noise. A run of one repeat has
no measured scatter and takes a block bootstrap of its requests instead, which counts that variety
too (10-50 times the variance on the quickstart's runs: wider errors). Where the fit misses the run
by more than the noise explains, the errors grow by that misfit ratio. Host terms only add time. Where
the base prices the run too high with every step term at zero (a profile taken at a slower clock, or
in a slower moment of a shared machine), its step times are scaled down instead (`base_scale`, 0.5-1),
with no step term beside it: to the step log's total, or, on the request log, by a search of the
scale alone, kept where it fits the run better than the terms did. Calibrated again on the request
logs of six CPU quickstarts, the profiled tables kept the scale in 7 of 12 calibrations (0.971-0.985);
their held-out loads' step totals came within 1.7% on average (2.3% without it), and 123 of 144
held-out P50/P90 cells within max(5%, 1.5 x noise) (116 without). What is left of the level
(the mean log error after the fit, meta.json's calibration.bias_cv; a base more than twice too slow
keeps the rest of its excess) goes into the stored scatter, so that --ranges draws each
replication's speed level with it besides the device's run-to-run spread.
The default budget (at most 400 + 21 + 100 + about 30 simulations: the step terms, the base's scale,
the front end's shape, the errors; 100 more where TPOT's slope gives the step search one more start;
356-553 on the 30% runs of six quickstarts, 528-622 on bench/bench_vllm_calibration.py's 1,200-request
runs) takes a few minutes for a run of a few thousand requests; with a step log, 150-170 simulations
on average.
Writes OUT as a step-model directory for --step-model: the input tables with `host_terms` and a
`calibration` record in meta.json (for const:/linear: models, a small directory naming the model).

The honest test is split by load: calibrate on the lowest load, validate on the others."""


def register(subparsers) -> None:
    p = add_command(subparsers, "calibrate", "fit host terms of a step model from a measured run", HELP, run)
    add_measured_run_flags(p)
    p.add_argument("--host-defaults", choices=ENGINE_NAMES, default=None, metavar="ENGINE",
                   help="start the search at this engine's published host terms and keep its per-prompt-token "
                        f"front-end term (choices: {', '.join(ENGINE_NAMES)}; see experiments/data/serving_defaults.json)")
    p.add_argument("--max-simulations", type=argtypes.count(1, 100_000), default=300,
                   help="search budget, in simulations: a third of it for per-step and per-request time, a third "
                        "for each of three searches of all four step terms, a third for the front end's shape; with "
                        "a step log, a third for the per-request term and a third for the shape (default 300)")
    p.add_argument("--scatter-runs", nargs="+", default=[], metavar="DIR",
                   help="more measured runs of this device, two or more repeats each, or directories holding "
                        "some (an earlier campaign: every run of two or more repeats under it): their repeats' "
                        "total step times join the run's own to estimate how the device's speed varies from run "
                        "to run (the scatter's run_cv, which --ranges draws; one pair of repeats is a rough "
                        "estimate of a spread, and a campaign's three pairs put it anywhere from a third to "
                        "1.6 times its value)")
    p.add_argument("--scatter-profiles", nargs=2, default=(), metavar=("EARLY", "LATE"),
                   help="two profiles (`stepcal profile` directories or their profile.parquet) of the same grid "
                        "on this device, timed at different times (e.g. before "
                        "and after the measurements, as the quickstart does): the median ratio of their "
                        "whole-step times is one more pair for run_cv")
    p.add_argument("--no-step-log", dest="step_log", action="store_false",
                   help="fit the step terms from the request log even where the run has a step log (as for a "
                        "deployment that logs no steps: to see how well that path does on this run)")
    p.add_argument("--out", required=True, help="output step-model directory")
    p.add_argument("--quiet", action="store_true")


def run(args) -> int:
    check_output(args.out)
    from stepcal.experiments.calibration import calibrate_step_model  # lazy: loads numpy, tqdm
    from stepcal.experiments.validation.table import format_pct  # lazy: loads numpy, tqdm
    result = calibrate_step_model(args.measured, args.step_model, args.out, max_simulations=args.max_simulations,
                                  host_defaults=args.host_defaults, scatter_runs=args.scatter_runs,
                                  scatter_profiles=args.scatter_profiles, step_log=args.step_log)
    if not args.quiet:
        repeats = f"{result.num_repeats} repeat{'s' if result.num_repeats != 1 else ''}"
        print(f"host terms ({repeats}, {result.num_simulations} simulations, {result.wall_s:.1f} s):")
        print(format_terms(result))
        print(format_step_source(result.step_log))
        if result.noise:
            print(format_noise(result.noise))
        print(f"{'metric':<24}{'before':>10}{'after':>10}")
        errors = [(result.errors_before, result.errors_after),
                  (result.front_end.get("errors_before", {}), result.front_end.get("errors_after", {}))]
        for before_errors, after_errors in errors:
            for (metric, stat), before in before_errors.items():
                after = after_errors[(metric, stat)]
                print(f"{metric + '.' + stat:<24}{format_pct(before):>10}{format_pct(after):>10}")
        kept = "kept" if result.front_end.get("kept") else "not kept (cut the loss by less than a quarter)"
        print(f"front-end shape (sigma, per stream): {kept}")
        print(f"level left at this run: {result.bias_cv:.1%} (mean log error after the fit; host terms only add "
              "time, the base's scale takes away at most half); --ranges draws each replication's level with it")
        print(f"wrote {args.out}")
    return 0


UNITS = {"per_step_ms": "ms per step", "per_seq_ms": "ms per sequence", "per_token_ms": "ms per token",
         "per_request_ms": "ms per request (median)", "per_request_sigma": "log-normal sigma of the per-request delay",
         "per_prompt_token_ms": "ms per prompt token (held)", "per_stream_ms": "ms per active stream",
         "base_scale": "x the base tables' step times"}


def format_terms(result) -> str:
    """One line per term: its value, with ± its standard error where it was fitted."""
    from stepcal.simulator.step_model import STEP_TERMS  # lazy: loads numpy
    lines = []
    for name, value in result.terms.to_dict().items():
        if name in result.held:
            spread = f" (not fitted: {result.held[name]})"
        elif name in result.std_err:
            err = result.std_err[name]
            spread = f" ± {err:.2g}" if err is not None else " (not identifiable from this run)"
        elif name in STEP_TERMS and result.terms.base_scale < 1.0:
            spread = " (held at 0: the base's step times are scaled down instead)"
        else:
            spread = "" if value else " (not fitted)"
        lines.append(f"  {value:.4g}{spread} {UNITS[name]}")
    return "\n".join(lines)


def format_step_source(step_log: dict) -> str:
    """Where the step terms came from (Calibration.step_log)."""
    if not step_log:
        return "  (step terms from the request log: the run has no step log with batch shapes, or --no-step-log)"
    return (f"  (step terms from the step log: {step_log['num_steps']} steps, the tables priced their total "
            f"{step_log['total_error_before']:+.1%}, with the terms {step_log['total_error_after']:+.1%})")


def format_noise(noise: dict) -> str:
    """What the standard errors were sized on (Calibration.noise)."""
    source = {"scatter": "the device's step scatter measured on the run's repeats",
              "bootstrap": "a bootstrap of the measured requests (one repeat: no step scatter measured)"}
    ratio = noise.get("misfit_ratio", 1.0)
    misfit = f", times {ratio:.2g}: the fit misses the run by more than that noise" if ratio > 1.0 else ""
    return f"  (standard errors from {source.get(noise.get('noise'), noise.get('noise'))}{misfit})"
