"""What tensor parallelism adds to an engine's published host terms (`--host-defaults` at `--tp` > 1).

An engine in experiments/data/serving_defaults.json may carry a `tensor_parallel` block beside its
`terms`: the same terms, each with its source and derivation, that a model instance spread over more
than one GPU adds (for vLLM V1, the multiprocess executor's shared-memory queues between the engine
core and its worker processes). At TP 1 nothing is added and the engine's terms are returned as they
are, so a single-GPU prediction does not move. Expert parallelism runs on the same worker processes
and adds no host work of its own: the worker count is the TP degree.

The tables a step model was fitted from may record their own TP (`stepcal fit --tp`); `deployment_tp`
takes the flag, else the tables' degree, and refuses the two when they disagree."""
from __future__ import annotations

from stepcal.core.errors import InputError

TP_BLOCK = "tensor_parallel"
# A spread does not add: the per-request sigma of the request path stays the engine's own.
NOT_ADDED = ("per_request_sigma",)


def tp_block_terms(entry: dict) -> dict | None:
    """The `tensor_parallel` block's terms of an engine entry ({name: {value, ...}}), None without one."""
    block = entry.get(TP_BLOCK)
    return None if block is None else block.get("terms")


def check_tp_block(path, engine: str, entry: dict, names: set, check_term) -> None:
    """The block, where there is one, gives every term as the engine's `terms` do, each checked by
    `check_term(path, where, term, ...)` as those are, and no spread (it would not add)."""
    if TP_BLOCK not in entry:
        return
    block = entry[TP_BLOCK]
    terms = block.get("terms") if isinstance(block, dict) else None
    where = f"engines.{engine}.{TP_BLOCK}"
    if not isinstance(terms, dict) or set(terms) != names or not block.get("description"):
        raise InputError(f"{path}: {where} must have a description and terms giving each of {', '.join(sorted(names))}")
    for name, term in terms.items():
        check_term(f"{where}.terms.{name}", term)
        if name in NOT_ADDED and term.get("value") != 0:
            raise InputError(f"{path}: {where}.terms.{name} must be 0: a spread is not added to the engine's own")


def with_tp_terms(values: dict[str, float], tp_terms: dict | None, tp: int) -> dict[str, float]:
    """The engine's term values with the block's added at `tp` > 1; `values` itself at TP 1 or
    for an engine without a block."""
    if tp <= 1 or not tp_terms:
        return values
    return {name: value if name in NOT_ADDED else value + tp_terms[name]["value"] for name, value in values.items()}


def deployment_tp(flag_tp: int, models) -> int:
    """The TP degree the host terms are for: --tp where given (above 1), else the degree the step
    models' tables were fitted at (meta.json's `tp`), else 1. InputError where --tp and the tables
    name two different degrees above 1."""
    fitted = {tp for tp in (_tables_tp(model) for model in models) if tp and tp > 1}
    if len(fitted) > 1:
        raise InputError(f"--step-model: the tables were fitted at different TP degrees {sorted(fitted)}")
    if flag_tp > 1 and fitted and fitted != {flag_tp}:
        raise InputError(f"--tp {flag_tp}: the --step-model tables were fitted at --tp {fitted.pop()}; "
                         f"pass the tables of the deployment's TP, or its --tp")
    return flag_tp if flag_tp > 1 else (fitted.pop() if fitted else 1)


def _tables_tp(model) -> int | None:
    """meta.json's `tp` of the tables under `model` (wrapped as `base` by host terms), None elsewhere."""
    while hasattr(model, "base"):
        model = model.base
    meta = getattr(model, "meta", None)
    return getattr(meta, "tp", None)
