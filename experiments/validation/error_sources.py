"""Which sources of error a prediction's `--ranges` replications draw, and how large each is: the
`sources` of a ranges block (summary.json, validation.json) and its one printed line.

| source | drawn from | else |
|---|---|---|
| model_error | the fit's held-out residuals per term and region (experiments.validation.model_error); older tables: residuals not known, widened by the recorded MAPE | not known; a calibrated model's level and host terms carry it (their covariance) |
| tables_spread | the regressors' own spread per term (simulator.ranges), for terms whose model error is not known | none in the tables |
| host_terms | the calibration's covariance | not calibrated |
| step_scatter | --scatter-cv/--scatter-rho, the tables' measured scatter, or the profile's repeat scatter of the T_step's points | not known |
| missing_terms | never: a composed T_step's terms without data (meta.json missing_terms: an all-reduce, the host overhead) | not known |
| run_to_run | --scatter-run-cv, the tables' measured run_cv, or the profile's speed probes (the speed guard's through the sweep, else those before and after it) | not known |

A source that is not known is named as such rather than drawn as zero in silence: an interval
without it is narrower than the truth by however much that source would add.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from stepcal.costmodel.table_meta import TableMeta
from stepcal.experiments.validation.model_error import ModelError
from stepcal.experiments.validation.scatter import pooled_run_cv
from stepcal.simulator.scatter import Scatter

NOT_KNOWN = "not known"


def probe_run_cv(meta: TableMeta) -> tuple[float, str] | None:
    """run_cv from the profile's speed probes, and what it came from: the speed guard's probes through
    the sweep (meta.json model_error.speed_probes: a run's level is the machine's speed at one moment,
    log-normal of their log_sd), else the fixed decode step timed before and after the sweep
    (consecutive probes are two runs of the same work, pooled as pairs of runs are:
    experiments.validation.scatter.pooled_run_cv). None without either."""
    guard = (meta.model_error or {}).get("speed_probes") if isinstance(meta.model_error, dict) else None
    if isinstance(guard, dict) and isinstance(guard.get("log_sd"), (int, float)):
        return float(np.sqrt(np.expm1(guard["log_sd"] ** 2))), f"profile speed guard ({guard.get('n')} probes)"
    probes = [p for p in (meta.profile_speed_probe_ms or []) if isinstance(p, (int, float)) and p > 0]
    if len(probes) < 2:
        return None
    ratios = np.diff(np.log(np.asarray(probes, dtype=np.float64)))
    return pooled_run_cv(ratios.tolist()), f"profile speed probes ({len(ratios)} pair{'s' if len(ratios) != 1 else ''})"


def filled_scatter(scatter: Scatter, given: dict, error: ModelError | None, meta: TableMeta) -> tuple[Scatter, dict]:
    """The scatter with what the profile knows filled in where neither a flag nor the tables gave it
    (`given`: the keys cv and run_cv set by either), and where each part came from."""
    step_from = "flags or tables" if given.get("cv") else NOT_KNOWN
    run_from = "flags or tables" if given.get("run_cv") else NOT_KNOWN
    if not given.get("cv") and error is not None and error.repeat_cv:
        scatter, step_from = replace(scatter, cv=float(error.repeat_cv), rho=0.0), "profile repeats"
    probes = None if given.get("run_cv") else probe_run_cv(meta)
    if probes is not None:
        scatter, run_from = replace(scatter, run_cv=probes[0]), probes[1]
    if not given.get("run_cv") and (scatter.model_level_repeats or scatter.bias_cv) and run_from == NOT_KNOWN:
        run_from = "the calibration's level only"
    return scatter, {"step_scatter": step_from, "run_to_run": run_from}


def sources_block(error: ModelError | None, meta: TableMeta, drawn_terms: list[str], scatter: Scatter,
                  origins: dict, host_terms: bool = False) -> dict:
    """The `sources` of a ranges block: per source, whether it was drawn, from what, and its size.
    `host_terms`: the model adds host terms (calibrated or an engine's published ones), which price
    the host overhead the tables may lack."""
    calibrated = meta.calibration is not None
    if calibrated:
        model = {"drawn": False, "from": "carried by the calibration (host terms' covariance, the model's level)"}
    elif error is not None and error.is_known:
        kinds = sorted({t.kind for t in error.terms})
        model = {"drawn": True, "from": ", ".join(kinds), "terms": error.record()}
    else:
        model = {"drawn": False, "from": NOT_KNOWN}
    host = [name for name in drawn_terms if name.startswith("host:")]
    # a term whose held-out error is drawn does not draw the tables' spread too (DrawnErrorTerm.biased)
    replaced = {t.name for t in error.terms if t.kind == "held-out residuals"} if model["drawn"] else set()
    spread = [name for name in drawn_terms if not name.startswith("host:") and name not in replaced]
    missing = [name for name in meta.missing_terms if isinstance(name, str) and not (host_terms and name == "overhead")]
    return {
        "model_error": model,
        "missing_terms": {"drawn": False, "from": NOT_KNOWN if missing else "none missing", "terms": missing},
        "tables_spread": {"drawn": bool(spread), "terms": spread},
        "host_terms": {"drawn": bool(host), "terms": host},
        "step_scatter": {"drawn": scatter.cv > 0, "from": origins["step_scatter"] if scatter.cv > 0 else NOT_KNOWN,
                         "cv": scatter.cv, "rho": scatter.rho},
        "run_to_run": {"drawn": scatter.level_sigma > 0,
                       "from": origins["run_to_run"] if scatter.level_sigma > 0 else NOT_KNOWN,
                       "run_cv": scatter.run_cv},
    }


def sources_text(sources: dict) -> str:
    """One line: 'drawn: model error (held-out residuals, 6 terms), ...; not known: run-to-run spread'."""
    names = {"model_error": "model error", "missing_terms": "terms the tables lack", "tables_spread": "tables' spread",
             "host_terms": "host terms", "step_scatter": "step scatter", "run_to_run": "run-to-run spread"}
    drawn, unknown = [], []
    for key, name in names.items():
        source = sources.get(key) or {}
        if source.get("drawn"):
            size = {"model_error": f"{len(source.get('terms') or {})} terms",
                    "step_scatter": f"cv {source.get('cv', 0):.3g}",
                    "run_to_run": f"run cv {source.get('run_cv', 0):.3g}"}.get(key)
            where = source.get("from")
            detail = ", ".join(part for part in (where, size) if part)
            drawn.append(f"{name} ({detail})" if detail else name)
        elif source.get("from") == NOT_KNOWN:
            unknown.append(f"{name} ({', '.join(source['terms'])})" if source.get("terms") else name)
    return (f"error sources drawn: {'; '.join(drawn) or 'none'}"
            + (f"; not known (not in the interval): {', '.join(unknown)}" if unknown else ""))
