"""A measured run's meta.json (core.measured_run's layout): its settings and provenance, as fields.

Three writers fill it: `stepcal measure` (profiler.engine.measure.engine_meta: the torch engine's
settings, the device and its fingerprint; no `source`), `stepcal import vllm-bench`
(experiments.validation.vllm_bench: `source: "vllm-bench"`, the bench file and what it recorded) and
`stepcal import llmservingsim` (experiments.validation.llmservingsim_run: `source: "llmservingsim"`,
the engine's settings, the latencies' definitions and the clocks' alignment, in `extra`).
Every reader takes a RunMeta from `read_measured_run` (or `RunMeta.read`); keys this class does not
model are kept in `extra` and written back unchanged. A key a writer leaves out is read as None (or
the default below), and to_dict leaves out what is None, except the keys NULL_WRITTEN names, which
their writer has always written, null included: so a run read and written again is the file it was.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from stepcal.core.artifact import ArtifactKind, artifact_header, names_kind, read_artifact_meta, split_known
from stepcal.core.schemas import SCHEMA_VERSION

RUN_KIND = ArtifactKind(kind="measured_run", schema_version=SCHEMA_VERSION, what="a measured run",
                        written_by="`stepcal measure` or `stepcal import vllm-bench`")
VLLM_BENCH = "vllm-bench"      # `source` of a run imported from `vllm bench serve`
LLMSERVINGSIM = "llmservingsim"  # `source` of a vLLM run imported from LLMServingSim's bench
# Field -> its key in meta.json, where the two differ.
KEYS = {"trace_source": "trace"}
# Keys written even when null: kv_blocks (no limit) by both writers; the engine's timeout (none) and
# allocator (none configured: not on the CPU) by `stepcal measure` (a run with no source).
NULL_WRITTEN = ("kv_blocks",)
ENGINE_NULL_WRITTEN = ("timeout_s", "allocator")


@dataclass(frozen=True)
class RunMeta:
    """The meta.json of a measured run; None: the key is absent (a run of the other writer, or of an
    older version)."""
    source: str | None = None                 # "vllm-bench" for an import; None: served by `stepcal measure`
    bench_file: str | None = None             # the `vllm bench` result it was imported from
    model_spec: dict | None = None            # core.model_spec.ModelSpec.to_dict()
    device: str | None = None                 # "cpu", "cuda:0", ...
    dtype: str | None = None
    num_threads: int | None = None            # torch's CPU threads while serving
    fingerprint: dict | None = None           # profiler.fingerprint.hardware_fingerprint of the machine
    trace_source: str | None = None           # meta.json "trace": the workload as `measure` was given it
    repeats: int | None = None                # servings of the workload (repeat_0, repeat_1, ...)
    # the engine's (or the imported deployment's) settings, which a replay's SimConfig copies
    scheduler: str | None = None
    scheduler_config: dict | None = None      # simulator.schedulers.SchedulerConfig's fields
    block_size: int | None = None             # tokens per KV block
    kv_blocks: int | None = None              # KV blocks in the pool; None: no limit
    clock: str | None = None                  # the engine's clock: "wall" or "virtual"
    seed: int | None = None                   # the model's random weights and the engine's sampling
    prefix_caching: bool | None = None        # None: a run written before the engine cached prefixes
    timeout_s: float | None = None            # the engine's limit on a serving; None: none
    allocator: dict | None = None             # profiler.allocator.configure_allocator's record
    # what an import from `vllm bench` recorded
    arrival_source: str | None = None         # "start_times", "request_rate" or "zero"
    num_requests: int | None = None
    num_failed: int | None = None
    bench_totals: dict | None = None          # the bench's run-level scalars
    warnings: list | None = None              # what the import said of the bench and its trace
    extra: dict = field(default_factory=dict)  # keys this class does not model, written back unchanged

    @property
    def prefix_caching_on(self) -> bool:
        """Whether the engine cached prefixes (runs written before it could, had none)."""
        return bool(self.prefix_caching)

    @property
    def served_by_engine(self) -> bool:
        """Whether `stepcal measure` served it (not imported from another engine's benchmark)."""
        return self.source is None

    @classmethod
    def from_dict(cls, meta: dict) -> RunMeta:
        names = tuple(f.name for f in fields(cls) if f.name != "extra")
        known, extra = split_known(meta, tuple(KEYS.get(name, name) for name in names))
        return cls(**{name: known[KEYS.get(name, name)] for name in names if KEYS.get(name, name) in known},
                   extra=extra)

    @classmethod
    def read(cls, directory: str | Path, required_keys: tuple[str, ...] = ()) -> RunMeta:
        """DIR/meta.json, its kind and schema version checked (InputError naming the file otherwise)."""
        return cls.from_dict(read_artifact_meta(directory, RUN_KIND, required_keys))

    def to_dict(self) -> dict:
        """meta.json's content: the header (kind, schema_version, tool_version), the fields set, extra."""
        always = NULL_WRITTEN + (ENGINE_NULL_WRITTEN if self.served_by_engine else ())
        out = artifact_header(RUN_KIND)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "extra" and (value is not None or f.name in always):
                out[KEYS.get(f.name, f.name)] = value
        return {**out, **self.extra}

    def with_repeats(self, repeats: int) -> RunMeta:
        return replace(self, repeats=repeats)


def is_measured_run(directory: str | Path) -> bool:
    """Whether DIR/meta.json names itself a measured run (core.artifact.names_kind)."""
    return names_kind(directory, RUN_KIND)


__all__ = ["LLMSERVINGSIM", "RUN_KIND", "VLLM_BENCH", "RunMeta", "is_measured_run"]
