"""KV cache size as vLLM's V1 engine sets it at start-up (CUDA, one KV cache group).

Read from vLLM's V1 worker and model runner as they stand from about 0.11 (MemorySnapshot taken
after NCCL, memory_profiling in vllm/utils/mem_utils.py) up to the 0.19 line the reference runs
used; earlier V1 releases subtracted the same three terms, measured slightly differently.

vLLM's worker (vllm/v1/worker/gpu_worker.py, Worker.determine_available_memory) takes a
MemorySnapshot after the CUDA context and NCCL are up, asks for `requested = total memory x
gpu_memory_utilization`, then runs GPUModelRunner.profile_run under
vllm/utils (mem_utils.py, memory_profiling) and keeps for the KV cache

    requested - weights - torch activation peak of the profile run - non-torch memory growth

The KV cache is then cut into pages (vllm/v1/core/kv_cache_utils.py, get_kv_cache_config): with
every layer full attention there is one KV cache group, a page holds block_size tokens of every
layer's K and V, and num_gpu_blocks = available // (page bytes x layers), the smallest over the
tensor-parallel workers (all equal here). So one block costs
`2 x layers x KV heads per GPU x head_dim x KV dtype bytes x block_size` bytes.

What is not subtracted: CUDA graphs are captured after the cache is allocated
(Worker.compile_or_warm_up_model), out of the (1 - utilisation) headroom, unless the engine
estimates their memory while profiling (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, an opt-in in the
releases read here); `cuda_graph_bytes` takes that share where it is on. Device memory is in GiB,
as CUDA reports the total (torch.cuda.mem_get_info), which is a little under the datasheet's GB. The 150 MiB "redundancy buffer"
appears only in vLLM's suggested --kv-cache-memory, not in the size it uses.
"""
from __future__ import annotations

from dataclasses import dataclass

from stepcal.core.errors import InputError
from stepcal.core.model_spec import DTYPE_BYTES, ModelSpec, Parallelism

GIB_BYTES = 2**30
# Bytes per logit the dummy sampler run holds at its peak besides the logits themselves (in the
# compute dtype). Its dummy metadata (GPUModelRunner._dummy_sampler_run) asks for temperature 0.5,
# top-p 0.9 and top-k vocab - 1, so the torch-native path runs (vllm/v1/sample/sampler.py,
# ops/topk_topp_sampler.py, apply_top_k_top_p): the fp32 copy of the logits (4), their sorted values
# (4) and int64 sort indices (8), the int64 position index torch's CUDA sort pairs the keys with
# while it sorts (8), the top-k mask (1), the softmax of the sorted values whose cumulative sum is
# taken in place (4) and the top-p mask (1). The softmax and exponential noise of the random draw
# (4 + 4) come after the sort's tensors are freed. FlashInfer's sampler, where vLLM uses it, holds less.
SAMPLER_EXTRA_BYTES_PER_LOGIT = 4 + 4 + 8 + 8 + 1 + 4 + 1
# Non-torch memory that appears during weight loading and the profile run (CUDA kernels' modules
# loaded on first use, cuBLAS/cuBLASLt handles; with tp > 1 also NCCL's and the custom
# all-reduce's buffers). vLLM measures it; not derivable from the model, these are the typical
# figures its start-up log prints ("non-torch memory"), an assumption of this estimate.
NON_TORCH_BYTES_ONE_GPU = int(0.15 * GIB_BYTES)
NON_TORCH_BYTES_MULTI_GPU = int(0.6 * GIB_BYTES)


@dataclass(frozen=True)
class VllmEngineLimits:
    """The engine settings the profile run is shaped by: `max_num_batched_tokens` tokens in the
    dummy forward, min(max_num_seqs, max_num_batched_tokens) sequences in the dummy sampler run."""
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    cuda_graph_bytes: int = 0

    def __post_init__(self) -> None:
        for flag, value in (("--max-batched-tokens", self.max_num_batched_tokens),
                            ("--max-num-seqs", self.max_num_seqs)):
            if value <= 0:
                raise InputError(f"{flag} must be positive, got {value}")

    @property
    def num_sampler_rows(self) -> int:
        return min(self.max_num_seqs, self.max_num_batched_tokens)


def forward_peak_bytes(spec: ModelSpec, parallelism: Parallelism, num_tokens: int) -> float:
    """Torch activation peak of one eager forward over `num_tokens` tokens on one GPU
    (GPUModelRunner._dummy_run(max_num_tokens), called by profile_run): the residual stream, the
    layer's input and the all-reduced output ([tokens, hidden] each, 3 tensors) live throughout;
    on top the larger of attention's (QKV projection output + attention output) and the FFN's
    (gate/up output + SwiGLU product), or for an MoE layer fused_moe's three intermediate caches
    (vllm/model_executor/layers/fused_moe/fused_moe.py: [tokens, k, 2F], [tokens*k, F], [tokens, k, hidden])."""
    act = DTYPE_BYTES[spec.compute_dtype]
    p = parallelism
    stream = 3 * num_tokens * spec.hidden_size
    if spec.is_mla:
        qkv_width = p.split(spec.num_heads) * (spec.head_dim + spec.rope_head_dim) + spec.kv_latent_dim + spec.rope_head_dim
    else:
        qkv_width = (p.split(spec.num_heads) + 2 * p.kv_heads(spec.num_kv_heads)) * spec.head_dim
    attention = num_tokens * (qkv_width + p.split(spec.num_heads) * spec.head_dim)
    ffn = 3 * num_tokens * p.split(spec.ffn_size) if spec.num_ffn_dense_layers else 0
    if spec.is_moe:
        expert_width = spec.expert_ffn_size / p.moe_tp
        routed = num_tokens * spec.experts_per_token * (3 * expert_width + spec.hidden_size)
        ffn = max(ffn, routed)
    return (stream + max(attention, ffn)) * act


def sampler_peak_bytes(spec: ModelSpec, num_rows: int, num_tokens: int) -> float:
    """Torch peak of GPUModelRunner._dummy_sampler_run (after profile_run's forward): the
    forward's [tokens, hidden] output still held, and every sequence's logits over the whole
    vocabulary (the LM head's output is gathered on every tensor-parallel rank) as the sampler
    holds them (the logits in the compute dtype and SAMPLER_EXTRA_BYTES_PER_LOGIT)."""
    act = DTYPE_BYTES[spec.compute_dtype]
    return num_tokens * spec.hidden_size * act + num_rows * spec.vocab_size * (act + SAMPLER_EXTRA_BYTES_PER_LOGIT)


def profile_activation_bytes(spec: ModelSpec, parallelism: Parallelism, limits: VllmEngineLimits) -> float:
    """What memory_profiling reports as torch_peak_increase for profile_run: the larger of the
    dummy forward's and the dummy sampler run's peaks (the forward's intermediates are freed before
    sampling)."""
    num_tokens = limits.max_num_batched_tokens
    return max(forward_peak_bytes(spec, parallelism, num_tokens),
               sampler_peak_bytes(spec, limits.num_sampler_rows, num_tokens))


def non_torch_bytes(parallelism: Parallelism) -> int:
    return NON_TORCH_BYTES_ONE_GPU if parallelism.tp == 1 else NON_TORCH_BYTES_MULTI_GPU


@dataclass(frozen=True)
class VllmKvBudget:
    """One GPU's memory as vLLM V1 splits it at start-up, in bytes, and the blocks that follow."""
    requested_bytes: float
    weight_bytes: float
    activation_bytes: float
    non_torch_bytes: float
    cuda_graph_bytes: float
    block_bytes: float

    @property
    def kv_bytes(self) -> float:
        return (self.requested_bytes - self.weight_bytes - self.activation_bytes - self.non_torch_bytes
                - self.cuda_graph_bytes)

    @property
    def num_blocks(self) -> int:
        return int(self.kv_bytes // self.block_bytes)


def vllm_kv_budget(spec: ModelSpec, block_size: int, device_memory_gib: float, utilization: float,
                   parallelism: Parallelism, limits: VllmEngineLimits) -> VllmKvBudget:
    """The split of one GPU's `device_memory_gib` (GiB, as CUDA reports the total) for `spec`
    under `parallelism` and the engine `limits`."""
    if not 0 < utilization <= 1:
        raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {utilization}")
    if block_size <= 0:
        raise InputError(f"--block-size must be positive, got {block_size}")
    return VllmKvBudget(
        requested_bytes=device_memory_gib * GIB_BYTES * utilization,
        weight_bytes=spec.weight_bytes_per_gpu(parallelism),
        activation_bytes=profile_activation_bytes(spec, parallelism, limits),
        non_torch_bytes=non_torch_bytes(parallelism),
        cuda_graph_bytes=limits.cuda_graph_bytes,
        block_bytes=spec.kv_bytes_per_token_per_gpu(parallelism) * block_size)


def vllm_kv_blocks(spec: ModelSpec, block_size: int, device_memory_gib: float, utilization: float = 0.9,
                   parallelism: Parallelism | None = None, limits: VllmEngineLimits | None = None) -> int:
    """vLLM V1's num_gpu_blocks for `spec` on GPUs of `device_memory_gib`; InputError if the
    weights and the profile run leave no room for one block."""
    parallelism = parallelism or Parallelism()
    budget = vllm_kv_budget(spec, block_size, device_memory_gib, utilization, parallelism,
                            limits or VllmEngineLimits())
    if budget.num_blocks <= 0:
        split = f" at tp {parallelism.tp}, ep {parallelism.ep}" if parallelism != Parallelism() else ""
        raise InputError(f"--device-memory-gb {device_memory_gib}: the weights of {spec.name}{split} "
                         f"({budget.weight_bytes / GIB_BYTES:.1f} GiB per GPU) and vLLM's profile run "
                         f"({(budget.activation_bytes + budget.non_torch_bytes) / GIB_BYTES:.2f} GiB) "
                         f"leave no room for a KV cache")
    return budget.num_blocks
