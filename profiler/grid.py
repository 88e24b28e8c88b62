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

Patterns make heterogeneous batches from (b, q, s), and routing distributions the tokens each
expert receives, deterministically, so a grid names the same points on every host. Each point
has a stable key; re-running a sweep skips keys already done.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import numpy as np

from stepcal.core.errors import InputError
from stepcal.core.model_spec import HEAD_NORMS, SEQ_ELEMENTWISE, TOKEN_ELEMENTWISE, ModelSpec
from stepcal.core.readers import read_config_file

OPS = ("gemm", "attn_prefill", "attn_decode", "step", "overhead", "host", "moe", "elementwise", "serve")
MOE_OPS = ("moe",)                   # ops that only a mixture-of-experts spec has
DECODE_PATTERNS = ("uniform", "log_uniform", "one_long")
PREFILL_PATTERNS = ("uniform", "ragged")
SECTION_KEYS = {
    "gemm": {"m", "names"},
    "attn_prefill": {"num_seqs", "q", "s", "patterns", "cases"},
    "attn_decode": {"num_seqs", "s", "patterns", "cases"},
    "step": {"batches", "cases"},
    "overhead": {"num_seqs", "s", "cases"},
    "host": {"num_seqs", "s", "prefill_q", "cases"},
    "moe": {"num_tokens", "distributions"},
    "elementwise": {"num_tokens", "num_seqs", "names"},
    "serve": {"schedulers", "concurrency", "requests_per_seq", "min_requests", "prompt", "output", "rounds"},
}
POWER_LAW = "power_law_"            # a routing distribution "power_law_<alpha>"
STEP_BATCH_KEYS = {"num_prefill", "q", "s", "num_decode", "decode_s", "decode_pattern"}


@dataclass(frozen=True)
class Point:
    """One measurement: a GEMM (m, n, k), a batch of (q_i, s_i) for attention / step / overhead, or
    the routed experts of one MoE layer over m tokens (name: the routing distribution)."""
    op: str
    name: str                                  # projection, batch pattern or routing distribution
    m: int | None = None                       # a GEMM's rows; a MoE layer's tokens
    n: int | None = None
    k: int | None = None
    q_lens: tuple[int, ...] | None = None
    kv_lens: tuple[int, ...] | None = None

    @property
    def key(self) -> str:
        """Readable prefix plus a hash of the full shape (lists can be long)."""
        shape = {"m": self.m, "n": self.n, "k": self.k, "q_lens": self.q_lens, "kv_lens": self.kv_lens}
        digest = hashlib.sha1(json.dumps([self.op, self.name, shape]).encode()).hexdigest()[:12]
        if self.q_lens is None:
            return f"{self.op}/{self.name}/m{self.m}/{digest}"
        return f"{self.op}/{self.name}/b{len(self.q_lens)}/{digest}"

    @property
    def num_tokens(self) -> int:
        return self.m if self.q_lens is None else int(sum(self.q_lens))

    @property
    def kv_tokens(self) -> int:
        """Tokens held in caches during the point (new ones included)."""
        if self.q_lens is None:
            return 0
        return int(sum(self.q_lens) + sum(self.kv_lens))


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
            family = next((part for part, where in _parts("serve", section, "grid")
                           if point.name in {w.name for w in serve_workloads(part, where)}), {})
            return min(rounds, _ints(family, "rounds", "grid: [serve]", default=1)[0])
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


# --- built-in grids ------------------------------------------------------------------------

# Six passes over the quick grid, pooled: on a shared VM the machine's speed drifts over tens of
# seconds, and two passes left a third of the points' medians outside the other run's [p10, p90];
# six (about 40 s for `tiny` on one CPU core) put 88% inside and every |difference| within the
# p10-p90 width (experiments/profile_noise.py, 2026-11-30).
QUICK = {
    "timing": {"max_point_s": 0.4, "target_rel_precision": 0.02, "min_repeats": 12, "rounds": 6},
    "limits": {"max_tokens": 4096, "max_kv_tokens": 262144},
    "gemm": {"m": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]},
    "attn_prefill": {"num_seqs": [1, 4], "q": [16, 128, 512], "s": [0, 512, 2048],
                     "patterns": ["uniform", "ragged"]},
    "attn_decode": {"num_seqs": [1, 8, 32, 128], "s": [128, 1024, 4096],
                    "patterns": ["uniform", "log_uniform", "one_long"]},
    # Whole steps from one sequence up: the profiled tables ("profiled": step + host) fit T_step on
    # these alone, so small batches at short contexts, where most serving steps are, have points.
    "step": {"batches": [
        {"num_decode": 1, "decode_s": 64},
        {"num_decode": 1, "decode_s": 512},
        {"num_decode": 2, "decode_s": 128},
        {"num_decode": 4, "decode_s": 256},
        {"num_decode": 8, "decode_s": 512},
        {"num_decode": 16, "decode_s": 256},
        {"num_decode": 64, "decode_s": 512},
        {"num_prefill": 1, "q": 16, "s": 0},
        {"num_prefill": 1, "q": 64, "s": 0},
        {"num_prefill": 1, "q": 64, "s": 256},
        {"num_prefill": 1, "q": 64, "s": 0, "num_decode": 4, "decode_s": 128},
        {"num_decode": 32, "decode_s": 1024},
        {"num_decode": 32, "decode_s": 1024, "decode_pattern": "log_uniform"},
        {"num_prefill": 1, "q": 128, "s": 0},
        {"num_prefill": 1, "q": 512, "s": 0},
        {"num_prefill": 1, "q": 256, "s": 512, "num_decode": 16, "decode_s": 1024},
        {"num_prefill": 2, "q": 128, "s": 0, "num_decode": 32, "decode_s": 512},
        {"num_prefill": 1, "q": 64, "s": 1024, "num_decode": 64, "decode_s": 256,
         "decode_pattern": "one_long"},
    ]},
    # Input building alone (the host op's inputs part; fit takes host where both are there).
    "overhead": {"num_seqs": [1, 2, 4, 8, 16, 32, 64, 128, 256], "s": [512]},
    # Decodes, fresh prefills, and mixed steps of both: host time by sequences and tokens. Short
    # contexts: host time barely depends on them, and each round prefills every decode first.
    "host": {"num_seqs": [1, 2, 4, 8, 16, 32, 64, 128], "s": [64], "prefill_q": [16, 64, 256, 512],
             "cases": [{"name": "mixed", "q_lens": [256] + [1] * 16, "kv_lens": [0] + [64] * 16},
                       {"name": "mixed", "q_lens": [64, 64] + [1] * 4, "kv_lens": [0, 0] + [64] * 4}]},
    # Mixture-of-experts specs only. AIConfigurator's vLLM tables hold balanced, power_law_1.01
    # and power_law_1.2 (full takes all three), and every num_tokens of full's list.
    "moe": {"num_tokens": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
            "distributions": ["balanced", "power_law_1.01"]},
    # The step's work besides GEMMs and attention (norms, RoPE, activation, residual adds,
    # embedding; final norm and sampling, KV stores): on the CPU, with a small model, about half
    # of a decode step, which kernel tables without it miss.
    # Nine sizes each: fit needs eight rows per operator; dense where serving steps are.
    "elementwise": {"num_tokens": [1, 4, 16, 32, 64, 128, 256, 1024, 4096],
                    "num_seqs": [1, 2, 4, 8, 16, 32, 64, 128, 256]},
    # Whole steps as serving forms them (profiler.serve): the profiled tables' step and host fits take
    # them beside the held points above, which alone priced the quickstart's runs 6-9% low.
    "serve": [{"schedulers": ["continuous", "sarathi:64", "vllm"], "concurrency": [1, 2, 4, 8, 16, 32, 64],
               "requests_per_seq": 2, "min_requests": 8, "prompt": [16, 1024], "output": [4, 128], "rounds": 1},
              # Continuous batching's big prefill steps hold a burst's prompts: ~250 tokens each from
              # the family above, 100-190 in the default trace's bursts, 200-560 in a prefill-heavy
              # one. Families of short and of long prompts give steps of many short prompts and of
              # few long ones, so the fit need not read one prompt mix off a step's size: profiled
              # cells 263 -> 279 of 360 over ten quickstarts (qs30-33, none fewer), 7 s a pass.
              {"schedulers": ["continuous"], "concurrency": [16, 32, 64], "prompt": [16, 256], "output": [4, 128]},
              {"schedulers": ["continuous"], "concurrency": [16, 32, 64], "prompt": [256, 1024], "output": [4, 128]},
              # Bursts at 90% load keep 65-256 decodes in flight, beyond every family above. Fitted
              # without them (the slope at 64 extrapolated), those steps' measured/predicted time
              # fell 2-10 points below that of the same runs' 33-64-decode steps; with them, within
              # 1 point (two bursty quickstarts refitted both ways; with a Poisson one, profiled cells
              # 24, 32, 22 -> 25, 31, 25 of 36). Short prompts keep the pass at about 10 s.
              {"schedulers": ["continuous"], "concurrency": [128, 256], "prompt": [16, 256], "output": [4, 128]}],
}

_FULL_M = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384,
           448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120,
           6144, 7168, 8192, 10240, 12288, 14336, 16384]

FULL = {
    "timing": {"max_point_s": 2.0, "target_rel_precision": 0.01, "min_repeats": 10, "rounds": 2},
    "limits": {"max_tokens": 16384, "max_kv_tokens": 2097152},
    "gemm": {"m": _FULL_M},
    "attn_prefill": {"num_seqs": [1, 2, 4, 8], "q": [16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
                     "s": [0, 256, 1024, 4096, 16384], "patterns": ["uniform", "ragged"]},
    "attn_decode": {"num_seqs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
                    "s": [64, 256, 1024, 4096, 16384, 32768],
                    "patterns": ["uniform", "log_uniform", "one_long"]},
    "step": {"batches": [
        *({"num_decode": b, "decode_s": s} for b in (1, 4, 16, 64, 256) for s in (256, 2048, 8192)),
        *({"num_decode": b, "decode_s": 4096, "decode_pattern": p}
          for b in (16, 64, 256) for p in ("log_uniform", "one_long")),
        *({"num_prefill": 1, "q": q, "s": s} for q in (64, 256, 1024, 4096) for s in (0, 2048)),
        *({"num_prefill": p, "q": q, "s": 0, "num_decode": d, "decode_s": 2048}
          for p in (1, 2) for q in (256, 1024) for d in (16, 64, 128)),
    ]},
    "overhead": {"num_seqs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "s": [512, 4096]},
    "host": {"num_seqs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "s": [512, 4096],
             "prefill_q": [16, 64, 256, 1024, 4096],
             "cases": [{"name": "mixed", "q_lens": [q] + [1] * d, "kv_lens": [0] + [2048] * d}
                       for q in (256, 1024) for d in (16, 64, 128)]},
    "moe": {"num_tokens": _FULL_M, "distributions": ["balanced", "power_law_1.01", "power_law_1.2"]},
    "elementwise": {"num_tokens": [2 ** i for i in range(15)], "num_seqs": [2 ** i for i in range(10)]},
    "serve": {"schedulers": ["continuous", "sarathi:512", "vllm"], "concurrency": [1, 2, 4, 8, 16, 32, 64, 128, 256],
              "requests_per_seq": 2, "min_requests": 8, "prompt": [16, 4096], "output": [4, 512], "rounds": 2},
}

BUILT_IN = {"quick": QUICK, "full": FULL}


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
        for part, at in _parts(op, section, where):
            _check_keys(part, SECTION_KEYS[op], at)
            points.extend(_EXPANDERS[op](part, spec, at))
    kept = [p for p in points
            if p.num_tokens <= limits["max_tokens"] and p.kv_tokens <= limits["max_kv_tokens"]]
    unique = list(dict.fromkeys(kept))
    timing = dict(source.get("timing", {}))
    return Grid(name, tuple(unique), timing, source, unavailable_ops(spec))


def _parts(op: str, section, where: str) -> list[tuple[object, str]]:
    """(section, where) pairs: serve may be a list of sections (TOML [[serve]]), each a workload
    family of its own; every other op is one section."""
    if op == "serve" and isinstance(section, list):
        if not section:
            raise InputError(f"{where}: [serve] is an empty list")
        return [(part, f"{where}: [serve] #{i + 1}") for i, part in enumerate(section)]
    return [(section, f"{where}: [{op}]")]


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


def _check_keys(section, allowed: set, where: str) -> None:
    if not isinstance(section, dict):
        raise InputError(f"{where}: must be a mapping")
    unknown = set(section) - allowed
    if unknown:
        raise InputError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(allowed)}")


def _ints(section: dict, key: str, where: str, default=None, minimum: int = 1) -> list[int]:
    values = section.get(key, default)
    if values is None:
        raise InputError(f"{where}: missing {key!r}")
    values = values if isinstance(values, list) else [values]
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise InputError(f"{where}: {key} must hold integers >= {minimum}, got {v!r}")
    return values


def _names(section: dict, key: str, known, default, where: str) -> list[str]:
    values = section.get(key, list(default))
    bad = [v for v in values if v not in known]
    if bad:
        raise InputError(f"{where}: unknown {key} {bad}; known: {', '.join(known)}")
    return values


def _expand_gemm(section: dict, spec: ModelSpec, where: str) -> list[Point]:
    shapes = spec.gemm_shapes()        # a dense model's five, in the order grids always had
    names = _names(section, "names", tuple(shapes), tuple(shapes), where)
    return [Point("gemm", name, m=m, n=shapes[name][0], k=shapes[name][1])
            for name in names for m in _ints(section, "m", where)]


def _expand_prefill(section: dict, spec: ModelSpec, where: str) -> list[Point]:
    patterns = _names(section, "patterns", PREFILL_PATTERNS, ["uniform"], where)
    points = []
    if {"num_seqs", "q", "s"} & set(section):
        for pattern, b, q, s in product(patterns, _ints(section, "num_seqs", where),
                                        _ints(section, "q", where), _ints(section, "s", where, minimum=0)):
            if pattern != "uniform" and b == 1:
                continue                           # one sequence has no spread to vary
            q_lens, kv_lens = prefill_batch(pattern, b, q, s)
            points.append(Point("attn_prefill", pattern, q_lens=q_lens, kv_lens=kv_lens))
    return points + _cases(section, "attn_prefill", where)


def _expand_decode(section: dict, spec: ModelSpec, where: str) -> list[Point]:
    patterns = _names(section, "patterns", DECODE_PATTERNS, ["uniform"], where)
    points = []
    if {"num_seqs", "s"} & set(section):
        for pattern, b, s in product(patterns, _ints(section, "num_seqs", where), _ints(section, "s", where)):
            if pattern != "uniform" and b == 1:
                continue
            points.append(Point("attn_decode", pattern, q_lens=(1,) * b, kv_lens=decode_kv_lens(pattern, b, s)))
    return points + _cases(section, "attn_decode", where)


def _expand_step(section: dict, spec: ModelSpec, where: str) -> list[Point]:
    points = []
    for i, batch in enumerate(section.get("batches", [])):
        here = f"{where}: batches[{i}]"
        _check_keys(batch, STEP_BATCH_KEYS, here)
        num_prefill = _ints(batch, "num_prefill", here, default=0, minimum=0)[0]
        num_decode = _ints(batch, "num_decode", here, default=0, minimum=0)[0]
        if num_prefill + num_decode == 0:
            raise InputError(f"{here}: a step needs num_prefill or num_decode > 0")
        q_lens, kv_lens = [], []
        if num_prefill:
            q = _ints(batch, "q", here)[0]
            s = _ints(batch, "s", here, default=0, minimum=0)[0]
            q_lens += [q] * num_prefill
            kv_lens += [s] * num_prefill
        if num_decode:
            pattern = batch.get("decode_pattern", "uniform")
            if pattern not in DECODE_PATTERNS:
                raise InputError(f"{here}: unknown decode_pattern {pattern!r}; "
                                 f"known: {', '.join(DECODE_PATTERNS)}")
            q_lens += [1] * num_decode
            kv_lens += list(decode_kv_lens(pattern, num_decode, _ints(batch, "decode_s", here)[0]))
        name = "mixed" if num_prefill and num_decode else ("prefill" if num_prefill else "decode")
        points.append(Point("step", name, q_lens=tuple(q_lens), kv_lens=tuple(kv_lens)))
    return points + _cases(section, "step", where)


def _expand_overhead(section: dict, spec: ModelSpec, where: str) -> list[Point]:
    points = []
    if {"num_seqs", "s"} & set(section):
        for b, s in product(_ints(section, "num_seqs", where), _ints(section, "s", where)):
            points.append(Point("overhead", "decode", q_lens=(1,) * b, kv_lens=(s,) * b))
    return points + _cases(section, "overhead", where)


def is_probe_batch(q_lens, kv_lens) -> bool:
    """Whether every sequence is a decode (q = 1 over s > 0) or a prefill from scratch (s = 0): the
    batches an engine can be held at (profiler.engine.probe) without choosing the scheduler's chunks."""
    return all((q == 1 and s > 0) or (s == 0 and q >= 1) for q, s in zip(q_lens, kv_lens))


def check_host_batch(q_lens, kv_lens, where: str) -> None:
    """A host point's batch is one an engine can be held at (is_probe_batch)."""
    for q, s in zip(q_lens, kv_lens):
        if not is_probe_batch([q], [s]):
            raise InputError(f"{where}: a host batch holds decodes (q=1, s>0) and prefills (s=0); "
                             f"got q={q}, s={s}")


def _expand_host(section: dict, spec: ModelSpec, where: str) -> list[Point]:
    """Decodes (b sequences at s) and single fresh prefills of q tokens; cases for mixed steps."""
    points = _expand_overhead({k: v for k, v in section.items() if k in ("num_seqs", "s")}, spec, where)
    points = [Point("host", p.name, q_lens=p.q_lens, kv_lens=p.kv_lens) for p in points]
    points += [Point("host", "prefill", q_lens=(q,), kv_lens=(0,)) for q in _ints(section, "prefill_q", where)] \
        if "prefill_q" in section else []
    cases = _cases(section, "host", where)
    for i, point in enumerate(cases):
        check_host_batch(point.q_lens, point.kv_lens, f"{where}: cases[{i}]")
    return points + cases


def _cases(section: dict, op: str, where: str) -> list[Point]:
    """Explicit batches: [{q_lens = [...], kv_lens = [...], name = "..."}]."""
    points = []
    for i, case in enumerate(section.get("cases", [])):
        here = f"{where}: cases[{i}]"
        _check_keys(case, {"q_lens", "kv_lens", "name"}, here)
        q_lens = _ints(case, "q_lens", here)
        kv_lens = _ints(case, "kv_lens", here, minimum=0)
        if len(q_lens) != len(kv_lens):
            raise InputError(f"{here}: q_lens and kv_lens must have the same length")
        if op == "attn_decode" and any(q != 1 for q in q_lens):
            raise InputError(f"{here}: a decode brings one token per sequence (q_lens all 1)")
        points.append(Point(op, str(case.get("name", "case")), q_lens=tuple(q_lens), kv_lens=tuple(kv_lens)))
    return points


def _expand_moe(section: dict, spec: ModelSpec, where: str) -> list[Point]:
    """Routed experts over num_tokens tokens, per distribution (none for a dense model)."""
    distributions = section.get("distributions", ["balanced"])
    if not isinstance(distributions, list) or not distributions:
        raise InputError(f"{where}: distributions must be a non-empty list")
    for name in distributions:
        power_law_alpha(name, where)                   # validated for any model
    num_tokens = _ints(section, "num_tokens", where)
    if not spec.is_moe:
        return []
    return [Point("moe", name, m=t) for name in distributions for t in num_tokens]


def _expand_elementwise(section: dict, spec: ModelSpec, where: str) -> list[Point]:
    """Each operator at each row count: tokens for the per-token operators, sequences (one decode
    token each) for sample and kv_store. m: the rows."""
    known = TOKEN_ELEMENTWISE + HEAD_NORMS + SEQ_ELEMENTWISE
    names = _names(section, "names", known, known, where)
    if not spec.num_ffn_dense_layers:     # every FFN is routed experts: the moe op times them
        names = [name for name in names if name != "mlp_act"]
    if not spec.qk_norm:                  # no per-head norms to time
        names = [name for name in names if name not in HEAD_NORMS]
    tokens = _ints(section, "num_tokens", where, default=[])
    seqs = _ints(section, "num_seqs", where, default=[])
    for name in names:
        key, sizes = ("num_seqs", seqs) if name in SEQ_ELEMENTWISE else ("num_tokens", tokens)
        if not sizes:
            raise InputError(f"{where}: {name} is timed over {key}; give {key} = [...] (or leave {name} "
                             f"out of names)")
    return [Point("elementwise", name, m=m) for name in names
            for m in (seqs if name in SEQ_ELEMENTWISE else tokens)]


def _expand_serve(section: dict, spec: ModelSpec, where: str) -> list[Point]:
    """One point per served workload (profiler.serve); m is its concurrency."""
    _ints(section, "rounds", where, default=1)
    return [Point("serve", w.name, m=w.concurrency) for w in serve_workloads(section, where)]


def serve_workloads(section: dict, where: str) -> list:
    """The profiler.serve.Workloads of a [serve] section: every scheduler at every concurrency."""
    from stepcal.profiler.serve import Workload
    concurrency = _ints(section, "concurrency", where)
    per_seq = section.get("requests_per_seq", 2)
    min_requests = section.get("min_requests", 8)
    for key, value in (("requests_per_seq", per_seq), ("min_requests", min_requests)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise InputError(f"{where}: {key} must be a positive number, got {value!r}")
    prompt = _length_range(section.get("prompt", [16, 1024]), f"{where}: prompt")
    output = _length_range(section.get("output", [4, 128]), f"{where}: output")
    schedulers = section.get("schedulers", ["continuous", "sarathi:64"])
    workloads = []
    for text in schedulers if isinstance(schedulers, list) else [schedulers]:
        scheduler, chunk = _serve_scheduler(text, f"{where}: schedulers")
        for c in concurrency:
            n = max(int(min_requests), int(round(per_seq * c)))
            workloads.append(Workload(scheduler, chunk, c, n, prompt, output))
    return workloads


def _serve_scheduler(text, where: str) -> tuple[str, int]:
    """'continuous', 'vllm', or 'sarathi:CHUNK' (sarathi's default chunk without one)."""
    from stepcal.profiler.serve import SCHEDULERS
    name, _, chunk = str(text).partition(":")
    if name not in SCHEDULERS:
        raise InputError(f"{where}: unknown scheduler {text!r}; known: continuous, sarathi:CHUNK, vllm")
    if name != "sarathi":
        if chunk:
            raise InputError(f"{where}: only sarathi takes a chunk size, got {text!r}")
        return name, 0
    from stepcal.simulator.schedulers import SchedulerConfig
    if not chunk:
        return name, SchedulerConfig().chunk_size
    if not chunk.isdigit() or int(chunk) < 1:
        raise InputError(f"{where}: sarathi's chunk must be a positive integer, got {text!r}")
    return name, int(chunk)


def _length_range(values, where: str) -> tuple[int, int]:
    if (not isinstance(values, list) or len(values) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in values)
            or not 1 <= values[0] <= values[1]):
        raise InputError(f"{where}: expected [low, high] with 1 <= low <= high, got {values!r}")
    return int(values[0]), int(values[1])


_EXPANDERS = {"gemm": _expand_gemm, "attn_prefill": _expand_prefill, "attn_decode": _expand_decode,
              "step": _expand_step, "overhead": _expand_overhead, "host": _expand_host, "moe": _expand_moe,
              "elementwise": _expand_elementwise, "serve": _expand_serve}


# --- heterogeneous batches -----------------------------------------------------------------

def _rng(*parts) -> np.random.Generator:
    seed = int(hashlib.sha1(json.dumps(parts).encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed)


def decode_kv_lens(pattern: str, num_seqs: int, kv_len: int) -> tuple[int, ...]:
    """KV lengths of num_seqs decodes; kv_len is the common length (uniform) or the longest.

    log_uniform: spread log-uniformly over [kv_len/64, kv_len] (one sequence at kv_len);
    one_long: one sequence at kv_len, the others at kv_len/32.
    """
    if pattern == "uniform":
        return (kv_len,) * num_seqs
    floor = max(1, kv_len // 32) if pattern == "one_long" else max(1, kv_len // 64)
    if pattern == "one_long":
        return (kv_len,) + (floor,) * (num_seqs - 1)
    if pattern == "log_uniform":
        rng = _rng(pattern, num_seqs, kv_len)
        lens = np.exp(rng.uniform(np.log(floor), np.log(kv_len), size=num_seqs)).astype(int)
        lens[0] = kv_len
        return tuple(int(x) for x in np.clip(lens, 1, kv_len))
    raise ValueError(f"unknown decode pattern {pattern!r}")


def prefill_batch(pattern: str, num_seqs: int, q_len: int, kv_len: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Chunks of num_seqs prefills; ragged: q log-uniform in [q/8, q], s uniform in [0, s]."""
    if pattern == "uniform":
        return (q_len,) * num_seqs, (kv_len,) * num_seqs
    if pattern == "ragged":
        rng = _rng(pattern, num_seqs, q_len, kv_len)
        low = max(1, q_len // 8)
        q = np.exp(rng.uniform(np.log(low), np.log(q_len), size=num_seqs)).round().astype(int)
        s = rng.integers(0, kv_len + 1, size=num_seqs)
        q[0], s[0] = q_len, kv_len                 # the largest chunk is always there
        return tuple(int(x) for x in np.clip(q, 1, q_len)), tuple(int(x) for x in s)
    raise ValueError(f"unknown prefill pattern {pattern!r}")


# --- routing distributions -----------------------------------------------------------------

def power_law_alpha(distribution, where: str = "moe") -> float | None:
    """None for "balanced", alpha for "power_law_<alpha>" (alpha > 0); else an InputError."""
    if distribution == "balanced":
        return None
    if isinstance(distribution, str) and distribution.startswith(POWER_LAW):
        try:
            alpha = float(distribution[len(POWER_LAW):])
        except ValueError:
            alpha = None
        if alpha is not None and np.isfinite(alpha) and alpha > 0:
            return alpha
    raise InputError(f"{where}: unknown distribution {distribution!r}; known: balanced, "
                     f"{POWER_LAW}<alpha> with alpha > 0 (e.g. power_law_1.01)")


def expert_loads(distribution: str, num_tokens: int, num_experts: int, top_k: int) -> np.ndarray:
    """Token slots each expert receives when num_tokens tokens pick top_k experts each: int64
    [num_experts], summing to num_tokens * top_k, none above num_tokens (a token picks an expert
    at most once).

    balanced: as equal as integers allow. power_law_<alpha>: loads drawn from a power law of
    exponent alpha, scaled to the slot count, as AIConfigurator's MoE tables are: on
    [1, 0.8 num_tokens] when there are more slots than experts, else on [0.01, 2]. Seeded by the
    point (distribution and shape), so every host times the same loads."""
    slots = num_tokens * top_k
    alpha = power_law_alpha(distribution)
    if alpha is None:
        loads = np.full(num_experts, slots // num_experts, dtype=np.int64)
        loads[:slots % num_experts] += 1
        return loads
    low, high = (1.0, 0.8 * num_tokens) if slots > num_experts else (0.01, 2.0)
    rng = _rng("moe", distribution, num_tokens, num_experts, top_k)
    draws = _power_law_draws(rng, num_experts, alpha, low, high)
    return _cap_loads(_round_to_total(draws / draws.sum() * slots, slots), num_tokens)


def routed_expert_ids(distribution: str, num_tokens: int, num_experts: int, top_k: int) -> np.ndarray:
    """The experts of each token, [num_tokens, top_k], with expert_loads' loads.

    Slots are dealt expert by expert (most loaded first) down the columns: token t takes slots
    t, t + T, t + 2T, ... An expert's run of at most T consecutive slots then falls on distinct
    tokens, so no token gets an expert twice."""
    loads = expert_loads(distribution, num_tokens, num_experts, top_k)
    order = np.argsort(-loads, kind="stable")
    slots = np.repeat(order, loads[order])
    return slots.reshape(top_k, num_tokens).T.copy()


def _power_law_draws(rng: np.random.Generator, size: int, alpha: float, low: float, high: float) -> np.ndarray:
    """Inverse-CDF draws of a power law x^-alpha truncated to [low, high]."""
    u = rng.uniform(size=size)
    if abs(alpha - 1.0) < 1e-9:                        # the density 1/x: log-uniform
        return low * (high / low) ** u
    a = 1.0 - alpha
    return (low ** a + u * (high ** a - low ** a)) ** (1.0 / a)


def _round_to_total(values: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to total, each the floor or ceiling of its value (largest remainders up)."""
    floors = np.floor(values).astype(np.int64)
    short = total - int(floors.sum())
    floors[np.argsort(-(values - floors), kind="stable")[:short]] += 1
    return floors


def _cap_loads(loads: np.ndarray, cap: int) -> np.ndarray:
    """No load above cap: the excess goes to the most loaded experts still below it (the skew
    stays where it was)."""
    excess = int(np.maximum(loads - cap, 0).sum())
    loads = np.minimum(loads, cap)
    for expert in np.argsort(-loads, kind="stable"):
        if excess == 0:
            break
        extra = min(cap - int(loads[expert]), excess)
        loads[expert] += extra
        excess -= extra
    return loads
