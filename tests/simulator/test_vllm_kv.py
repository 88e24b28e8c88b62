import json

import pytest

from stepcal.core.errors import InputError
from stepcal.core.model_spec import PRESETS, ModelSpec, Parallelism
from stepcal.experiments.cli import main
from stepcal.experiments.commands.flags import KV_SIZINGS as FLAG_KV_SIZINGS
from stepcal.simulator.kv_cache import KV_SIZINGS, KvCacheSizing, kv_blocks_from_memory
from stepcal.simulator.vllm_kv import VllmEngineLimits, vllm_kv_blocks, vllm_kv_budget

GIB = 2**30
HAND = ModelSpec("hand", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                 ffn_size=128, vocab_size=1000)


def test_block_count_by_hand():
    limits = VllmEngineLimits(max_num_batched_tokens=100, max_num_seqs=10)
    # forward over 100 tokens, bf16: residual stream 3 x 100 x 64, then the FFN (gate/up 2 x 128 and
    # the product 128 per token) beats attention (QKV (4 + 2 x 2) x 16 and output 4 x 16 per token)
    forward = (3 * 100 * 64 + 3 * 100 * 128) * 2
    assert forward == 115_200
    # sampler over 10 sequences: the forward's output 100 x 64 in bf16, logits 10 x 1000 in bf16 and
    # 30 bytes each besides (fp32 copy 4, sorted 4, int64 indices 8, the sort's int64 positions 8,
    # top-k mask 1, softmax 4, top-p mask 1)
    sampler = 100 * 64 * 2 + 10 * 1000 * (2 + 30)
    assert sampler == 332_800
    non_torch = int(0.15 * GIB)
    block = 2 * 2 * 2 * 16 * 2 * 16          # K and V, layers, KV heads, head_dim, bf16, tokens
    budget = vllm_kv_budget(HAND, 16, 1.0, 0.5, Parallelism(), limits)
    assert budget.block_bytes == block and budget.activation_bytes == max(forward, sampler)
    expected = int((0.5 * GIB - HAND.weight_bytes_per_gpu() - sampler - non_torch) // block)
    assert vllm_kv_blocks(HAND, 16, 1.0, 0.5, limits=limits) == expected


def test_the_profile_run_costs_blocks_and_grows_with_the_token_budget():
    spec = PRESETS["llama-3-8b"]
    weights_only = kv_blocks_from_memory(spec, 16, 80)
    small = vllm_kv_blocks(spec, 16, 80, limits=VllmEngineLimits(2048, 128))
    large = vllm_kv_blocks(spec, 16, 80, limits=VllmEngineLimits(32768, 1024))
    assert large < small < weights_only
    # tensor parallelism: half the KV heads and about half the weights per GPU, so about twice the blocks
    tp2 = vllm_kv_blocks(spec, 16, 80, parallelism=Parallelism(tp=2), limits=VllmEngineLimits(2048, 128))
    assert 2 * small < tp2 < 2.5 * small


def test_the_flag_lists_the_sizings_the_library_knows():
    assert FLAG_KV_SIZINGS == KV_SIZINGS


def test_sizing_picks_the_method():
    common = dict(device_memory_gb=80, max_num_batched_tokens=2048, max_num_seqs=128)
    assert KvCacheSizing(**common).num_blocks("llama-3-8b") == kv_blocks_from_memory(PRESETS["llama-3-8b"], 16, 80)
    assert KvCacheSizing(sizing="vllm", **common).num_blocks("llama-3-8b") == vllm_kv_blocks(
        PRESETS["llama-3-8b"], 16, 80, limits=VllmEngineLimits(2048, 128))
    with pytest.raises(InputError, match="--kv-sizing"):
        KvCacheSizing(sizing="guess", **common).num_blocks("llama-3-8b")


@pytest.mark.parametrize("utilization", [0.0, -0.5, 1.5])
def test_utilization_outside_the_unit_interval(utilization):
    with pytest.raises(InputError, match="--gpu-memory-utilization"):
        vllm_kv_blocks(HAND, 16, 1.0, utilization)


def test_cli_sizes_the_cache_as_vllm(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["simulate", "--trace", "poisson:rate=4,n=20,prompt=uniform:100:200,output=uniform:4:16",
            "--model-spec", "llama-3-8b", "--device-memory-gb", "80", "--kv-sizing", "vllm",
            "--max-batched-tokens", "2048", "--max-num-seqs", "128", "--step-model", "const:20", "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kv_blocks"] == vllm_kv_blocks(PRESETS["llama-3-8b"], 16, 80, limits=VllmEngineLimits(2048, 128))


@pytest.mark.parametrize(("flags", "message"), [
    (["--device-memory-gb", "16.8"], "leave no room for a KV cache"),   # weights fit, the profile run does not
    (["--device-memory-gb", "80", "--gpu-memory-utilization", "0"], "--gpu-memory-utilization"),
    (["--device-memory-gb", "80", "--gpu-memory-utilization", "1.2"], "--gpu-memory-utilization"),
])
def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    args = ["simulate", "--trace", "poisson:rate=4,n=5,prompt=uniform:100:200,output=uniform:4:16",
            "--model-spec", "llama-3-8b", "--kv-sizing", "vllm", "--step-model", "const:20",
            "--out", str(out), *flags]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepcal") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_weights_fit_where_the_vllm_sizing_refuses():
    # the case above: 16.8 GiB x 0.9 holds llama-3-8b's 15 GiB of weights and a few blocks, not
    # vLLM's profile run besides
    assert kv_blocks_from_memory(PRESETS["llama-3-8b"], 16, 16.8) > 0


def _peak_blocks_held(requests_path, block_size=16, step_s=0.05):
    """Most KV blocks the running requests of a measured vLLM run held at once: each holds its prompt
    from scheduling and one more token per output token, spread evenly from first to last token."""
    import numpy as np  # lazy: loads numpy

    rows = [json.loads(line) for line in requests_path.read_text().splitlines() if line.strip()]
    times = np.arange(min(r["scheduled_ts"] for r in rows), max(r["last_token_ts"] for r in rows), step_s)
    blocks = np.zeros_like(times)
    for r in rows:
        done = np.clip((times - r["first_token_ts"]) / max(r["last_token_ts"] - r["first_token_ts"], 1e-9), 0, 1)
        held = np.ceil((r["input_toks"] + done * r["output_toks"]) / block_size)
        blocks += np.where((times >= r["scheduled_ts"]) & (times <= r["last_token_ts"]), held, 0)
    return int(blocks.max())


@pytest.mark.parametrize(("model", "spec", "tp"), [
    ("Llama-3.1-8B", PRESETS["llama-3-8b"], 1),   # Llama 3.1 8B has Llama 3 8B's shape
    ("Qwen3-32B", ModelSpec("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936, qk_norm=True), 2),
])
def test_derived_cache_holds_what_the_real_runs_held(shared_data, model, spec, tp):
    # RTX PRO 6000 Blackwell Server Edition: 96 GB; gpu_memory_utilization 0.9, block_size 16 and the
    # engine limits as the runs' meta.json gives them. The runs record no KV usage (kv_cache_pct is 0
    # throughout) and their running count is capped by max_num_seqs, so the check is one-sided: the
    # derived cache must hold what the running requests held at the busiest moment.
    run = shared_data / "runs/llmservingsim/RTXPRO6000" / model / "vllm"
    engine = json.loads((run / "meta.json").read_text())["engine_kwargs"]
    assert engine["tensor_parallel_size"] == tp
    limits = VllmEngineLimits(engine["max_num_batched_tokens"], engine["max_num_seqs"])
    derived = vllm_kv_blocks(spec, 16, 96, 0.9, Parallelism(tp=tp), limits)
    assert derived > _peak_blocks_held(run / "requests.jsonl")
