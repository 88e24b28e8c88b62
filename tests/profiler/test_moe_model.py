"""The torch model's mixture-of-experts layers: routing, experts, and batching invariance on tiny-moe."""
import pytest
import torch
import torch.nn.functional as F

from stepcal.core.errors import InputError
from stepcal.core.model_spec import PRESETS
from stepcal.profiler.model import DecoderLayer, MoEDecoderLayer, build_model
from stepcal.profiler.moe import MoEFFN, route, routed_experts
from tests.profiler.test_profiler_model import assert_batched_logits_match_alone, assert_greedy_decoding_consistent

SPEC = PRESETS["tiny-moe"]
TOL = {"atol": 2e-4, "rtol": 2e-4}


@pytest.fixture(scope="module")
def model():
    return build_model(SPEC, device="cpu", seed=1)


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, SPEC.vocab_size, (length,), generator=torch.Generator().manual_seed(seed))


def hidden_states(num_tokens: int, seed: int) -> torch.Tensor:
    return torch.randn(num_tokens, SPEC.hidden_size, generator=torch.Generator().manual_seed(seed))


def reference_moe(moe: MoEFFN, h: torch.Tensor) -> torch.Tensor:
    """The MoE FFN token by token with plain loops: softmax over experts, the k largest,
    renormalised weights, each chosen expert's SwiGLU, plus the shared experts."""
    ffn = SPEC.expert_ffn_size
    rows = []
    for x in h:
        probs = torch.softmax(moe.router.weight @ x, dim=0)
        chosen = sorted(range(SPEC.num_experts), key=lambda e: -float(probs[e]))[:SPEC.experts_per_token]
        total = sum(float(probs[e]) for e in chosen)
        y = torch.zeros_like(x)
        for e in chosen:
            gate_up, down = moe.experts.gate_up[e], moe.experts.down[e]
            y += float(probs[e]) / total * (down @ (F.silu(gate_up[:ffn] @ x) * (gate_up[ffn:] @ x)))
        shared = moe.shared
        width = shared.ffn_size
        w = shared.gate_up_proj.weight
        y += shared.down_proj.weight @ (F.silu(w[:width] @ x) * (w[width:] @ x))
        rows.append(y)
    return torch.stack(rows)


def test_layers_after_the_dense_ones_are_moe_and_weights_match_the_spec(model):
    assert [type(layer) for layer in model.layers] == [DecoderLayer, MoEDecoderLayer, MoEDecoderLayer]
    moe = model.layers[1].moe
    assert moe.experts.gate_up.shape == (8, 2 * 128, 256) and moe.experts.down.shape == (8, 256, 128)
    assert moe.shared.ffn_size == SPEC.num_shared_experts * SPEC.expert_ffn_size
    assert not hasattr(model.layers[1], "gate_up_proj")
    assert sum(p.numel() for p in model.parameters()) == SPEC.num_params
    # Fan-in scaled like every nn.Linear: O(1) activations whatever the width.
    assert abs(float(moe.experts.gate_up.std()) * 256 ** 0.5 - 1) < 0.05
    assert abs(float(moe.experts.down.std()) * 128 ** 0.5 - 1) < 0.05


def test_moe_layer_equals_a_per_token_reference(model):
    moe = model.layers[2].moe
    h = hidden_states(37, seed=2)
    torch.testing.assert_close(moe(h), reference_moe(moe, h), atol=1e-5, rtol=1e-5)


def test_routing_picks_the_top_k_of_the_router_logits():
    logits = torch.randn(50, 8, generator=torch.Generator().manual_seed(3))
    expert_ids, weights = route(logits, 3)
    top = logits.argsort(dim=-1, descending=True)[:, :3]
    assert expert_ids.sort(dim=-1).values.tolist() == top.sort(dim=-1).values.tolist()
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(50))
    # Renormalised softmax: weight ratios are exp of the logit differences.
    chosen = logits.gather(1, expert_ids)
    torch.testing.assert_close(weights[:, 0] / weights[:, 1], (chosen[:, 0] - chosen[:, 1]).exp())


def test_routed_experts_skip_experts_without_tokens_and_weight_each_slot():
    gen = torch.Generator().manual_seed(4)
    gate_up, down = torch.randn(4, 6, 5, generator=gen), torch.randn(4, 5, 3, generator=gen)
    x = torch.randn(2, 5, generator=gen)
    ids = torch.tensor([[2, 0], [2, 3]])
    weights = torch.tensor([[0.25, 0.75], [1.0, 0.0]])

    def expert(e, v):
        return down[e] @ (F.silu(gate_up[e][:3] @ v) * (gate_up[e][3:] @ v))

    want = torch.stack([0.25 * expert(2, x[0]) + 0.75 * expert(0, x[0]), expert(2, x[1])])
    torch.testing.assert_close(routed_experts(x, ids, weights, gate_up, down), want)


def last_logits_in_chunks(model, tokens: torch.Tensor, chunk: int) -> torch.Tensor:
    cache = model.new_cache()
    out = None
    for start in range(0, len(tokens), chunk):
        out = model.forward_step([tokens[start:start + chunk]], [cache], [True])
    return out[0]


def test_prompt_logits_same_in_one_step_or_any_chunking(model):
    tokens = prompt(45, seed=3)
    whole = last_logits_in_chunks(model, tokens, 45)
    for chunk in (1, 7, 16):
        torch.testing.assert_close(last_logits_in_chunks(model, tokens, chunk), whole, **TOL)


def test_batched_with_other_sequences_gives_the_same_logits(model):
    assert_batched_logits_match_alone(model)


def test_greedy_decoding_continues_identically_chunked_and_batched(model):
    assert_greedy_decoding_consistent(model)


def test_bfloat16_moe_model_runs():
    model = build_model(SPEC, dtype="bfloat16", seed=0)
    out = model.forward_step([prompt(6, 1)], [model.new_cache()], [True])
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_an_mla_spec_is_one_clear_input_error():
    with pytest.raises(InputError) as err:
        build_model(PRESETS["deepseek-v3"])
    assert str(err.value) == "the torch model implements GQA attention only; deepseek-v3 uses MLA"
