"""Resolve a --step-model argument: a built-in what-if model or a T_step table directory."""
from __future__ import annotations

import math
from pathlib import Path

from stepcal.core.artifact import META_FILE
from stepcal.core.errors import InputError
from stepcal.costmodel.table_meta import TableMeta
from stepcal.experiments.host_defaults import added_host_terms, with_host_defaults
from stepcal.experiments.host_defaults_tp import deployment_tp
from stepcal.experiments.step_model_meta import BuiltinMeta, read_step_model_meta
from stepcal.simulator.frontend import FrontEnd
from stepcal.simulator.step_model import HostTerms, HostTermsModel, TermUncertainty, parse_builtin_step_model


def resolve_step_model(spec: str, host_defaults: str | None = None):
    """const:MS, linear:A,B,C, a T_step table directory, or a calibrated directory (`stepcal calibrate`).

    Host terms in a directory's meta.json (`host_terms`) are added on top of its base model; with
    `host_defaults` (an engine of experiments/data/serving_defaults.json), that engine's published
    terms are added to a model that has none (experiments.host_defaults), at the TP degree its tables
    were fitted at (experiments.host_defaults_tp.deployment_tp)."""
    base = _resolve(spec)
    return with_host_defaults(base, host_defaults, spec, deployment_tp(1, [base]) if host_defaults else 1)


def resolve_step_models(specs: list[str], host_defaults: str | None, scheduler: str | None, tp: int = 1):
    """Each of `specs` resolved as resolve_step_model, with the engine terms `host_defaults` (auto, none
    or an engine: the --host-defaults flag) adds under `scheduler` (None: no engine known to serve the
    run), decided once for them all (experiments.host_defaults.added_host_terms), for the TP degree of
    --tp `tp`, else of the tables (experiments.host_defaults_tp.deployment_tp). Returns the models and
    the record of what was added (AddedHostTerms), None where nothing was."""
    bases = [_resolve(spec) for spec in specs]
    added = added_host_terms(host_defaults, scheduler, bases)
    if added is None:
        return bases, None
    tp = deployment_tp(tp, bases)     # asked only where terms are added: other runs do not depend on it
    if tp > 1:
        added = added_host_terms(host_defaults, scheduler, bases, tp)
    return [with_host_defaults(base, added.engine, spec, added.tp) for base, spec in zip(bases, specs)], added


def _resolve(spec: str):
    model = parse_builtin_step_model(spec)
    if model is not None:
        return model
    path = Path(spec)
    if not path.is_dir():
        raise InputError(f"--step-model {spec!r}: expected const:MS, linear:A,B,C or a T_step table directory")
    meta = read_step_model_meta(path)
    if isinstance(meta, BuiltinMeta):
        base = parse_builtin_step_model(meta.step_model)
        if base is None:
            raise InputError(f"{path / 'meta.json'}: step_model must be const:MS or linear:A,B,C")
    else:
        from stepcal.costmodel.tables import load_step_model  # lazy: loads pandas; sklearn-free, but only needed here
        base = load_step_model(path)
    terms = meta.host_terms
    if not terms:
        return base
    return HostTermsModel(base, _host_terms(path / "meta.json", terms),
                          _uncertainty(path / "meta.json", meta.calibration))


def _uncertainty(meta_path: Path, calibration: dict | None) -> TermUncertainty | None:
    """The calibrated terms' covariance (`calibration.uncertainty.covariance`), else their standard
    errors as independent terms; None for a calibration that measured neither."""
    block = (calibration or {}).get("uncertainty") or {}
    try:
        covariance = block.get("covariance")
        if covariance:
            return TermUncertainty(tuple(covariance["names"]), tuple(map(tuple, covariance["matrix"])))
        std_err = block.get("std_err")
        return TermUncertainty.from_std_err(std_err) if std_err else None
    except (InputError, KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{meta_path}: calibration.uncertainty: {exc}") from None


def _host_terms(meta_path: Path, terms) -> HostTerms:
    """Calibrated host terms as `stepcal calibrate` writes them: an object of finite numbers (ms)."""
    numbers = isinstance(terms, dict) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in terms.values())
    if not numbers:
        raise InputError(f"{meta_path}: host_terms must be an object of finite numbers (ms), got {terms!r}")
    try:
        return HostTerms.from_dict(terms)
    except InputError as exc:     # its message does not know the file
        raise InputError(f"{meta_path}: {exc}") from None


def front_end(model) -> FrontEnd:
    """The request path of a model (simulator.frontend): its host terms' front end, none without them."""
    return getattr(model, "front_end", None) or FrontEnd()


def tables_meta(model) -> TableMeta:
    """The meta.json of the tables under a step model as loaded (under calibrated host terms or a
    rescale: HostTermsModel, ScaledStepModel wrap them as `base`); TableMeta's defaults for a model
    without tables."""
    while hasattr(model, "base"):
        model = model.base
    meta = getattr(model, "meta", None)
    return meta if isinstance(meta, TableMeta) else TableMeta()


def describe_step_model(spec: str, model) -> str:
    describe = getattr(model, "describe", None)
    return describe() if callable(describe) else str(spec)


def stored_scatter(step_model: str) -> dict:
    """The step-time scatter stored with a step-model directory (meta.json's `scatter`, written by
    `stepcal calibrate`: cv, rho, run_cv); {} for built-in models and directories without one."""
    meta = Path(step_model) / META_FILE if step_model else None
    if meta is None or not meta.is_file():
        return {}
    scatter = read_step_model_meta(meta.parent).scatter
    if scatter is not None and not (isinstance(scatter, dict) and all(
            isinstance(scatter.get(k, 0.0), (int, float)) for k in ("cv", "rho", "run_cv", "bias_cv")) and all(
            isinstance(scatter.get(k, 0), int) and not isinstance(scatter.get(k, 0), bool) and scatter.get(k, 0) >= 0
            for k in ("run_cv_pairs", "model_level_repeats"))):
        raise InputError(f"{meta}: scatter must be an object of numbers cv, rho, run_cv, bias_cv (and whole numbers "
                         f"run_cv_pairs, model_level_repeats), got {scatter!r}")
    return scatter or {}
