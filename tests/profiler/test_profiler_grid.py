"""Grids: built-in and file grids, patterns, keys, shards."""
import json

import pytest

from stepcal.core.errors import InputError
from stepcal.core.model_spec import PRESETS
from stepcal.profiler.batches import decode_kv_lens, prefill_batch
from stepcal.profiler.builtin_grids import BUILT_IN
from stepcal.profiler.grid import expand_grid, load_grid, parse_shard
from stepcal.profiler.point import Point

TINY = PRESETS["tiny"]


def test_quick_grid_covers_every_op_with_model_shapes():
    grid = load_grid("quick", TINY)
    ops = {p.op for p in grid.points}
    assert ops == {"gemm", "attn_prefill", "attn_decode", "step", "overhead", "host", "elementwise", "serve"}
    gemms = [p for p in grid.points if p.op == "gemm"]
    assert {(p.name, p.n, p.k) for p in gemms if p.m == 1} == {
        (name, n, k) for name, (n, k) in TINY.gemm_shapes().items()}
    assert len({p.key for p in grid.points}) == len(grid.points)
    patterns = {p.name for p in grid.points if p.op == "attn_decode"}
    assert patterns == {"uniform", "log_uniform", "one_long"}


@pytest.mark.parametrize("spec", ["tiny", "tiny-moe"])
def test_every_target_of_the_quick_grid_has_the_rows_a_fit_needs(spec):
    """One profile of the quick grid fits every target (costmodel.fitting skips one with fewer rows:
    the overhead op's five points were skipped so, and its term missed from the kernel tables)."""
    from collections import Counter

    from stepcal.costmodel.features import target_of
    from stepcal.costmodel.fitting import MIN_ROWS
    rows = Counter(target_of(p.op, p.name) for p in load_grid("quick", PRESETS[spec]).points)
    assert {target: n for target, n in rows.items() if n < MIN_ROWS} == {}
    assert {"overhead", "host", "step", "elementwise:add", "elementwise:kv_store"} <= set(rows)


def test_host_points_are_decodes_fresh_prefills_and_mixes_of_both():
    points = [p for p in load_grid("quick", TINY).points if p.op == "host"]
    assert len(points) >= 8     # costmodel.fitting fits a target from 8 rows
    for p in points:
        assert all((q == 1 and s > 0) or s == 0 for q, s in zip(p.q_lens, p.kv_lens))
    assert {p.name for p in points} == {"decode", "prefill", "mixed"}
    source = {"host": {"cases": [{"q_lens": [64, 1], "kv_lens": [128, 256]}]}}
    with pytest.raises(InputError, match=r"cases\[0\]: a host batch holds decodes .* got q=64, s=128$"):
        expand_grid("g", source, TINY)


def test_full_grid_is_dense_at_small_m_and_reaches_16k():
    ms = sorted({p.m for p in load_grid("full", PRESETS["llama-3-8b"]).points if p.op == "gemm"})
    assert ms[0] == 1 and ms[-1] == 16384
    assert len([m for m in ms if m <= 128]) >= 15


def test_keys_are_stable_and_distinguish_shapes():
    a = Point("attn_decode", "uniform", q_lens=(1, 1), kv_lens=(5, 6))
    assert a.key == Point("attn_decode", "uniform", q_lens=(1, 1), kv_lens=(5, 6)).key
    assert a.key != Point("attn_decode", "uniform", q_lens=(1, 1), kv_lens=(6, 5)).key
    assert a.key.startswith("attn_decode/uniform/b2/")
    assert Point("gemm", "o_proj", m=4, n=8, k=8).key.startswith("gemm/o_proj/m4/")


def test_heterogeneous_patterns():
    assert decode_kv_lens("uniform", 3, 100) == (100, 100, 100)
    assert decode_kv_lens("one_long", 4, 3200) == (3200, 100, 100, 100)
    spread = decode_kv_lens("log_uniform", 64, 4096)
    assert max(spread) == 4096 and min(spread) >= 64 and len(set(spread)) > 30
    assert spread == decode_kv_lens("log_uniform", 64, 4096)       # deterministic
    q, s = prefill_batch("ragged", 8, 512, 1024)
    assert q[0] == 512 and s[0] == 1024 and all(64 <= x <= 512 for x in q) and len(set(q)) > 1


def test_grid_file_json_and_toml(tmp_path):
    source = {"timing": {"max_point_s": 0.1},
              "gemm": {"m": [1, 8], "names": ["o_proj"]},
              "attn_decode": {"num_seqs": [2], "s": [64], "cases": [{"q_lens": [1, 1, 1],
                                                                    "kv_lens": [3, 30, 300]}]},
              "step": {"batches": [{"num_prefill": 1, "q": 16, "num_decode": 2, "decode_s": 32}]}}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(source))
    grid = load_grid(str(path), TINY)
    assert [p.op for p in grid.points] == ["gemm", "gemm", "attn_decode", "attn_decode", "step"]
    assert grid.timing == {"max_point_s": 0.1}
    step = grid.points[-1]
    assert step.q_lens == (16, 1, 1) and step.kv_lens == (0, 32, 32) and step.name == "mixed"
    toml = tmp_path / "g.toml"
    toml.write_text('[gemm]\nm = [2]\nnames = ["lm_head"]\n')
    (point,) = load_grid(str(toml), TINY).points
    assert (point.m, point.n, point.k) == (2, TINY.vocab_size, TINY.hidden_size)


@pytest.mark.parametrize("source, message", [
    ({"gemm": {"m": [0]}}, "m must hold integers >= 1"),
    ({"gemm": {"mm": [1]}}, "unknown keys"),
    ({"attention": {}}, "unknown grid sections"),
    ({"attn_decode": {"cases": [{"q_lens": [2], "kv_lens": [3]}]}}, "one token per sequence"),
    ({"attn_decode": {"num_seqs": [2], "s": [8], "patterns": ["zipf"]}}, "unknown patterns"),
    ({"step": {"batches": [{"num_decode": 0}]}}, "num_prefill or num_decode"),
])
def test_bad_grids_name_the_problem(source, message):
    with pytest.raises(InputError, match=message):
        expand_grid("g", source, TINY)


def test_limits_drop_points_over_the_token_budget():
    grid = expand_grid("g", {"limits": {"max_tokens": 64, "max_kv_tokens": 1000},
                             "gemm": {"m": [32, 64, 128], "names": ["o_proj"]},
                             "attn_decode": {"num_seqs": [1, 4], "s": [100, 500]}}, TINY)
    assert [p.m for p in grid.points if p.op == "gemm"] == [32, 64]
    assert all(p.kv_tokens <= 1000 for p in grid.points)


def test_shards_are_disjoint_and_cover_the_grid():
    grid = load_grid("quick", TINY)
    shards = [grid.shard(i, 3) for i in range(3)]
    keys = [p.key for shard in shards for p in shard]
    assert sorted(keys) == sorted(p.key for p in grid.points)
    assert all(len(s) > 20 for s in shards)
    assert parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "1", "a/b", "0/0"):
        with pytest.raises(InputError, match="--shard"):
            parse_shard(bad)


def test_built_in_grids_are_json_serialisable():
    for source in BUILT_IN.values():
        assert json.loads(json.dumps(source)) == source
