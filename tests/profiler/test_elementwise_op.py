"""The `elementwise` op: the step's work besides GEMMs and attention, timed on the model's own modules."""
from dataclasses import replace

import pandas as pd
import pytest
import torch

from stepcal.core.errors import InputError
from stepcal.core.model_spec import HEAD_NORMS, PRESETS, SEQ_ELEMENTWISE, TOKEN_ELEMENTWISE, elementwise_widths_of
from stepcal.costmodel.fitting import MIN_ROWS
from stepcal.costmodel.importers.native import import_profile
from stepcal.profiler.builtin_grids import QUICK
from stepcal.profiler.engine.paged import held_batch
from stepcal.profiler.grid import expand_grid
from stepcal.profiler.op_context import OpContext
from stepcal.profiler.ops import build_kernel, estimate_bytes
from stepcal.profiler.point import Point
from stepcal.profiler.sweep import SweepConfig, run_sweep

TINY = PRESETS["tiny"]
FAST = {"max_point_s": 0.02, "min_repeats": 3, "warmup": 1, "target_rel_precision": 0.05}


def ctx(spec=TINY):
    return OpContext(spec, "cpu", "float32", seed=5)


def test_the_quick_grid_times_every_operator_at_enough_sizes_for_a_fit():
    points = expand_grid("quick", QUICK, TINY).for_ops(("elementwise",)).points
    sizes = pd.Series([p.name for p in points]).value_counts()
    assert set(sizes.index) == set(TOKEN_ELEMENTWISE + SEQ_ELEMENTWISE)
    assert (sizes >= MIN_ROWS).all()
    # per-sequence operators run over sequences, up to a batch the engine holds; per-token ones over tokens
    assert max(p.m for p in points if p.name == "kv_store") == 256
    assert max(p.m for p in points if p.name == "add") == 4096


def test_names_choose_operators_and_an_unknown_one_is_refused():
    grid = expand_grid("g", {"elementwise": {"names": ["add", "sample"], "num_tokens": [2, 8], "num_seqs": [3]}}, TINY)
    assert [(p.name, p.m) for p in grid.points] == [("add", 2), ("add", 8), ("sample", 3)]
    with pytest.raises(InputError, match=r"grid: \[elementwise\]: unknown names \['rmsnorm'\]; known: emb, "):
        expand_grid("g", {"elementwise": {"names": ["rmsnorm"], "num_tokens": [1]}}, TINY)
    # an operator without its sizes would make no points, silently: refused, naming the key
    with pytest.raises(InputError, match=r"grid: \[elementwise\]: sample is timed over num_seqs; give num_seqs"):
        expand_grid("g", {"elementwise": {"num_tokens": [1, 2]}}, TINY)


def test_a_model_whose_every_ffn_is_experts_has_no_activation_point():
    all_moe = replace(PRESETS["tiny-moe"], num_dense_layers=0)
    names = {p.name for p in expand_grid("quick", QUICK, all_moe).for_ops(("elementwise",)).points}
    assert "mlp_act" not in names and "add" in names
    assert "mlp_act" in {p.name for p in expand_grid("quick", QUICK, PRESETS["tiny-moe"]).points}


def test_a_model_with_head_norms_times_them_and_rope_apart():
    """A qk_norm model (Qwen3) has two more per-token operators; attn_rope stays RoPE alone, as Vidur's
    is, so the composition does not count the norms twice."""
    qk = replace(TINY, qk_norm=True)
    names = {p.name for p in expand_grid("quick", QUICK, qk).for_ops(("elementwise",)).points}
    assert names == set(TOKEN_ELEMENTWISE + HEAD_NORMS + SEQ_ELEMENTWISE)
    assert not set(HEAD_NORMS) & {p.name for p in expand_grid("quick", QUICK, TINY).points}
    context = ctx(qk)
    layer = context.model().layers[0]
    for name, heads in (("q_norm", 4), ("k_norm", 2)):
        out = build_kernel(Point("elementwise", name, m=7), context).run(0)
        assert tuple(out.shape) == (7, heads, 64)
        assert torch.allclose(out.pow(2).mean(-1), torch.ones(7, heads), atol=1e-4)   # unit RMS per head
    with torch.no_grad():
        layer.q_norm.weight.fill_(2.0)
    qkv = torch.randn(3, 4 * 64 + 2 * 2 * 64)
    cos, sin = context.model().rotary.tables(torch.arange(3), 3, torch.float32)
    timed = build_kernel(Point("elementwise", "attn_rope", m=3), context).run(0)[0]
    assert tuple(timed.shape) == (3, 4, 64)
    plain, normed = layer.rope(qkv, cos, sin, norm_heads=False)[0], layer.rope(qkv, cos, sin)[0]
    assert torch.allclose(normed.pow(2).mean(-1), torch.full((3, 4), 4.0), atol=1e-3)   # weight 2: RMS 2
    assert not torch.allclose(plain, normed)
    with pytest.raises(InputError, match="has no per-head norms"):
        build_kernel(Point("elementwise", "q_norm", m=2), ctx()).run(0)


@pytest.mark.parametrize("name, shapes", [
    ("emb", [(7, 256), (7, 64), (7, 64)]),                    # hidden states, RoPE cos and sin
    ("input_layernorm", [(7, 256)]),
    ("post_attention_layernorm", [(7, 256)]),
    ("attn_rope", [(7, 4, 64), (7, 2, 64), (7, 2, 64)]),     # q, k, v in heads
    ("mlp_act", [(7, 688)]),
    ("add", [(7, 256)]),
    ("sample", [(7, 256), (7,)]),                             # final norm of 7 sequences, their tokens
])
def test_each_operator_computes_what_the_model_computes_at_its_rows(name, shapes):
    run = build_kernel(Point("elementwise", name, m=7), ctx()).run
    out = run(0)
    out = out if isinstance(out, tuple) else (out,)
    assert [tuple(t.shape) for t in out] == shapes


def test_a_kv_store_puts_each_new_token_where_that_sequences_attention_reads_it():
    model = ctx().model()
    inputs, copies = held_batch(model, [1, 1, 1], [64, 20, 5], 16, torch.Generator().manual_seed(0))
    k = torch.randn(3, TINY.num_kv_heads, TINY.head_dim)
    v = torch.randn(3, TINY.num_kv_heads, TINY.head_dim)
    inputs.kv.store(0, k, v, inputs)
    for i, (keys, values) in enumerate(inputs.kv.sequences(0, inputs)):
        s = inputs.kv_lens[i]
        assert keys.shape[2] == s + 1
        assert torch.equal(keys[0, :, s], k[i]) and torch.equal(values[0, :, s], v[i])
    assert [c.length for c in copies] == [64, 20, 5]      # a store advances nothing: every timed call is the same


def test_rows_carry_the_operators_width_and_import_as_elementwise_records(tmp_path):
    source = {"timing": FAST, "elementwise": {"names": ["attn_rope", "kv_store"], "num_tokens": [1, 32],
                                              "num_seqs": [2]}}
    grid = expand_grid("small", source, TINY)
    run_sweep(SweepConfig(spec=TINY, device="cpu", dtype="float32", ops=("elementwise",), grid=grid,
                          shard=(0, 1)), tmp_path, progress=False)
    frame = pd.read_parquet(tmp_path / "profile.parquet")
    widths = elementwise_widths_of(256, 4, 2, 64, 688, 2048)
    assert list(zip(frame["name"], frame["num_tokens"], frame["width"], frame["tp"])) == [
        ("attn_rope", 1, widths["attn_rope"], 1), ("attn_rope", 32, widths["attn_rope"], 1),
        ("kv_store", 2, widths["kv_store"], 1)]
    assert (frame["time_ms"] > 0).all() and (frame["status"] == "ok").all()
    records = import_profile(frame, "profile.parquet")
    assert set(records["op"]) == {"elementwise"} and list(records["width"]) == list(frame["width"])


def test_memory_estimate_counts_the_logits_and_the_kv_pool():
    c = ctx()
    c.model()
    small, large = (estimate_bytes(Point("elementwise", "sample", m=m), c) for m in (1, 256))
    assert large > 200 * small > 0
    store = estimate_bytes(Point("elementwise", "kv_store", m=64), c)
    assert store > estimate_bytes(Point("elementwise", "add", m=64), c)


def test_the_profile_command_offers_every_op_the_grid_knows():
    from stepcal.experiments.profiling import OPS as COMMAND_OPS  # kept apart so that --help needs no numpy
    from stepcal.profiler.grid import OPS
    assert COMMAND_OPS == OPS and "elementwise" in OPS
