"""TableMeta: the meta.json of a T_step table directory, the one class that reads and writes it.

`stepcal fit` writes it (costmodel.build, then again with the MLflow run id), `stepcal calibrate`
writes it again with the calibrated host terms, and every reader (the step model, the exports,
predict, the report, validation) takes its fields from here. The file is read through
core.artifact.read_artifact_meta: a file of a newer schema than this stepcal knows is refused in
one line. Keys written by older versions that are absent get the defaults below; keys this class
has no field for are kept in `extra` and written back unchanged.

It imports no scikit-learn or Parquet reader: the experiments import it to read a step-model
directory cheaply.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from stepcal.core.artifact import META_FILE, ArtifactKind, artifact_header, read_artifact_meta, split_known
from stepcal.core.batch import FEATURE_NAMES
from stepcal.core.errors import InputError
from stepcal.core.io import atomic_write_json
from stepcal.core.readers import require_keys
from stepcal.core.schemas import SCHEMA_VERSION, TOOL_VERSION

TABLE_KIND = "stepcal.t_step_tables"
TABLE_ARTIFACT = ArtifactKind(kind=TABLE_KIND, schema_version=SCHEMA_VERSION, what="a T_step table directory",
                              written_by="`stepcal fit`")
META_WHAT = TABLE_ARTIFACT.describe()
REQUIRED_KEYS = ("t_step_terms", "terms")
TERM_KEYS = ("file", "axes")
# Fields written only when set (None: the key is left out of meta.json, as fit and calibrate do).
WRITTEN_WHEN_SET = ("scatter", "slowed_servings", "mlflow_tracking_uri", "calibration", "model_error")
# The targets whose regressors price each kind of composed term, where its meta.json entry does not
# name them (the attention and MoE terms name theirs in `composition`; element-wise terms list their ops).
GEMM_TERMS = ("linear", "lm_head")


@dataclass(frozen=True)
class TableMeta:
    """The fields of a table directory's meta.json, in the order `stepcal fit` writes them.

    Values are the JSON values as stored (objects stay dicts); each reader checks the shape it needs
    and names the file when it is wrong. Times in the grids and errors are in ms (`units`)."""
    units: dict = field(default_factory=lambda: {"time": "ms"})
    features: list = field(default_factory=lambda: list(FEATURE_NAMES))   # the step features the terms read
    host_terms: dict | None = None       # calibrated host terms (ms), null until `stepcal calibrate`
    mode: str | None = None              # "step", "composed" or "operators" (regressors only, no T_step)
    t_step_terms: list = field(default_factory=list)    # the terms whose sum is T_step
    missing_terms: list = field(default_factory=list)   # terms a composed T_step lacks data for
    terms: dict = field(default_factory=dict)           # term name -> {file, axes, ...} (term_entry)
    term_sources: dict = field(default_factory=dict)    # term name -> where its values come from
    axes: dict = field(default_factory=dict)            # knots, rule and measured values of each axis
    training_data_hash: str | None = None
    fitted_range: dict | None = None     # target -> feature -> [min, max] of the training rows
    profile_speed_probe_ms: list | None = None   # the machine's speed probes while profiled
    held_out_errors: dict = field(default_factory=dict)  # "overall" and each target: split -> errors (%)
    error_note: str | None = None
    targets: dict = field(default_factory=dict)          # target -> {family, params, rows, features, model}
    skipped_targets: dict = field(default_factory=dict)  # target -> why it was not fitted
    notes: list = field(default_factory=list)
    regressor: str | None = None
    trials: int | None = None
    seed: int | None = None
    model_spec: dict | None = None       # ModelSpec fields; None: fitted without --model-spec
    tp: int | None = None
    ep: int | None = None
    composition: dict | None = None      # what a composed T_step assumed (attention, MoE routing, ...)
    num_layers: int | None = None
    mlflow_run_id: str | None = None
    provenance: dict = field(default_factory=dict)       # sources, devices, files of the fitted records
    vidur_profile_keys: list | None = None   # the Vidur mlp.csv model keys read at fit time
    scatter: dict | None = None          # the measured step-time scatter (fit --scatter-runs, calibrate)
    slowed_servings: list | None = None  # the profile's servings left out as slowed
    mlflow_tracking_uri: str | None = None
    calibration: dict | None = None      # `stepcal calibrate`'s record
    model_error: dict | None = None      # held-out residuals per target and split (costmodel.evaluation)
    tool_version: str = TOOL_VERSION     # the stepcal that wrote the file (`write` stamps its own)
    extra: dict = field(default_factory=dict)   # keys without a field, written back unchanged

    # ------------------------------------------------------------------ reading

    @classmethod
    def read(cls, directory: str | Path) -> TableMeta:
        """DIR/meta.json, its kind and schema version checked (InputError naming the file otherwise),
        with `t_step_terms` a list and `terms` an object."""
        path = Path(directory) / META_FILE
        meta = read_artifact_meta(directory, TABLE_ARTIFACT, REQUIRED_KEYS)
        if not isinstance(meta["t_step_terms"], list) or not isinstance(meta["terms"], dict):
            raise InputError(f"{path}: t_step_terms must be a list and terms an object ({META_WHAT})")
        return cls.from_dict(meta)

    @classmethod
    def from_dict(cls, meta: dict) -> TableMeta:
        """The fields of a meta.json dict (header keys other than tool_version are dropped: `write`
        stamps them); absent keys get their defaults, unknown keys go to `extra`."""
        known, extra = split_known(meta, FIELD_KEYS)
        if "tool_version" in meta:
            known["tool_version"] = meta["tool_version"]
        return cls(**known, extra=extra)

    # ------------------------------------------------------------------ writing

    def to_dict(self) -> dict:
        """meta.json's content: the header, the fields (those of WRITTEN_WHEN_SET only when set), then
        `extra`."""
        body = {**artifact_header(TABLE_ARTIFACT), "tool_version": self.tool_version}
        for key in FIELD_KEYS:
            value = getattr(self, key)
            if value is not None or key not in WRITTEN_WHEN_SET:
                body[key] = value
        return {**body, **self.extra}

    def write(self, directory: str | Path) -> TableMeta:
        """Write DIR/meta.json atomically, headed by this stepcal's artifact header; returns the meta
        as written (its tool_version this stepcal's)."""
        written = dataclasses.replace(self, tool_version=TOOL_VERSION)
        atomic_write_json(Path(directory) / META_FILE, written.to_dict())
        return written

    # ------------------------------------------------------------------ terms

    def term_entry(self, directory: Path, name: str) -> dict:
        """The `terms` entry of term `name`, with the keys every term kind reads; InputError naming
        DIR/meta.json otherwise."""
        where = Path(directory) / META_FILE
        entry = self.terms.get(name) if isinstance(name, str) else None
        if not isinstance(entry, dict):
            raise InputError(f"{where}: term {name!r} has no entry under 'terms' (an object with file and axes)")
        require_keys(where, entry, TERM_KEYS, f"the entry of term {name!r} under 'terms'")
        if not isinstance(entry["file"], str) or not isinstance(entry["axes"], list) \
                or not all(isinstance(axis, str) for axis in entry["axes"]):
            raise InputError(f"{where}: term {name!r}: file must be a file name and axes a list of column names")
        return entry

    def term_targets(self) -> dict[str, list[str]]:
        """{T_step term: the fitted targets whose regressors price it} ([] for a term priced by a
        roofline or a datasheet): what the held-out errors of a term are read from."""
        fitted = set(self.targets) | {t for t in self.held_out_errors if t != "overall"}
        composition = self.composition or {}
        # The skew and mixed-call terms are differences of decode attention lookups: they carry the decode
        # fit's error (the mixed fit's own residuals are relative errors of shares floored near zero).
        by_composition = {"decode_attn": composition.get("decode_target"),
                          "decode_attn_skew": composition.get("decode_target"),
                          "mixed_decode_attn": composition.get("decode_target"),
                          "prefill_attn": composition.get("prefill_target"), "moe": composition.get("moe_target")}
        mapping = {}
        for name in self.t_step_terms:
            source = self.term_sources.get(name) if isinstance(self.term_sources.get(name), dict) else {}
            if name in GEMM_TERMS:
                targets = [t for t in fitted if t == "gemm" or t.startswith("gemm:")]
            elif by_composition.get(name):
                targets = [by_composition[name]]
            elif source.get("source", "data") == "data" and isinstance(source.get("ops"), list):
                targets = [f"elementwise:{op}" for op in source["ops"]]
            elif name == "all_reduce":
                targets = [t for t in fitted if t.startswith("all_reduce")]
            else:
                targets = [name]
            mapping[name] = sorted(t for t in targets if t in fitted)
        return mapping


FIELD_KEYS = tuple(f.name for f in dataclasses.fields(TableMeta) if f.name not in ("tool_version", "extra"))

__all__ = ["FIELD_KEYS", "META_WHAT", "TABLE_ARTIFACT", "TABLE_KIND", "TableMeta"]
