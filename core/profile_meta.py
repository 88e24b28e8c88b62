"""A profile directory's meta.json (profiler.store's layout): the sweep's configuration, the machine
it ran on, its progress and the machine's speed around it, as fields.

`stepcal profile` (profiler.sweep) writes it when a sweep starts, and again when it stops;
`stepcal profile merge` (profiler.merge) writes a merged directory's, naming its pieces in
`merged_from`. `stepcal fit` reads the speed probes of each fitted profile (costmodel.profile_speed).
Files written before this class have no `kind` (or "stepcal profile", "stepcal profile merge"), and
are read as they are. Keys this class does not model are kept in `extra` and written back
unchanged; a field that is None (or an empty list of probes) is left out of the file, except the
allocator, which a sweep records when it starts, null included (null: none configured, off the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from stepcal.core.artifact import ArtifactKind, artifact_header, names_kind, read_artifact_meta, split_known
from stepcal.core.io import atomic_write_json

PROFILE_SCHEMA_VERSION = 1
PROFILE_KIND = ArtifactKind(kind="stepcal.profile", schema_version=PROFILE_SCHEMA_VERSION,
                            what="a profile directory", written_by="`stepcal profile`",
                            aliases=(None, "stepcal profile", "stepcal profile merge"))
# Lists left out of the file while empty: each sweep that times the engine adds to them.
APPENDED = ("speed_probe_ms", "speed_guard")


@dataclass(frozen=True)
class ProfileMeta:
    """The meta.json of a profile directory; None: not written (yet, or by this writer)."""
    identity: dict = field(default_factory=dict)   # what must match to resume or merge: SweepConfig.identity()
    shard: dict | None = None                 # {"index": i, "count": n} of a sharded sweep
    grid: str | None = None                   # the grid's name
    grid_source: dict | None = None           # the mapping the grid was built from
    grid_num_points: int | None = None        # points in the whole grid (every shard)
    created_at: str | None = None             # ISO times, UTC
    hardware: dict | None = None              # profiler.fingerprint.hardware_fingerprint
    fingerprint_id: str | None = None         # its short hash, as the rows' fingerprint_id column holds it
    allocator: dict | None = None             # profiler.allocator.configure_allocator's record
    status: str | None = None                 # "running", "complete" or "incomplete"
    started_at: str | None = None
    finished_at: str | None = None
    num_points: int | None = None             # in this shard (a merge: in the merged profile)
    num_done: int | None = None               # points with every round done
    num_failed: int | None = None
    num_missing: int | None = None            # a merge: grid points in none of its pieces
    merged_from: list | None = None           # a merge: each piece's path, shard, status and hardware
    speed_probe_ms: list = field(default_factory=list)   # the engine's fixed step, before and after each sweep
    speed_guard: list = field(default_factory=list)      # profiler.speed_guard's record of each sweep
    extra: dict = field(default_factory=dict)  # keys this class does not model, written back unchanged

    @property
    def model_spec(self) -> dict | None:
        """The sweep's model (ModelSpec.to_dict()), from its identity."""
        return self.identity.get("model_spec") if isinstance(self.identity, dict) else None

    @property
    def ops(self) -> list:
        return list(self.identity.get("ops") or []) if isinstance(self.identity, dict) else []

    def probes_ms(self) -> list[float]:
        """The speed probes that are positive numbers (ms), in file order."""
        values = self.speed_probe_ms if isinstance(self.speed_probe_ms, list) else []
        return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]

    def started(self, *, hardware: dict, fingerprint_id: str, allocator: dict | None, started_at: str) -> ProfileMeta:
        """As a sweep starts (a resumed one: again, on this machine)."""
        return replace(self, hardware=hardware, fingerprint_id=fingerprint_id, allocator=allocator,
                       status="running", started_at=started_at)

    def with_speed(self, probes_ms: list[float], guard: dict | None) -> ProfileMeta:
        """This sweep's speed probes (before and after it) and guard record after the earlier sweeps'."""
        return replace(self, speed_probe_ms=[*self.speed_probe_ms, *probes_ms],
                       speed_guard=[*self.speed_guard, *([guard] if guard is not None else [])])

    def finished(self, *, complete: bool, finished_at: str, num_points: int, num_done: int,
                 num_failed: int) -> ProfileMeta:
        return replace(self, status="complete" if complete else "incomplete", finished_at=finished_at,
                       num_points=num_points, num_done=num_done, num_failed=num_failed)

    @classmethod
    def from_dict(cls, meta: dict) -> ProfileMeta:
        names = tuple(f.name for f in fields(cls) if f.name != "extra")
        known, extra = split_known(meta, names)
        return cls(**known, extra=extra)

    @classmethod
    def read(cls, directory: str | Path) -> ProfileMeta:
        """DIR/meta.json, its kind and schema version checked (InputError naming the file otherwise)."""
        return cls.from_dict(read_artifact_meta(directory, PROFILE_KIND))

    def to_dict(self) -> dict:
        """meta.json's content: the header (kind, schema_version, tool_version), the fields set, extra."""
        out = artifact_header(PROFILE_KIND)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (f.name in APPENDED and not value):
                continue
            if value is not None or (f.name == "allocator" and self.started_at is not None):
                out[f.name] = value
        return {**out, **self.extra}

    def write(self, directory: str | Path) -> None:
        """DIR/meta.json, written whole and renamed in."""
        atomic_write_json(Path(directory) / PROFILE_KIND.file, self.to_dict())


def is_profile_dir(directory: str | Path) -> bool:
    """Whether DIR/meta.json names itself a profile's, or names no kind as older ones did
    (core.artifact.names_kind)."""
    return names_kind(directory, PROFILE_KIND)


__all__ = ["PROFILE_KIND", "PROFILE_SCHEMA_VERSION", "ProfileMeta", "is_profile_dir"]
