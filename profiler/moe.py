"""The mixture-of-experts FFN of the torch model; the profiler's `moe` op times its routed experts.

A MoE layer scores every token against every expert (the router GEMM), keeps the token's top-k
experts with their softmax probabilities renormalised to sum to 1, runs each routed expert's
SwiGLU over only the tokens routed to it, and adds the shared experts every token passes through.

The routed experts are one function, `routed_experts`, over stacked weights: the model calls it
after its router, the profiler calls it on a routing drawn from a distribution (profiler.routing).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from stepcal.core.model_spec import ModelSpec


@dataclass
class RoutingPlan:
    """Token slots grouped by expert: slots of expert e are rows start_e .. start_e + counts[e]."""
    token_rows: Tensor       # [T * k] the token each slot belongs to, slots sorted by expert
    slot_weights: Tensor     # [T * k, 1] the routing weight of each slot, same order
    counts: list[int]        # slots per expert, on the host (the loop over experts needs them)


def route(router_logits: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """The top_k experts of each token and their weights: softmax over all experts (in float32,
    so that bf16 logits pick the same experts as fp32 ones would), renormalised over the chosen.
    -> expert ids [T, k] (int64), weights [T, k] (float32)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, expert_ids = torch.topk(probs, top_k, dim=-1)
    return expert_ids, weights / weights.sum(dim=-1, keepdim=True)


def plan_routes(expert_ids: Tensor, expert_weights: Tensor, num_experts: int) -> RoutingPlan:
    """Group the T * k (token, expert) slots by expert. Reads the group sizes back to the host:
    one device synchronisation per MoE layer, as every unfused MoE implementation pays."""
    top_k = expert_ids.shape[1]
    flat_ids = expert_ids.reshape(-1)
    # Stable, so that within an expert the tokens keep their order: results do not depend on
    # how the sort breaks ties.
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    return RoutingPlan(order // top_k, expert_weights.reshape(-1)[order].unsqueeze(1), counts)


def run_experts(x: Tensor, plan: RoutingPlan, gate_up: Tensor, down: Tensor) -> Tensor:
    """Each expert's SwiGLU over its tokens only, weighted and summed into each token's row.

    x: [T, H]; gate_up: [E, 2F, H]; down: [E, H, F] -> [T, H]. A token is routed to an expert at
    most once, so one index_add_ never adds twice into a row (no order-dependent atomics)."""
    out = torch.zeros_like(x)
    ffn_size = down.shape[2]
    start = 0
    for expert, count in enumerate(plan.counts):
        if count:
            rows = plan.token_rows[start:start + count]
            gate, up = F.linear(x.index_select(0, rows), gate_up[expert]).split(ffn_size, dim=-1)
            y = F.linear(F.silu(gate) * up, down[expert])
            out.index_add_(0, rows, y * plan.slot_weights[start:start + count])
        start += count
    return out


def routed_experts(x: Tensor, expert_ids: Tensor, expert_weights: Tensor, gate_up: Tensor,
                   down: Tensor) -> Tensor:
    """The routed experts of one MoE layer (what a fused-experts kernel computes): tokens grouped
    by expert, each expert's SwiGLU, weighted sum. expert_weights in x's dtype."""
    return run_experts(x, plan_routes(expert_ids, expert_weights, gate_up.shape[0]), gate_up, down)


class RoutedExperts(nn.Module):
    """num_experts SwiGLU experts of width ffn_size as stacked weights: gate_up [E, 2F, H]
    (gate rows first, then up), down [E, H, F]."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_size: int, *, dtype, device) -> None:
        super().__init__()
        self.gate_up = nn.Parameter(torch.empty(num_experts, 2 * ffn_size, hidden_size, dtype=dtype,
                                                device=device))
        self.down = nn.Parameter(torch.empty(num_experts, hidden_size, ffn_size, dtype=dtype, device=device))

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """Fan-in scaled normals, as LlamaModel draws its nn.Linear weights."""
        self.gate_up.normal_(0.0, 1.0 / math.sqrt(self.gate_up.shape[2]), generator=generator)
        self.down.normal_(0.0, 1.0 / math.sqrt(self.down.shape[2]), generator=generator)

    def forward(self, x: Tensor, expert_ids: Tensor, expert_weights: Tensor) -> Tensor:
        return routed_experts(x, expert_ids, expert_weights.to(x.dtype), self.gate_up, self.down)


class SharedExperts(nn.Module):
    """The shared experts as one dense SwiGLU of num_shared_experts * expert_ffn_size."""

    def __init__(self, hidden_size: int, ffn_size: int, *, dtype, device) -> None:
        super().__init__()
        self.ffn_size = ffn_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * ffn_size, bias=False, dtype=dtype, device=device)
        self.down_proj = nn.Linear(ffn_size, hidden_size, bias=False, dtype=dtype, device=device)

    def forward(self, h: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(h).split(self.ffn_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class MoEFFN(nn.Module):
    """One layer's mixture-of-experts FFN: router, top-k routed experts, shared experts."""

    def __init__(self, spec: ModelSpec, *, dtype, device) -> None:
        super().__init__()
        self.top_k = spec.experts_per_token
        self.router = nn.Linear(spec.hidden_size, spec.num_experts, bias=False, dtype=dtype, device=device)
        self.experts = RoutedExperts(spec.num_experts, spec.hidden_size, spec.expert_ffn_size,
                                     dtype=dtype, device=device)
        self.shared = None
        if spec.num_shared_experts:
            self.shared = SharedExperts(spec.hidden_size, spec.num_shared_experts * spec.expert_ffn_size,
                                        dtype=dtype, device=device)

    def forward(self, h: Tensor) -> Tensor:
        expert_ids, weights = route(self.router(h), self.top_k)
        out = self.experts(h, expert_ids, weights)
        if self.shared is not None:
            out = out + self.shared(h)
        return out
