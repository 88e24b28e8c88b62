"""LLMServingSim's profile bundles (`fit --format llmservingsim`): the shared bundle's records, a
composed T_step against the hand-summed layers of a small bundle, and bad bundles refused."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stepcal.core.batch import StepBatch, feature_row
from stepcal.core.errors import InputError
from stepcal.core.model_spec import PRESETS, ModelSpec, Parallelism
from stepcal.costmodel.compose import compose_terms, data_axes, op_grids
from stepcal.costmodel.compose_comm import Composition
from stepcal.costmodel.fitting import FitConfig, fit_all
from stepcal.costmodel.importers.llmservingsim import import_bundle, skew_alpha
from stepcal.costmodel.tables import load_step_model
from stepcal.experiments.cli import main

BUNDLE = Path("profiles/llmservingsim/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16")
# Each layer's time in µs, flat over its axis, so the fitted forests reproduce it exactly and
# the composed step can be summed by hand.
DENSE_US = {"qkv_proj": 30.0, "o_proj": 20.0, "gate_up_proj": 60.0, "down_proj": 40.0, "layernorm": 3.0,
            "rotary_emb": 2.0, "act_fn": 4.0, "embedding": 5.0, "final_layernorm": 1.0}
SEQ_US = {"lm_head": 100.0, "sampler": 10.0}
DECODE_US, PREFILL_US, MIXED_US = 8.0, 50.0, 70.0
SPEC = ModelSpec("small", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                 ffn_size=688, vocab_size=2048, dtype="bfloat16")


def test_shared_bundle_records_follow_its_files(shared_data):
    variant = shared_data / BUNDLE
    spec = PRESETS["llama-3-8b"]    # Llama-3.1-8B's dimensions
    records = import_bundle(variant, spec)
    dense = pd.read_csv(variant / "tp1" / "dense.csv")
    per_seq = pd.read_csv(variant / "tp1" / "per_sequence.csv")
    attention = pd.read_csv(variant / "tp1" / "attention.csv")
    gemm_layers = dense["layer"].isin(["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    assert (records["op"] == "gemm").sum() == gemm_layers.sum() + (per_seq["layer"] == "lm_head").sum()
    decode = (attention["prefill_chunk"] == 0) & (attention["n_decode"] > 0)
    prefill = (attention["prefill_chunk"] > 0) & (attention["n_decode"] == 0)
    assert (records["op"] == "attn_decode").sum() == decode.sum()
    assert (records["op"] == "attn_prefill").sum() == prefill.sum()
    names = set(records.loc[records["op"] == "elementwise", "name"])
    assert names == {"emb", "input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "sample"}
    assert set(records["tp"]) == {1.0} and set(records["dtype"]) == {"bfloat16"}
    assert set(records["device"]) == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    # Times are µs in the files, ms in the records.
    qkv = records[(records["name"] == "qkv_proj") & (records["m"] == 1)].iloc[0]
    raw = dense[(dense["layer"] == "qkv_proj") & (dense["tokens"] == 1)]["time_us"].iloc[0]
    assert qkv["time_ms"] == pytest.approx(raw / 1000)
    # The tp2 folder holds one GPU's shard: the GEMMs' shapes are split.
    tp2 = import_bundle(variant / "tp2", spec)
    assert set(tp2["tp"]) == {2.0}
    assert tp2[tp2["name"] == "qkv_proj"]["n"].iloc[0] == qkv["n"] / 2


def _bundle(root: Path, **replace) -> Path:
    """A small bundle: one tp1 folder with every layer flat; `replace` swaps a file's text."""
    tp1 = root / "bf16" / "tp1"
    tp1.mkdir(parents=True)
    (root / "bf16" / "meta.yaml").write_text("gpu: NVIDIA RTX PRO 6000 Blackwell Server Edition\n"
                                             "variant: bf16\nmodel: small\ntp_degrees: [1]\n")
    tokens = [1, 2, 4, 8, 16, 32, 64, 128]
    dense = [f"{layer},{t},{us}" for layer, us in DENSE_US.items() for t in tokens]
    per_seq = [f"{layer},{s},{us}" for layer, us in SEQ_US.items() for s in (1, 2, 4, 8, 16, 32, 64, 128)]
    attention = [f"0,0,{n},{kv},{DECODE_US}" for n in (1, 2, 4, 8) for kv in (16, 64, 256, 1024)]
    attention += [f"{c},{kv},0,0,{PREFILL_US}" for c in (16, 64, 128) for kv in (0, 64, 256)]
    # Mixed calls: a 64-token chunk over no history beside n decodes (the pure prefill of that chunk is
    # measured, so each row's decode share is MIXED_US - PREFILL_US).
    attention += [f"64,0,{n},{kv},{MIXED_US}" for n in (1, 2, 4, 8) for kv in (16, 64, 256, 1024)]
    files = {"dense.csv": "layer,tokens,time_us\n" + "\n".join(dense),
             "per_sequence.csv": "layer,sequences,time_us\n" + "\n".join(per_seq),
             "attention.csv": "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n" + "\n".join(attention)}
    files.update(replace)
    for name, text in files.items():
        if text is not None:
            (tp1 / name).write_text(text + "\n")
    return root / "bf16"


def _fit(tmp_path, bundle: Path, out: Path, *extra: str) -> int:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC.to_dict()))
    return main(["fit", "--profile", str(bundle), "--format", "llmservingsim", "--model-spec", str(spec),
                 "--regressor", "rf", "--no-mlflow", "--out", str(out), *extra])


def test_composed_step_is_the_layers_summed(tmp_path):
    records = import_bundle(_bundle(tmp_path), SPEC)
    result = fit_all(records, FitConfig(regressor="rf"))
    p, composition = Parallelism(), Composition()
    axes = data_axes(result, SPEC, p, composition)
    terms = compose_terms(result, SPEC, p, axes, op_grids(result, SPEC, p, axes, composition), composition)
    layers = SPEC.num_layers
    # Per layer: the four GEMMs, two norms, RoPE, the activation and attention; per step: the
    # embedding, the LM head, the sampler and the final norm of the emitting row (one sequence).
    gemm_us = sum(DENSE_US[k] for k in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
    elementwise_us = layers * (2 * DENSE_US["layernorm"] + DENSE_US["rotary_emb"] + DENSE_US["act_fn"]) \
        + DENSE_US["embedding"]
    seq_us = SEQ_US["lm_head"] + SEQ_US["sampler"] + DENSE_US["final_layernorm"]
    for batch, attention, attention_us in ((StepBatch.of([0], [1], [64]), "decode_attn", DECODE_US),
                                           (StepBatch.of([0], [64], [0]), "prefill_attn", PREFILL_US)):
        ms = {t.name: float(np.maximum(t.evaluate(batch.features()), 0.0)[0]) for t in terms}
        # Flat per-layer times come back exactly; the GEMMs share one forest over (m, n, k).
        assert ms["elementwise"] == pytest.approx(elementwise_us / 1000)
        assert ms[attention] == pytest.approx(layers * attention_us / 1000)
        assert ms["lm_head"] + ms["sampling"] == pytest.approx(seq_us / 1000, rel=0.05)
        assert ms["linear"] == pytest.approx(layers * gemm_us / 1000, rel=0.05)
        assert sum(ms.values()) == pytest.approx(
            (layers * (gemm_us + attention_us) + elementwise_us + seq_us) / 1000, rel=0.02)


def test_mixed_calls_price_what_a_prefill_adds_to_the_decodes(tmp_path):
    records = import_bundle(_bundle(tmp_path), SPEC)
    mixed = records[records["op"] == "attn_decode_mixed"]
    assert len(mixed) == 16 and np.allclose(mixed["time_ms"], (MIXED_US - PREFILL_US) / 1000)
    result = fit_all(records, FitConfig(regressor="rf"))
    p, composition = Parallelism(), Composition()
    axes = data_axes(result, SPEC, p, composition)
    terms = {t.name: t for t in compose_terms(result, SPEC, p, axes, op_grids(result, SPEC, p, axes, composition),
                                              composition)}
    extra_ms = SPEC.num_layers * (MIXED_US - PREFILL_US - DECODE_US) / 1000
    both = (np.array([64, 1]), np.array([0, 64]))     # a chunk beside a decode: (q_lens, kv_lens)
    alone = (np.array([1]), np.array([64]))           # the decode on its own
    term = terms["mixed_decode_attn"]
    assert term.evaluate(StepBatch.of([0, 1], *both).features())[0] == pytest.approx(extra_ms)
    assert term.evaluate(StepBatch.of([1], *alone).features())[0] == 0.0
    # The simulator's one-step path gives the same answers.
    assert term.row_ms(feature_row(*both)) == pytest.approx(extra_ms) and term.row_ms(feature_row(*alone)) == 0.0


def test_fit_says_where_terms_came_from(tmp_path):
    out = tmp_path / "tables"
    bundle = _bundle(tmp_path)
    _skew(bundle)
    assert _fit(tmp_path, bundle, out, "--ops", "attn_decode,attn_decode_mixed") == 0
    meta = json.loads((out / "meta.json").read_text())
    attention_csv = [str(bundle / "tp1" / "attention.csv")]
    assert meta["llmservingsim"]["term_files"] == {"decode_attn": attention_csv, "mixed_decode_attn": attention_csv}
    assert any("skew.csv: decode_attn_skew adds 0.1000 x" in note for note in meta["notes"])
    assert meta["composition"]["decode_skew_alpha"] == pytest.approx(0.1)
    terms = load_step_model(out).term_ms(StepBatch.of([0], [1], [64]).features())
    assert terms["decode_attn"][0] == pytest.approx(SPEC.num_layers * DECODE_US / 1000)
    # The bundle names a GPU with a datasheet: the terms it lacks come from that GPU's memory roofline.
    assert meta["term_sources"]["elementwise"]["source"] == "roofline"


def _skew(bundle: Path) -> None:
    """A skew.csv whose pure-decode batches have alphas 0.0, 0.1 and 0.3 (median 0.1); mixed rows ignored."""
    (bundle / "tp1" / "skew.csv").write_text("regime,n,alpha\npure,2,0.0\npure,4,0.3\npure,8,0.1\nmixed,8,0.9\n")


def test_skew_prices_the_gap_to_the_longest_kv(tmp_path):
    bundle = _bundle(tmp_path)
    _skew(bundle)
    assert skew_alpha([bundle], None) == pytest.approx(0.1)
    out, plain = tmp_path / "skewed", tmp_path / "plain"
    assert _fit(tmp_path, bundle, out, "--ops", "attn_decode") == 0
    assert _fit(tmp_path, bundle, plain, "--ops", "attn_decode", "--no-skew") == 0
    skewed, uniform = load_step_model(out), load_step_model(plain)
    # The synthetic decode attention is flat in KV, so a gap in KV costs nothing; the term is there, and
    # a batch of equal KV lengths or of one decode gets zero from it.
    assert "decode_attn_skew" in json.loads((out / "meta.json").read_text())["t_step_terms"]
    assert "decode_attn_skew" not in json.loads((plain / "meta.json").read_text())["t_step_terms"]
    for batch in (StepBatch.of([0, 1], [1, 1], [64, 64]), StepBatch.of([0], [1], [900])):
        assert skewed.features_ms(batch.features())[0] == pytest.approx(uniform.features_ms(batch.features())[0])


def test_skew_term_looks_up_the_longest_and_the_mean_kv():
    from stepcal.costmodel.terms import DecodeSkew
    knots = (np.array([1.0, 8.0]), np.array([0.0, 1000.0]))
    grid = np.array([[0.0, 10.0], [0.0, 80.0]])          # decode attention: linear in KV, by batch
    term = DecodeSkew("decode_attn_skew", knots, 0.1 * grid, np.zeros_like(grid), "", alpha=0.1)
    q, kv = np.array([1, 1]), np.array([100, 900])          # two decodes: mean 500, longest 900
    f = StepBatch.of([0, 1], q, kv).features()
    at = lambda k: 0.1 * (10.0 + (80.0 - 10.0) * (2 - 1) / 7) * k / 1000   # noqa: E731  (grid at n=2)
    assert term.evaluate(f)[0] == pytest.approx(at(900) - at(500))
    assert term.row_ms(feature_row(q, kv)) == pytest.approx(at(900) - at(500))
    assert term.evaluate(StepBatch.of([0], [1], [900]).features())[0] == 0.0


@pytest.mark.parametrize("replace, message", [
    ({"per_sequence.csv": None}, "per_sequence.csv: no such file"),
    ({"dense.csv": "layer,tokens,time_us\nmystery_proj,1,3.0"}, "dense.csv: unknown layer(s) mystery_proj"),
    ({"attention.csv": "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,1,16,fast"},
     "attention.csv: row 0: column 'time_us' must be a finite positive time in µs, got 'fast'"),
])
def test_bad_bundle_exits_2_with_one_line(tmp_path, capsys, replace, message):
    out = tmp_path / "tables"
    assert _fit(tmp_path, _bundle(tmp_path, **replace), out) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_without_model_spec_or_with_a_missing_tp_folder(tmp_path):
    bundle = _bundle(tmp_path)
    with pytest.raises(InputError, match="--model-spec"):
        import_bundle(bundle, None)
    with pytest.raises(InputError, match="tp2: no such tp folder"):
        import_bundle(bundle, SPEC, tp=2)


def test_newer_attention_columns_keep_one_token_decodes(tmp_path):
    # Newer bundles name the prefill's mean causal key length and each decode's query tokens.
    text = ("layer,prefill_chunk,prefill_key,n_decode,kv_decode,decode_q_len,time_us\n"
            "attention,0,0,2,64,1,8.0\nattention,0,0,2,64,4,9.0\nattention,64,96,0,0,1,50.0")
    records = import_bundle(_bundle(tmp_path, **{"attention.csv": text}), SPEC)
    decode = records[records["op"] == "attn_decode"]
    prefill = records[records["op"] == "attn_prefill"].iloc[0]
    assert list(decode["time_ms"]) == [0.008]
    # A key length of 96 for a 64-token chunk: 64 cached tokens before it.
    assert prefill["kv_sum"] == 64 and prefill["prefill_attn_work"] == 64 * (64 + 65 / 2)
