"""Whether a model can be split `--tp` / `--ep` ways at all: the one check every command taking
those flags runs before any work."""
from __future__ import annotations

from stepcal.core.errors import InputError
from stepcal.core.model_spec import ModelSpec, Parallelism


def checked_parallelism(spec: ModelSpec | None, tp: int = 1, ep: int = 1, source: str | None = None) -> Parallelism:
    """Parallelism(tp, ep), refused (InputError naming the flag and the model) where vLLM would
    refuse to load the model so split. vLLM's rules:

    - query heads: num_heads % tp == 0;
    - KV heads: if num_kv_heads >= tp, num_kv_heads % tp == 0 (each GPU holds num_kv_heads / tp);
      else tp % num_kv_heads == 0, and each KV head is replicated tp / num_kv_heads times (each GPU
      holds one, which Parallelism.kv_heads and so the KV bytes per GPU already count);
    - experts, for a mixture-of-experts model under expert parallelism: num_experts % ep == 0 and
      ep <= num_experts (at least one expert per GPU). A dense model ignores ep.

    Parallelism itself refuses an ep that does not divide tp. Without a spec only that is checked."""
    parallelism = Parallelism(tp=tp, ep=ep)
    if spec is None:
        return parallelism
    model = source or spec.name
    if spec.num_heads % parallelism.tp:
        raise InputError(f"--tp {parallelism.tp}: {model} has {spec.num_heads} attention heads (num_heads), "
                         f"which --tp must divide; it could be {_divisors(spec.num_heads)}")
    kv, tp = spec.num_kv_heads, parallelism.tp
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise InputError(f"--tp {tp}: {model} has {kv} KV heads (num_kv_heads); --tp must divide them, "
                         f"or be a multiple of them to replicate each head; it could be "
                         f"{_divisors(spec.num_heads, lambda d: d % kv == 0 or kv % d == 0)}")
    if spec.is_moe and parallelism.ep > 1:
        experts, ep = spec.num_experts, parallelism.ep
        if ep > experts or experts % ep:
            raise InputError(f"--ep {ep}: {model} has {experts} experts (num_experts), which --ep must "
                             f"divide with at least one expert per GPU; it could be "
                             f"{_divisors(experts, lambda d: tp % d == 0)}")
    return parallelism


def _divisors(n: int, keep=lambda d: True) -> str:
    """The divisors of n up to 1024 (the flags' range) that `keep` accepts, for a message."""
    found = [d for d in range(1, min(n, 1024) + 1) if n % d == 0 and keep(d)]
    return ", ".join(map(str, found))
