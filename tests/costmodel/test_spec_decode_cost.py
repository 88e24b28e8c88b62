"""The cost of a speculative decoding step: verify as decodes, the drafter's passes, and the CLI."""
import json
import re

import numpy as np
import pytest

from stepcal.core.batch import StepFeatures, feature_row
from stepcal.core.errors import InputError
from stepcal.costmodel.spec_decode import (
    ConstDrafter,
    DraftedStepModel,
    HeadPass,
    PassesDrafter,
    attention_tiles,
    decode_row,
    make_drafter,
)
from stepcal.costmodel.table_meta import TableMeta
from stepcal.costmodel.tables import TableStepModel
from stepcal.costmodel.terms import DecodeAttention, FeatureCurve, PrefillAttention
from stepcal.experiments.cli import main
from stepcal.simulator.spec_decode import verify_feature_row
from stepcal.simulator.step_model import ConstStepModel

SPEC = {"num_layers": 4, "num_heads": 32, "num_kv_heads": 8, "vocab_size": 1000}


def _curve(name, axis, base_ms, per_unit_ms):
    knots = np.array([1.0, 4096.0])
    return FeatureCurve(name, axis, knots, base_ms + per_unit_ms * knots, np.zeros(2), name)


def _grid(kind, name, per_unit_ms):
    a, b = np.array([1.0, 256.0]), np.array([1.0, 8192.0])
    values = per_unit_ms * np.outer(a, b) ** 0.5
    return kind(name, (a, b), values, np.zeros_like(values), name)


def tables() -> TableStepModel:
    """4 layers; GEMMs 1 ms + 0.01 ms a token, LM head 0.5 ms + 0.001 a sequence, attention grids."""
    terms = [_curve("linear", "num_tokens", 1.0, 0.01), _curve("lm_head", "num_seqs", 0.5, 0.001),
             _curve("sampling", "num_seqs", 0.0, 0.002), _grid(DecodeAttention, "decode_attn", 0.01),
             _grid(PrefillAttention, "prefill_attn", 0.02)]
    return TableStepModel(terms, TableMeta(model_spec=SPEC, num_layers=4))


def test_a_verify_step_is_priced_with_decode_attention_not_prefill():
    table = tables()
    q, kv, drafts = np.array([4, 4]), np.array([500, 900]), np.array([3, 3])
    verify = table.term_ms(StepFeatures.from_row(verify_feature_row(q, kv, drafts)))
    as_prefill = table.term_ms(StepFeatures.from_row(feature_row(q, kv)))
    assert verify["prefill_attn"][0] == 0 and verify["decode_attn"][0] > 0
    assert as_prefill["decode_attn"][0] == 0
    # the GEMMs see every token of the step either way
    assert verify["linear"][0] == pytest.approx(1.0 + 0.01 * 8)


def test_a_head_pass_is_its_layers_share_of_the_target_plus_a_scaled_lm_head():
    table = tables()
    row = verify_feature_row(np.array([3]), np.array([100]), np.array([2]))
    parts = {t.name: max(t.row_ms(row), 0.0) for t in table.terms}
    layers = parts["linear"] + parts["decode_attn"] + parts["prefill_attn"]
    head = HeadPass(table, num_layers=1, vocab_ratio=0.25)
    assert head.row_ms(row) == pytest.approx(layers / 4 + 0.25 * (parts["lm_head"] + parts["sampling"]))


def test_the_drafter_runs_one_pass_over_the_step_then_k_minus_one_over_one_token_each():
    table = tables()
    head = HeadPass(table, 1, 1.0)
    row = verify_feature_row(np.array([4, 30]), np.array([100, 0]), np.array([3, 0]))
    later = decode_row(row)
    assert later[:3] == (2, 2, 2) and later[5] == 0 and later[7] == 100 + 34
    drafter = PassesDrafter(head, 3)
    assert drafter.row_ms(row) == pytest.approx(head.row_ms(row) + 2 * head.row_ms(later))
    # the cached path of the later passes gives the same bits, before and after its cache fills
    for kv in (10, 500, 10, 3000):
        later = decode_row(verify_feature_row(np.array([4, 2]), np.array([kv, 7]), np.array([3, 1])))
        assert head.decode_row_ms(later) == head.row_ms(later)


def test_row_and_vectorised_paths_agree():
    table = tables()
    model = DraftedStepModel(table, PassesDrafter(HeadPass(table, 1, 0.3), 4), attention_tiles=2)
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 6))
        q = rng.integers(1, 6, n)
        kv = rng.integers(1, 2000, n)
        row = verify_feature_row(q, kv, q - 1)
        assert model.row_ms(row) == pytest.approx(float(model.features_ms(StepFeatures.from_row(row))[0]))
        split = model.split_ms(row)
        assert sum(split.values()) == pytest.approx(model.row_ms(row))


def test_attention_tiles_count_the_query_rows_of_a_kv_head():
    table = tables()   # 4 query heads per KV head: (1 + k) x 4 rows in tiles of 64
    assert [attention_tiles(table, k) for k in (1, 7, 15, 16, 31, 32)] == [1, 1, 1, 2, 2, 3]
    assert attention_tiles(None, 7) == 1


def test_more_drafts_cost_more_and_verify_costs_more_than_a_decode():
    table = tables()
    row_decode = feature_row(np.array([1]), np.array([500]))
    row_verify = verify_feature_row(np.array([4]), np.array([500]), np.array([3]))
    costs = [DraftedStepModel(table, PassesDrafter(HeadPass(table, 1, 1.0), k)).row_ms(row_verify)
             for k in (1, 2, 3)]
    assert costs[0] < costs[1] < costs[2]
    assert table.row_ms(row_verify) > table.row_ms(row_decode)


def test_drafter_specs_and_their_errors(tmp_path):
    table = tables()
    drafter, label = make_drafter(None, "ngram", 3, table, None)
    assert isinstance(drafter, ConstDrafter) and drafter.time_ms == 0 and label == "const:0"
    drafter, _ = make_drafter(None, "eagle", 3, table, None)
    assert drafter.one_pass.num_layers == 1 and drafter.num_passes == 3
    drafter, _ = make_drafter("head:2,250", "mtp", 2, table, None)
    assert drafter.one_pass.vocab_ratio == pytest.approx(0.25) and drafter.one_pass.num_layers == 2
    drafter, label = make_drafter(str(tmp_path), "draft-model", 3, table, lambda path: ConstStepModel(1.5))
    assert drafter.row_ms(feature_row(np.array([1]), np.array([5]))) == pytest.approx(4.5)
    for text, method, target, message in [
            (None, "draft-model", table, "needs --drafter"),
            ("head:1", "eagle", ConstStepModel(5.0), "target's T_step tables"),
            ("head:0", "eagle", table, "LAYERS >= 1"),
            ("head:1,2,3", "eagle", table, "expected head"),
            ("const:-1", "ngram", table, ">= 0"),
            ("const:abc", "ngram", table, "not a number"),
            (str(tmp_path / "missing"), "draft-model", table, "T_step table directory")]:
        with pytest.raises(InputError, match=message):
            make_drafter(text, method, 3, target, None)


def _trace(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,20,40\n0.01,30,60\n0.02,7,33\n")
    return str(path)


def test_simulate_writes_the_spec_decode_counters(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["simulate", "--trace", _trace(tmp_path), "--step-model", "const:10", "--spec-decode", "ngram:3",
                 "--acceptance", "rates:0.9,0.7", "--drafter", "const:0.5", "--quiet", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    spec = summary["spec_decode"]
    assert spec["method"] == "ngram" and spec["k"] == 3 and spec["num_drafts"] > 0
    assert spec["num_accepted_tokens"] == spec["num_accepted_tokens_per_pos"][0] + sum(
        spec["num_accepted_tokens_per_pos"][1:])
    assert spec["acceptance_length"] == pytest.approx(1 + spec["num_accepted_tokens"] / spec["num_drafts"])
    assert summary["mean_tokens_per_step"] > 1
    assert "drafter const:0.5" in summary["step_model"]


@pytest.mark.parametrize("flags, message", [
    (["--spec-decode", "eagle:0", "--acceptance", "mean:1.5"], "k must be in 1..128"),
    (["--spec-decode", "mtp:300", "--acceptance", "mean:1.5"], "k must be in 1..128"),
    (["--spec-decode", "eagle:2", "--acceptance", "rates:0.4,0.6"], "must not rise"),
    (["--spec-decode", "eagle:2", "--acceptance", "rates:1.01"], r"\[0, 1\]"),
    (["--spec-decode", "eagle:2", "--acceptance", "mean:2"], "target's T_step tables"),
    (["--spec-decode", "draft-model:2", "--acceptance", "mean:2"], "needs --drafter"),
    (["--acceptance", "mean:2"], "needs --spec-decode"),
    (["--spec-decode", "ngram:2", "--acceptance", "mean:2", "--scheduler", "static"], "no speculative decoding"),
])
def test_bad_spec_decode_flags_exit_2_with_one_line_and_nothing_written(tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    code = main(["simulate", "--trace", _trace(tmp_path), "--step-model", "const:10", *flags, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.count("\n") == 1 and err.startswith("stepcal: ") and re.search(message, err)


def test_the_lm_head_and_sampling_run_on_every_verified_position():
    table = tables()   # LM head 0.5 ms + 0.001 ms a row, sampling 0.002 ms a row
    model = DraftedStepModel(table, ConstDrafter(0.0))
    verify = verify_feature_row(np.array([4, 1, 30]), np.array([100, 50, 0]), np.array([3, 0, 0]))
    # 4 + 1 decode rows and one for the prefill: 6 rows where the tables see 3 sequences
    assert model.row_ms(verify) - table.row_ms(verify) == pytest.approx(3 * (0.001 + 0.002))
    assert model.split_ms(verify)["verify_extra"] == pytest.approx(0.009)
    plain = feature_row(np.array([1, 1]), np.array([100, 50]))
    assert model.row_ms(plain) == table.row_ms(plain)
    assert float(model.features_ms(StepFeatures.from_row(verify))[0]) == pytest.approx(model.row_ms(verify))
