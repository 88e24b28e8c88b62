"""The torch Llama model: a sequence's logits do not depend on how its tokens were batched."""
import pytest
import torch

from stepcal.core.model_spec import PRESETS
from stepcal.profiler.model import KVCache, build_model, causal_chunk_mask, greedy_generate

TOL = {"atol": 2e-4, "rtol": 2e-4}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(PRESETS["tiny"], device="cpu", seed=1)


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, PRESETS["tiny"].vocab_size, (length,),
                         generator=torch.Generator().manual_seed(seed))


def last_logits_in_chunks(model, tokens: torch.Tensor, chunk: int) -> torch.Tensor:
    cache = model.new_cache()
    out = None
    for start in range(0, len(tokens), chunk):
        piece = tokens[start:start + chunk]
        out = model.forward_step([piece], [cache], [True])
    assert cache.length == len(tokens)
    return out[0]


def test_prompt_logits_same_in_one_step_or_any_chunking(model):
    tokens = prompt(45, seed=3)
    whole = last_logits_in_chunks(model, tokens, 45)
    assert whole.shape == (PRESETS["tiny"].vocab_size,)
    for chunk in (1, 7, 16, 44):
        torch.testing.assert_close(last_logits_in_chunks(model, tokens, chunk), whole, **TOL)


def test_full_prompt_logits_match_a_plain_causal_reference(model):
    """Every position's logits from one step equal those of token-by-token decoding."""
    tokens = prompt(12, seed=4)
    cache = model.new_cache()
    inputs = model.prepare_step([tokens], [cache], [True])
    inputs.emit_rows = torch.arange(12)           # ask for every row
    all_rows = model.run_step(inputs)
    step_cache = model.new_cache()
    for i in range(12):
        one = model.forward_step([tokens[i:i + 1]], [step_cache], [True])[0]
        torch.testing.assert_close(one, all_rows[i], **TOL)


def test_batched_with_other_sequences_gives_the_same_logits(model):
    assert_batched_logits_match_alone(model)


def assert_batched_logits_match_alone(model):
    a, b, c = prompt(30, 5), prompt(9, 6), prompt(17, 7)
    alone = [last_logits_in_chunks(model, t, len(t)) for t in (a, b, c)]
    # b and c prefilled first; then a's whole prompt batched with a chunk of b and a decode of c.
    caches = [model.new_cache() for _ in range(3)]
    model.forward_step([b[:4], c[:16]], caches[1:], [False, False])
    out = model.forward_step([a, b[4:], c[16:]], caches, [True, True, True])
    assert out.shape == (3, model.spec.vocab_size)
    for got, want in zip(out, alone):
        torch.testing.assert_close(got, want, **TOL)


def test_emit_selects_rows(model):
    caches = [model.new_cache() for _ in range(3)]
    out = model.forward_step([prompt(5, 1), prompt(3, 2), prompt(4, 3)], caches, [False, True, False])
    assert out.shape == (1, PRESETS["tiny"].vocab_size)
    torch.testing.assert_close(out[0], last_logits_in_chunks(model, prompt(3, 2), 3), **TOL)
    assert [c.length for c in caches] == [5, 3, 4]


def test_greedy_decoding_continues_identically_chunked_and_batched(model):
    assert_greedy_decoding_consistent(model)


def assert_greedy_decoding_consistent(model):
    """Greedy tokens of one prompt alone, chunked, and decoded beside a sequence mid-prefill."""
    tokens = prompt(20, seed=8)
    reference = greedy_generate(model, tokens, 8)
    assert greedy_generate(model, tokens, 8, chunk_size=6) == reference
    other = prompt(60, seed=9)
    caches = [model.new_cache(), model.new_cache()]
    logits = model.forward_step([tokens, other[:10]], caches, [True, False])
    generated, offset = [], 10
    for _ in range(8):
        token = int(logits[0].argmax())
        generated.append(token)
        chunk = other[offset:offset + 5]
        offset += 5
        logits = model.forward_step([torch.tensor([token]), chunk], caches, [True, False])
    assert generated == reference


def test_truncate_and_recompute_after_preemption(model):
    tokens = prompt(24, seed=10)
    reference = greedy_generate(model, tokens, 4)
    cache = model.new_cache()
    model.forward_step([tokens[:20]], [cache], [False])
    cache.reset()                                  # preempted: recompute from scratch
    assert greedy_generate(model, tokens, 4, cache=cache) == reference
    cache.truncate(10)                             # keep a prefix, recompute the rest
    logits = model.forward_step([tokens[10:]], [cache], [True])
    torch.testing.assert_close(logits[0], last_logits_in_chunks(model, tokens, 24), **TOL)


def test_cache_grows_and_keeps_its_contents():
    cache = KVCache(2, 2, 4, dtype=torch.float32, device="cpu")
    assert cache.capacity == 0
    cache.fill_random(10, torch.Generator().manual_seed(0))
    kept = cache.k[:, :, :10].clone()
    cache.reserve(100)
    assert cache.capacity >= 100 and cache.length == 10
    torch.testing.assert_close(cache.k[:, :, :10], kept)
    with pytest.raises(ValueError):
        cache.truncate(11)
    cache.reset(free=True)
    assert cache.length == 0 and cache.capacity == 0


def test_causal_chunk_mask():
    assert causal_chunk_mask(1, 5, "cpu") is None and causal_chunk_mask(4, 0, "cpu") is None
    mask = causal_chunk_mask(2, 3, "cpu")
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_bfloat16_model_runs():
    model = build_model(PRESETS["tiny"], dtype="bfloat16", seed=0)
    out = model.forward_step([prompt(6, 1)], [model.new_cache()], [True])
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_cuda_causal_bias_equals_the_cpu_mask():
    """The lower-right causal bias used on CUDA gives what the explicit CPU mask gives."""
    import warnings

    from stepcal.profiler.model import attend, prepare_step
    spec = PRESETS["tiny"]
    gen = torch.Generator().manual_seed(0)
    caches = []
    for q, s in ((5, 7), (1, 9), (4, 0)):
        cache = KVCache(1, spec.num_kv_heads, spec.head_dim, dtype=torch.float32, device="cpu")
        cache.fill_random(s + q, gen)
        cache.truncate(s)
        caches.append(cache)
    ids = [torch.zeros(q, dtype=torch.long) for q in (5, 1, 4)]
    inputs = prepare_step(ids, caches, [True] * 3, "cpu")
    q = torch.randn(10, spec.num_heads, spec.head_dim, generator=gen)
    expected = attend(q, 0, inputs)
    inputs.masks = [causal_chunk_mask(ql, s, "cuda") for ql, s in zip(inputs.q_lens, inputs.kv_lens)]
    assert type(inputs.masks[0]).__name__ == "CausalBias" and inputs.masks[1] is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # CPU: SDPA says it must materialise the bias
        torch.testing.assert_close(attend(q, 0, inputs), expected)


def test_a_qk_norm_model_normalises_heads_and_still_batches_exactly():
    """Qwen3's per-head query/key norms are part of the forward: their weights move the logits, and a
    sequence's logits still do not depend on how its tokens were chunked."""
    from dataclasses import replace
    qk = build_model(replace(PRESETS["tiny"], qk_norm=True), device="cpu", seed=1)
    tokens = prompt(30, seed=5)
    whole = last_logits_in_chunks(qk, tokens, 30)
    torch.testing.assert_close(last_logits_in_chunks(qk, tokens, 7), whole, **TOL)
    with torch.no_grad():
        qk.layers[0].k_norm.weight.mul_(3.0)
    assert not torch.allclose(last_logits_in_chunks(qk, tokens, 30), whole, **TOL)
    assert build_model(PRESETS["tiny"], seed=1).layers[0].q_norm is None
