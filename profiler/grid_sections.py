"""A grid's sections expanded into points, each section's keys and values checked.

Each op's section crosses its lists into points (batch patterns from profiler.batches, routing
distributions from profiler.routing); explicit `cases` add batches of their own. A [serve] section
may be a list of workload families, each expanded on its own (serve_workloads).
"""
from __future__ import annotations

from itertools import product

from stepcal.core.errors import InputError
from stepcal.core.model_spec import HEAD_NORMS, SEQ_ELEMENTWISE, TOKEN_ELEMENTWISE, ModelSpec
from stepcal.profiler.batches import (
    DECODE_PATTERNS,
    PREFILL_PATTERNS,
    check_host_batch,
    decode_kv_lens,
    prefill_batch,
)
from stepcal.profiler.point import Point
from stepcal.profiler.routing import power_law_alpha
from stepcal.profiler.serve import SCHEDULERS, Workload
from stepcal.simulator.schedulers import SchedulerConfig

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
STEP_BATCH_KEYS = {"num_prefill", "q", "s", "num_decode", "decode_s", "decode_pattern"}


def expand_section(op: str, section, spec: ModelSpec, where: str) -> list[Point]:
    """The points of one op's section for this model (of each family in turn where [serve] is a
    list), its keys checked."""
    points: list[Point] = []
    for part, at in _parts(op, section, where):
        _check_keys(part, SECTION_KEYS[op], at)
        points.extend(_EXPANDERS[op](part, spec, at))
    return points


def serve_rounds(section, workload_name: str) -> int:
    """The `rounds` of the [serve] family that serves the workload `workload_name` (1 where it sets
    none), the families read as expand_section reads them."""
    family = next((part for part, where in _parts("serve", section, "grid")
                   if workload_name in {w.name for w in serve_workloads(part, where)}), {})
    return _ints(family, "rounds", "grid: [serve]", default=1)[0]


def _parts(op: str, section, where: str) -> list[tuple[object, str]]:
    """(section, where) pairs: serve may be a list of sections (TOML [[serve]]), each a workload
    family of its own; every other op is one section."""
    if op == "serve" and isinstance(section, list):
        if not section:
            raise InputError(f"{where}: [serve] is an empty list")
        return [(part, f"{where}: [serve] #{i + 1}") for i, part in enumerate(section)]
    return [(section, f"{where}: [{op}]")]


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
    name, _, chunk = str(text).partition(":")
    if name not in SCHEDULERS:
        raise InputError(f"{where}: unknown scheduler {text!r}; known: continuous, sarathi:CHUNK, vllm")
    if name != "sarathi":
        if chunk:
            raise InputError(f"{where}: only sarathi takes a chunk size, got {text!r}")
        return name, 0
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
