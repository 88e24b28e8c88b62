"""Sweep grids: which points to measure, for which ops, with which timing policy.

A grid is a mapping (built in, or a JSON / TOML file of the same shape):

    timing = {max_point_s = 0.5, rounds = 2}      # TimingPolicy fields (rounds: passes pooled)
    limits = {max_tokens = 16384, max_kv_tokens = 262144}
    [gemm]          m = [1, 2, 4, ...]; names = ["qkv_proj", ...]   (default: every projection
                    of the model, ModelSpec.gemm_shapes(): router and shared experts included)
    [attn_prefill]  num_seqs, q, s, patterns = ["uniform", "ragged"]; cases = [{q_lens, kv_lens}]
    [attn_decode]   num_seqs, s, patterns = ["uniform", "log_uniform", "one_long"]; cases = [...]
    [step]          batches = [{num_prefill, q, s, num_decode, decode_s, decode_pattern}]; cases = [...]
    [overhead]      num_seqs, s; cases = [...]    (input building only; `host` supersedes it)
    [host]          num_seqs, s (decodes); prefill_q (one fresh prefill each); cases = [...]
                    (the engine's whole host path of an iteration: profiler.engine.probe)
    [moe]           num_tokens = [1, 2, 4, ...]; distributions = ["balanced", "power_law_1.01"]
                    (mixture-of-experts specs only: one MoE layer's routed experts)
    [elementwise]   num_tokens (per-token operators: emb, input_layernorm, attn_rope,
                    post_attention_layernorm, mlp_act, add, and q_norm, k_norm of a qk_norm
                    model); num_seqs (per-sequence ones: sample,
                    kv_store); names = [...] (default: all the model has; profiler.elementwise)
    [serve]         schedulers = ["continuous", "sarathi:64"]; concurrency = [1, 4, ...];
                    requests_per_seq = 2, min_requests = 8; prompt = [16, 1024]; output = [4, 128];
                    rounds = 1 (passes of its own, at most the grid's): whole steps timed while the
                    engine serves closed-loop workloads (profiler.serve). A list of such sections
                    (TOML [[serve]]) serves each family: e.g. short and long prompts at high C

Patterns make heterogeneous batches from (b, q, s) (profiler.batches), and routing distributions
the tokens each expert receives (profiler.routing), deterministically, so a grid names the same
points on every host. Each point has a stable key (profiler.point); re-running a sweep skips keys
already done. The sections are expanded by profiler.grid_sections; the built-in grids are in
profiler.builtin_grids.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.core.model_spec import ModelSpec
from stepcal.core.readers import read_config_file
from stepcal.profiler.builtin_grids import BUILT_IN
from stepcal.profiler.grid_sections import expand_section, serve_rounds
from stepcal.profiler.point import Point

OPS = ("gemm", "attn_prefill", "attn_decode", "step", "overhead", "host", "moe", "elementwise", "serve")
MOE_OPS = ("moe",)                   # ops that only a mixture-of-experts spec has


@dataclass(frozen=True)
class Grid:
    name: str
    points: tuple[Point, ...]
    timing: dict
    source: dict                    # the mapping it was built from (for meta.json)
    unavailable: dict = field(default_factory=dict)   # op -> why the model has no such op

    def for_ops(self, ops) -> Grid:
        """The points of `ops`; asking for an op the model does not have is an InputError."""
        missing = [op for op in ops if op in self.unavailable]
        if missing:
            raise InputError(f"--ops {missing[0]}: {self.unavailable[missing[0]]}")
        return Grid(self.name, tuple(p for p in self.points if p.op in ops), self.timing, self.source,
                    self.unavailable)

    def rounds_of(self, point: Point, rounds: int) -> int:
        """Passes a point of this grid gets in a sweep of `rounds`: a section's own `rounds` (serve's:
        one workload already times hundreds of steps) caps the grid's."""
        section = self.source.get(point.op)
        if point.op == "serve" and section is not None:   # the family that serves it, read as expanded
            return min(rounds, serve_rounds(section, point.name))
        own = section.get("rounds") if isinstance(section, dict) else None
        return rounds if own is None else min(rounds, int(own))

    def shard(self, index: int, count: int) -> tuple[Point, ...]:
        """The index-th of count disjoint parts, by key hash (stable when the grid grows)."""
        return tuple(p for p in self.points if shard_of(p.key, count) == index)

    @property
    def fingerprint(self) -> str:
        """Hash of the point keys and timing settings: two runs resume each other only if equal."""
        text = json.dumps([[p.key for p in self.points], self.timing], sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]


def shard_of(key: str, count: int) -> int:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % count


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' with 0 <= i < n."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise InputError(f"--shard: expected i/n (e.g. 0/4), got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise InputError(f"--shard: need 0 <= i < n (shards are numbered from 0), got {text!r}")
    return index, count


def load_grid(name_or_path: str, spec: ModelSpec) -> Grid:
    """A built-in grid name (quick, full) or a JSON / TOML grid file, expanded for `spec`."""
    if name_or_path in BUILT_IN:
        return expand_grid(name_or_path, BUILT_IN[name_or_path], spec)
    path = Path(name_or_path)
    if not path.is_file():
        raise InputError(f"--grid: {name_or_path!r} is neither a built-in grid "
                         f"({', '.join(BUILT_IN)}) nor an existing file")
    source = read_config_file(path, "a profiling grid")
    return expand_grid(str(path), source, spec, where=str(path))


def expand_grid(name: str, source: dict, spec: ModelSpec, where: str = "grid") -> Grid:
    """Every point of the grid for this model, in a fixed order, duplicates dropped."""
    if not isinstance(source, dict):
        raise InputError(f"{where}: a grid must be a mapping of sections")
    unknown = set(source) - set(OPS) - {"timing", "limits"}
    if unknown:
        raise InputError(f"{where}: unknown grid sections {sorted(unknown)}; "
                         f"known: timing, limits, {', '.join(OPS)}")
    limits = {"max_tokens": 16384, "max_kv_tokens": 2097152, **source.get("limits", {})}
    points: list[Point] = []
    for op in OPS:
        section = source.get(op)
        if section is None:
            continue
        points.extend(expand_section(op, section, spec, where))
    kept = [p for p in points
            if p.num_tokens <= limits["max_tokens"] and p.kv_tokens <= limits["max_kv_tokens"]]
    unique = list(dict.fromkeys(kept))
    timing = dict(source.get("timing", {}))
    return Grid(name, tuple(unique), timing, source, unavailable_ops(spec))


def unavailable_ops(spec: ModelSpec) -> dict[str, str]:
    """Ops this model does not have, with the reason (for a one-line error when asked for)."""
    if spec.is_moe:
        return {}
    return {op: f"model spec {spec.name!r} has no experts (num_experts is 0); op {op} times a "
                f"mixture-of-experts layer" for op in MOE_OPS}


def ops_for(spec: ModelSpec, ops=OPS) -> tuple[str, ...]:
    """The ops of `ops` this model has (a default op list for any spec)."""
    unavailable = unavailable_ops(spec)
    return tuple(op for op in ops if op not in unavailable)
