"""Device datasheets, the element-wise memory roofline, and the elementwise and sampling terms
composition makes from measured operators or from the roofline."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from stepcal.core.batch import StepBatch, StepFeatures
from stepcal.core.errors import InputError
from stepcal.core.model_spec import PRESETS, Parallelism
from stepcal.costmodel import roofline
from stepcal.costmodel.build import build_tables
from stepcal.costmodel.compose import Axes
from stepcal.costmodel.compose_comm import Composition
from stepcal.costmodel.compose_elementwise import roofline_device, roofline_ops
from stepcal.costmodel.devices import data_document, device_spec, find_device, known_devices
from stepcal.costmodel.fitting import FitConfig, FitResult, TargetFit
from stepcal.costmodel.importers import aiconfigurator
from stepcal.costmodel.records import make_records
from stepcal.costmodel.tables import load_step_model
from stepcal.costmodel.tuning import default_choice
from tests.costmodel.conftest import PROFILES, require_shared

LLAMA3 = PRESETS["llama-3-8b"]
AXES = Axes(num_tokens=np.array([1.0, 64.0, 2048.0, 8192.0]), num_seqs=np.array([1.0, 32.0, 256.0]),
            kv_mean=np.array([1.0, 4096.0]), prefill_tokens=np.array([1.0, 2048.0]),
            prefill_ctx=np.array([1.0, 4096.0]))
VIDUR_SMALL_OPS = ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


# ---------------------------------------------------------------------------- devices

@pytest.mark.parametrize("name, ours", [
    ("h100_sxm", "h100_sxm"), ("H100", "h100_sxm"), ("h100", "h100_sxm"), ("NVIDIA H100 80GB HBM3", "h100_sxm"),
    ("NVIDIA H100 PCIe", "h100_pcie"), ("a100_sxm", "a100_sxm"), ("A100", "a100_sxm"),
    ("NVIDIA A100-SXM4-80GB", "a100_sxm"), ("NVIDIA A100-SXM4-40GB", "a100_sxm_40gb"), ("nvidia h200", "h200_sxm"),
    ("L40S", "l40s"), ("NVIDIA B200", "b200")])
def test_devices_are_found_by_our_short_and_cuda_names(name, ours):
    assert device_spec(name).name == ours


def test_datasheet_figures_are_the_cited_ones():
    h100, a100 = device_spec("h100"), device_spec("a100_sxm")
    assert (h100.memory_bandwidth_bytes_per_s, h100.memory_gb, h100.bf16_dense_tflops) == (3.35e12, 80, 989)
    assert (a100.memory_bandwidth_bytes_per_s, a100.memory_gb, a100.bf16_dense_tflops) == (2.039e12, 80, 312)
    assert device_spec("A100 40GB").memory_bandwidth_bytes_per_s == 1.555e12
    for name, entry in data_document()["devices"].items():
        assert entry["source"]["url"].startswith("https://www.nvidia.com/") and entry["source"]["title"], name
        assert entry["checked_against"], name


def test_no_name_means_two_devices():
    seen = {}
    from stepcal.costmodel.devices import _key
    for ours, entry in data_document()["devices"].items():
        for alias in (ours, *entry["names"]):
            assert seen.setdefault(_key(alias), ours) == ours, alias


def test_an_unknown_device_is_one_line_listing_the_known_ones():
    assert find_device("cpu") is None and find_device("Test CPU") is None and find_device(None) is None
    with pytest.raises(InputError) as error:
        device_spec("H999")
    message = str(error.value)
    assert "\n" not in message and message.startswith("unknown device 'H999'; known: ")
    assert all(name in message for name in known_devices())


def test_reading_the_datasheets_loads_no_numpy():
    code = "import sys, costmodel.devices as d; d.device_spec('H100'); print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------- the roofline

def test_one_kernel_is_launch_plus_bytes_over_a_share_of_the_bandwidth():
    k = roofline.KernelConstants(efficiency=0.5, launch_us=2.0)
    # 1 MB at half of 2 TB/s: 1 us; plus the 2 us floor.
    assert k.kernel_ms(1e6, 2e12) == pytest.approx(0.003)
    assert k.kernel_ms(np.array([0.0, 4e6]), 2e12) == pytest.approx([0.002, 0.006])
    # A residual add at 10 tokens of hidden 4096: reads two operands, writes the sum, 2 bytes each.
    assert roofline.bytes_moved("add", 2 * 4096, 10, 2) == 3 * 4096 * 10 * 2
    assert roofline.bytes_moved("mlp_act", 3 * 14336, 10, 2) == 3 * 14336 * 10 * 2
    assert roofline.bytes_moved("input_layernorm", 4096, 10, 2) == 2 * 4096 * 10 * 2


def test_the_fit_recovers_constants_the_rows_were_made_with():
    tokens = np.repeat(2.0 ** np.arange(13), 3)
    moved = tokens * 4096 * 4.0
    rows = pd.DataFrame({"device": np.where(np.arange(len(tokens)) % 3, "x", "y"), "cls": "norm",
                         "num_tokens": tokens, "bytes": moved, "bandwidth": 2e12,
                         "time_us": 3.0 + moved / (2e12 * 0.4) * 1e6})
    fitted = roofline.fit_class(rows)
    assert fitted.launch_us == pytest.approx(3.0) and fitted.efficiency == pytest.approx(0.4)


def test_the_shipped_constants_are_the_study_fit_of_vidur_data():
    """devices.json's constants come from studies/elementwise_roofline.py on the shared Vidur files
    (not tuned by hand): refitting them here gives the same numbers."""
    require_shared(PROFILES / "vidur/a100")
    from studies.elementwise_roofline import vidur_rows
    rows = vidur_rows(PROFILES / "vidur")
    assert set(rows["device"]) == {"a100_sxm", "h100_sxm"} and set(rows["op"]) == set(VIDUR_SMALL_OPS)
    refitted = roofline.fit_shipped_constants(rows)
    shipped = roofline.shipped_constants()
    assert set(refitted) == set(shipped) == set(roofline.CLASSES)
    for cls, k in shipped.items():
        for field in ("efficiency", "launch_us", "relative_sd"):
            assert getattr(refitted[cls], field) == pytest.approx(getattr(k, field), rel=1e-4), (cls, field)
    fitted_on = data_document()["elementwise_roofline"]["fitted_on"]
    assert fitted_on == sorted(rows["file"].unique())


# ---------------------------------------------------------------------------- the kernels of a step

def test_a_dense_layer_runs_two_norms_rope_the_activation_and_two_adds():
    ops = {op.name: op for op in roofline_ops(LLAMA3, Parallelism(tp=2))}
    assert {n: op.calls_per_step for n, op in ops.items()} == {
        "emb": 1, "input_layernorm": 32, "attn_rope": 32, "post_attention_layernorm": 32, "add": 64,
        "final_norm": 1, "mlp_act": 32}
    assert ops["attn_rope"].width == (16 + 4) * 128 and ops["mlp_act"].width == 3 * 14336 / 2
    assert ops["add"].width == 2 * 4096 and ops["final_norm"].width == 4096


def test_moe_layers_leave_the_activation_to_the_experts_kernel_and_mla_ropes_one_shared_key():
    mixtral = [op.name for op in roofline_ops(PRESETS["mixtral-8x7b"], Parallelism())]
    assert "mlp_act" not in mixtral
    dsv3 = roofline_ops(PRESETS["deepseek-v3"], Parallelism(tp=8, ep=8))
    acts = [(op.width, op.calls_per_step) for op in dsv3 if op.name == "mlp_act"]
    assert acts == [(3 * 18432 / 8, 3), (3 * 2048 / 8, 58)]      # 3 dense layers; the shared expert in 58
    rope = next(op for op in dsv3 if op.name == "attn_rope")
    assert rope.width == (128 / 8 + 1) * 64
    assert next(op for op in dsv3 if op.name == "latent_norm").width == 512 + 1536


def test_a_qk_norm_model_adds_its_query_and_key_head_norms_per_layer():
    qwen = {op.name: op for op in roofline_ops(PRESETS["qwen3-14b"], Parallelism(tp=2))}
    assert (qwen["q_norm"].width, qwen["q_norm"].calls_per_step) == (20 * 128, 40)   # 40 heads over 2 GPUs
    assert (qwen["k_norm"].width, qwen["k_norm"].calls_per_step) == (4 * 128, 40)
    assert roofline.OP_CLASSES["q_norm"] == roofline.OP_CLASSES["k_norm"] == "norm"
    assert not {"q_norm", "k_norm"} & {op.name for op in roofline_ops(LLAMA3, Parallelism())}


def _hand_elementwise_ms(T: float, bandwidth: float) -> float:
    """Llama-3-8B's element-wise work per step on one GPU, bytes counted by hand (bf16)."""
    c = roofline.shipped_constants()
    h, rope, ffn = 4096, (32 + 8) * 128, 14336

    def kernel(cls, elements):
        return c[cls].launch_us * 1e-3 + elements * 2 * T / (bandwidth * c[cls].efficiency) * 1e3

    return (kernel("emb", 2 * h) + 2 * 32 * kernel("norm", 2 * h) + 32 * kernel("rope", 2 * rope)
            + 32 * kernel("act", 3 * ffn) + 64 * kernel("add", 3 * h) + kernel("norm", 2 * h))


class OneMs:
    """Every call of the operator takes 1 ms, whatever its shape."""

    def predict(self, X):
        return np.ones(len(X))


def _result(targets, records: pd.DataFrame) -> FitResult:
    fits = {t: TargetFit(t, t.split(":")[0], (), (), default_choice("gemm"), OneMs(), 10, {}, {}) for t in targets}
    return FitResult(fits, {}, "hash", records, FitConfig(regressor="rf"))


@pytest.fixture(scope="module")
def aiconfigurator_h100_gemms() -> pd.DataFrame:
    path = require_shared(PROFILES / "aiconfigurator/h100_sxm/gemm/vllm/0.14.0/gemm_perf.parquet")
    return aiconfigurator.import_table(pd.read_parquet(path), str(path))


def test_aiconfigurator_h100_tables_gain_elementwise_and_sampling_terms(aiconfigurator_h100_gemms, tmp_path):
    """AIConfigurator times no element-wise kernel; its rows name the device ('NVIDIA H100 80GB
    HBM3'), so composition adds the roofline's terms with the H100's bandwidth."""
    assert roofline_device(aiconfigurator_h100_gemms, None).name == "h100_sxm"
    result = _result(("gemm", "attn_decode", "attn_prefill"), aiconfigurator_h100_gemms)
    meta = build_tables(result, tmp_path, spec=LLAMA3, parallelism=Parallelism(), axes=AXES)
    assert meta.t_step_terms[:4] == ["linear", "elementwise", "lm_head", "sampling"]
    assert meta.missing_terms == ["overhead"]
    source = meta.term_sources["elementwise"]
    assert source["source"] == "roofline" and source["device"] == "h100_sxm"
    assert source["constants"]["norm"]["launch_us"] == roofline.shipped_constants()["norm"].launch_us
    assert meta.term_sources["linear"]["source"] == "data"
    model = load_step_model(tmp_path)
    assert json.loads((tmp_path / "meta.json").read_text())["terms"]["elementwise"]["source"] == source
    for T in (1.0, 2048.0, 5000.0):            # 5,000: between knots, where the table interpolates
        f = StepFeatures.from_batches([StepBatch.of([0], [int(T)], [0])])
        assert model.term_ms(f)["elementwise"][0] == pytest.approx(_hand_elementwise_ms(T, 3.35e12))
    decode = StepBatch.of(range(32), [1] * 32, [1000] * 32)
    norm = roofline.shipped_constants()["norm"]
    sampling = norm.launch_us * 1e-3 + 32 * 128256 * 2 / (3.35e12 * norm.efficiency) * 1e3
    assert model.term_ms(decode.features())["sampling"][0] == pytest.approx(sampling)


def test_the_requested_device_must_be_the_profiles_own(aiconfigurator_h100_gemms):
    assert roofline_device(aiconfigurator_h100_gemms, "NVIDIA H100 80GB HBM3").name == "h100_sxm"
    with pytest.raises(InputError, match="--device-spec a100: the profiles were measured on NVIDIA H100 80GB "
                                         "HBM3 \\(h100_sxm\\), not a100_sxm"):
        roofline_device(aiconfigurator_h100_gemms, "a100")
    unnamed = make_records({"row": [0], "op": "gemm", "time_ms": 1.0}, source="t", file="t")
    assert roofline_device(unnamed, None) is None
    assert roofline_device(unnamed, "l40s").name == "l40s"


def _vidur_like_result(device=None) -> FitResult:
    records = make_records({"row": [0], "op": "gemm", "time_ms": 1.0, "device": device}, source="t", file="t")
    return _result(("gemm", *(f"elementwise:{op}" for op in VIDUR_SMALL_OPS)), records)


def test_measured_elementwise_operators_move_out_of_linear_and_keep_the_sum(tmp_path):
    """Vidur-style data: the small operators' regressors make the elementwise term (as Vidur counts
    them: once per layer, the embedding once); linear keeps the GEMMs; tables written before the split
    (linear holding both, no elementwise term) load and give the same step times."""
    meta = build_tables(_vidur_like_result(), tmp_path / "new", spec=LLAMA3, parallelism=Parallelism(), axes=AXES)
    assert meta.term_sources["elementwise"] == {"source": "data", "ops": list(VIDUR_SMALL_OPS)}
    assert "sampling" in meta.missing_terms and "elementwise" not in meta.missing_terms
    new = load_step_model(tmp_path / "new")
    terms = {t.name: t for t in new.terms}
    assert terms["linear"].time_ms == pytest.approx(np.full(4, 4 * 32.0))        # 1 ms per GEMM call
    assert terms["elementwise"].time_ms == pytest.approx(np.full(4, 5 * 32 + 1.0))
    # The layout tables had before: one linear term holding both.
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "new", old)
    old_meta = json.loads((old / "meta.json").read_text())
    merged = pd.read_parquet(old / "linear.parquet")
    merged[["time_ms", "spread_ms"]] += pd.read_parquet(old / "elementwise.parquet")[["time_ms", "spread_ms"]].to_numpy()
    merged.to_parquet(old / "linear.parquet")
    (old / "elementwise.parquet").unlink()
    for key in ("terms", "term_sources"):
        del old_meta[key]["elementwise"]
    old_meta["t_step_terms"].remove("elementwise")
    del old_meta["term_sources"]
    (old / "meta.json").write_text(json.dumps(old_meta))
    rng = np.random.default_rng(0)
    batches = [StepBatch.of(range(b), rng.integers(1, 700, b), rng.integers(0, 4000, b)) for b in rng.integers(1, 64, 40)]
    f = StepFeatures.from_batches(batches)
    np.testing.assert_allclose(load_step_model(old).features_ms(f), new.features_ms(f), rtol=1e-12)


def test_measured_rmsnorm_prices_the_head_norms_where_no_profile_timed_them(tmp_path):
    """Vidur's data have no per-head norms: a qk_norm model's are priced by its measured RMSNorm
    (input_layernorm) at their widths, two more calls per layer; our profiler's own q_norm/k_norm rows
    win where they are there. The roofline adds them where no element-wise data are (the previous test's
    AIConfigurator path), so a Qwen3 step is not short of them on either path."""
    import dataclasses
    qwen = PRESETS["qwen3-14b"]
    without = dataclasses.replace(qwen, qk_norm=False)
    L = qwen.num_layers
    metas = {n: build_tables(_vidur_like_result(), tmp_path / n, spec=s, parallelism=Parallelism(), axes=AXES)
             for n, s in (("qk", qwen), ("plain", without))}
    assert metas["qk"].term_sources["elementwise"]["ops"] == [*VIDUR_SMALL_OPS, "q_norm", "k_norm"]
    terms = {n: {t.name: t for t in load_step_model(tmp_path / n).terms} for n in metas}
    assert terms["qk"]["elementwise"].time_ms == pytest.approx(terms["plain"]["elementwise"].time_ms + 2 * L)
    assert terms["qk"]["linear"].time_ms == pytest.approx(terms["plain"]["linear"].time_ms)
    records = make_records({"row": [0], "op": "gemm", "time_ms": 1.0}, source="t", file="t")
    own = _result(("gemm", *(f"elementwise:{op}" for op in (*VIDUR_SMALL_OPS, "q_norm"))), records)
    from stepcal.costmodel.compose_elementwise import head_norm_pricing
    assert head_norm_pricing(own, qwen) == {"q_norm": "q_norm", "k_norm": "input_layernorm"}
    assert head_norm_pricing(own, without) == {}


def test_measured_operators_win_over_the_roofline_and_sampling_still_comes_from_it(tmp_path):
    meta = build_tables(_vidur_like_result(device="NVIDIA A100-SXM4-80GB"), tmp_path, spec=LLAMA3,
                        parallelism=Parallelism(), axes=AXES)
    assert meta.term_sources["elementwise"]["source"] == "data"
    assert meta.term_sources["sampling"]["source"] == "roofline"
    assert meta.term_sources["sampling"]["device"] == "a100_sxm" and "sampling" not in meta.missing_terms


def test_device_spec_makes_the_roofline_when_the_profiles_name_none(tmp_path):
    records = make_records({"row": [0], "op": "gemm", "time_ms": 1.0, "device": "Test CPU"}, source="t", file="t")
    result = _result(("gemm",), records)
    without = build_tables(result, tmp_path / "a", spec=LLAMA3, parallelism=Parallelism(), axes=AXES)
    assert {"elementwise", "sampling"} <= set(without.missing_terms)
    assert any("--device-spec" in note for note in without.notes)
    with_h200 = build_tables(result, tmp_path / "b", spec=LLAMA3, parallelism=Parallelism(), axes=AXES,
                             composition=Composition(device_spec="H200"))
    assert with_h200.term_sources["elementwise"]["device"] == "h200_sxm"
    model = load_step_model(tmp_path / "b")
    f = StepFeatures.from_batches([StepBatch.of([0], [2048], [0])])
    assert model.term_ms(f)["elementwise"][0] == pytest.approx(_hand_elementwise_ms(2048.0, 4.8e12))


def test_a_drawn_bias_moves_the_roofline_terms_by_their_spread(aiconfigurator_h100_gemms, tmp_path):
    build_tables(_result(("gemm",), aiconfigurator_h100_gemms), tmp_path, spec=LLAMA3, parallelism=Parallelism(),
                 axes=AXES)
    terms = {t.name: t for t in load_step_model(tmp_path).terms}
    f = StepFeatures.from_batches([StepBatch.of(range(8), [1] * 7 + [900], [100] * 7 + [0])])
    for name in ("elementwise", "sampling"):
        term = terms[name]
        spread = term.evaluate(f, "spread_ms")
        assert (spread > 0).all() and (spread < term.evaluate(f)).all()
        assert term.biased(1.5).evaluate(f) == pytest.approx(term.evaluate(f) + 1.5 * spread)
        assert term.biased(1.5).source == term.source


def test_our_profilers_sampling_and_kv_stores_make_per_sequence_terms_that_win_over_the_roofline(tmp_path):
    """`stepcal profile --ops elementwise` times sample (final norm and argmax, once per step) and
    kv_store (once per layer) by sequences: terms on num_seqs from the data, not the roofline's."""
    targets = ("gemm", *(f"elementwise:{op}" for op in (*VIDUR_SMALL_OPS, "sample", "kv_store")))
    records = make_records({"row": [0], "op": "gemm", "time_ms": 1.0, "device": "NVIDIA H100 80GB HBM3"},
                           source="t", file="t")
    meta = build_tables(_result(targets, records), tmp_path, spec=LLAMA3, parallelism=Parallelism(), axes=AXES)
    assert meta.term_sources["sampling"] == {"source": "data", "ops": ["sample"]}
    assert meta.term_sources["kv_store"] == {"source": "data", "ops": ["kv_store"]}
    assert not {"elementwise", "sampling"} & set(meta.missing_terms)
    terms = {t.name: t for t in load_step_model(tmp_path).terms}
    assert terms["sampling"].axis == terms["kv_store"].axis == "num_seqs"
    f = StepFeatures.from_batches([StepBatch.of(range(5), [1] * 5, [100] * 5)])
    assert terms["sampling"].evaluate(f)[0] == pytest.approx(1.0)       # 1 ms per call, one call
    assert terms["kv_store"].evaluate(f)[0] == pytest.approx(32.0)      # one call per layer


def test_kv_stores_count_as_element_wise_work_in_the_step_split(tmp_path):
    from stepcal.experiments.validation.split import term_parts_ms
    targets = ("gemm", "elementwise:kv_store", "elementwise:sample")
    records = make_records({"row": [0], "op": "gemm", "time_ms": 1.0}, source="t", file="t")
    build_tables(_result(targets, records), tmp_path, spec=LLAMA3, parallelism=Parallelism(), axes=AXES)
    f = StepFeatures.from_batches([StepBatch.of(range(2), [1, 1], [10, 10])])
    parts = term_parts_ms(load_step_model(tmp_path), f)
    assert parts["elementwise"][0] == pytest.approx(33.0)               # 32 stores + 1 sampling
