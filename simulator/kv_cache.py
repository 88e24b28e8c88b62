"""Paged KV block manager: the accounting that bounds admission and triggers preemption."""
from __future__ import annotations

from dataclasses import dataclass

from stepcal.core.errors import InputError
from stepcal.core.model_files import load_model_spec
from stepcal.core.model_spec import ModelSpec, Parallelism
from stepcal.core.parallel_layout import checked_parallelism
from stepcal.simulator.request import Request
from stepcal.simulator.vllm_kv import VllmEngineLimits, vllm_kv_blocks

# How --device-memory-gb turns into blocks: "weights" leaves memory x utilisation - weights to the
# cache; "vllm" also takes off what vLLM V1's start-up profile run measures (simulator.vllm_kv).
KV_SIZINGS = ("weights", "vllm")


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def kv_blocks_from_memory(spec: ModelSpec, block_size: int, device_memory_gb: float,
                          utilization: float = 0.9, activation_reserve_gb: float = 0.0,
                          parallelism: Parallelism | None = None) -> int:
    """Blocks that fit in one GPU's memory × utilisation after its share of the weights (as vLLM
    sizes its cache; every GPU of an instance holds the same blocks, each its share of them)."""
    if not 0 < utilization <= 1:
        raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {utilization}")
    parallelism = parallelism or Parallelism()
    weights = spec.weight_bytes_per_gpu(parallelism)
    budget = device_memory_gb * 2**30 * utilization - weights - activation_reserve_gb * 2**30
    num_blocks = int(budget // (spec.kv_bytes_per_token_per_gpu(parallelism) * block_size))
    if num_blocks <= 0:
        split = f" at tp {parallelism.tp}, ep {parallelism.ep}" if parallelism != Parallelism() else ""
        raise InputError(f"--device-memory-gb {device_memory_gb}: the weights of {spec.name}{split} "
                         f"({weights / 2**30:.1f} GiB per GPU) leave no room for a KV cache")
    return num_blocks


@dataclass(frozen=True)
class KvCacheSizing:
    """How big a replica's KV cache is: `kv_blocks` blocks of `block_size` tokens where given, else as
    many as fit in `device_memory_gb` beside the model's weights (split `tp` / `ep` ways), else
    unlimited (None). `sizing` "vllm" also subtracts vLLM's profile run for `max_num_batched_tokens`
    (None: vLLM's 8192) and `max_num_seqs`."""
    block_size: int = 16
    kv_blocks: int | None = None
    device_memory_gb: float | None = None
    gpu_memory_utilization: float = 0.9
    tp: int = 1
    ep: int = 1
    sizing: str = "weights"
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 256

    def num_blocks(self, model_spec: str | None) -> int | None:
        """The cache's blocks; `model_spec` (a preset or file) gives the weights and KV bytes per token
        when they are derived from the device's memory. A given spec is read, and the tp / ep split
        checked against it, even when --kv-blocks is given: a broken spec is never passed over."""
        spec = load_model_spec(model_spec) if model_spec else None
        parallelism = checked_parallelism(spec, self.tp, self.ep, model_spec)
        if self.kv_blocks is not None or self.device_memory_gb is None:
            return self.kv_blocks
        if spec is None:
            raise InputError("--device-memory-gb needs --model-spec to size the KV cache")
        if self.sizing not in KV_SIZINGS:
            raise InputError(f"--kv-sizing must be one of {', '.join(KV_SIZINGS)}, got {self.sizing!r}")
        if self.sizing == "vllm":
            limits = VllmEngineLimits(self.max_num_batched_tokens or VllmEngineLimits.max_num_batched_tokens,
                                      self.max_num_seqs)
            return vllm_kv_blocks(spec, self.block_size, self.device_memory_gb,
                                  self.gpu_memory_utilization, parallelism, limits)
        return kv_blocks_from_memory(spec, self.block_size, self.device_memory_gb,
                                     self.gpu_memory_utilization, parallelism=parallelism)


@dataclass
class BlockManager:
    """Counts blocks per request; allocation happens as tokens are scheduled, freeing on finish or preemption."""
    num_blocks: int
    block_size: int = 16

    def __post_init__(self) -> None:
        if self.num_blocks <= 0 or self.block_size <= 0:
            raise InputError(f"KV cache needs positive --kv-blocks and --block-size, got "
                             f"{self.num_blocks} and {self.block_size}")
        self.num_free_blocks = self.num_blocks

    def blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        total = blocks_for(request.num_computed_tokens + num_new_tokens, self.block_size)
        return max(0, total - request.num_blocks)

    def lookup(self, request: Request):
        """The cached prefix a waiting request would reuse: none without prefix caching."""
        return None

    def admission_blocks(self, request: Request, max_new_tokens: int) -> int:
        """Free blocks that admitting `request` with at most max_new_tokens new tokens would use."""
        return self.blocks_needed(request, min(request.num_pending_tokens, max_new_tokens))

    def allocate(self, request: Request, num_new_tokens: int, hit=None) -> bool:
        """Reserve room for num_new_tokens more tokens of `request`; False (and no change) if it does
        not fit. `hit` (from lookup) is always None here."""
        if request.num_computed_tokens + num_new_tokens <= request.num_blocks * self.block_size:
            return True   # the common decode case: room left in the last block
        need = self.blocks_needed(request, num_new_tokens)
        if need > self.num_free_blocks:
            return False
        self.num_free_blocks -= need
        request.num_blocks += need
        return True

    def grow_to(self, request: Request, num_tokens: int) -> None:
        """Hold enough blocks for num_tokens cached tokens (used by decode runs, whose fit is checked first)."""
        need = blocks_for(num_tokens, self.block_size) - request.num_blocks
        if need > 0:
            assert need <= self.num_free_blocks, "decode run outgrew the KV cache"
            self.num_free_blocks -= need
            request.num_blocks += need

    def grow_all(self, requests: list[Request], num_tokens: list[int]) -> None:
        """grow_to for each request in order (a decode run's growth, in one call)."""
        for request, n in zip(requests, num_tokens):
            self.grow_to(request, n)

    def free(self, request: Request) -> None:
        self.num_free_blocks += request.num_blocks
        request.num_blocks = 0


def uses_prefix_caching(scheduler: str, setting: bool | None) -> bool:
    """--prefix-caching as set, or by default: on for the vllm scheduler (as in vLLM's V1 engine),
    off for the others."""
    return scheduler == "vllm" if setting is None else setting
