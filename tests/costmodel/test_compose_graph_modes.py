"""The all-reduce term under tensor parallelism follows vLLM's CUDA-graph modes: a step of up to the
largest captured graph replays its all-reduces in the graph, a larger step launches them eagerly.

Stub regressors price each all-reduce at a constant (1 ms in a graph, 3 ms eager), so the term's
values count the calls and say which way each was priced."""
import numpy as np
import pandas as pd
import pytest

from stepcal.core.model_spec import PRESETS, Parallelism
from stepcal.costmodel.compose import Axes, compose_terms, op_grids, per_token_terms_ms
from stepcal.costmodel.compose_comm import GRAPH_MAX_TOKENS, Composition, all_reduce_eager_target
from stepcal.costmodel.fitting import FitConfig, FitResult, TargetFit
from stepcal.costmodel.records import make_records
from stepcal.costmodel.tuning import default_choice

LLAMA = PRESETS["llama-2-70b"]
TP4 = Parallelism(tp=4)
AXES = Axes(num_tokens=np.array([1.0, 64.0, float(GRAPH_MAX_TOKENS), 2048.0]), num_seqs=np.array([1.0, 64.0]),
            kv_mean=np.array([1.0, 4096.0]), prefill_tokens=np.array([1.0, 2048.0]),
            prefill_ctx=np.array([1.0, 4096.0]))
GRAPH_MS, EAGER_MS = 1.0, 3.0


class ConstMs:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def predict(self, X):
        return np.full(len(X), self.ms)


def _result(all_reduce: dict[str, float]) -> FitResult:
    prices = {"gemm": 1.0, "attn_decode": 1.0, "attn_prefill": 1.0, **all_reduce}
    fits = {t: TargetFit(t, t.split(":")[0], (), (), default_choice("gemm"), ConstMs(ms), 10, {}, {})
            for t, ms in prices.items()}
    records = make_records({"row": np.arange(1), "op": "gemm", "name": None, "time_ms": 1.0, "num_tokens": [1.0],
                            "m": [1], "n": [1], "k": [1]}, source="test", file="test")
    return FitResult(fits, {}, "hash", pd.DataFrame(records), FitConfig(regressor="rf"))


def _all_reduce(result: FitResult, composition: Composition) -> np.ndarray:
    ops = op_grids(result, LLAMA, TP4, AXES, composition)
    term = next(t for t in compose_terms(result, LLAMA, TP4, AXES, ops, composition) if t.name == "all_reduce")
    # the resolution check reads the regressors the same way the term holds them
    direct = per_token_terms_ms(result, LLAMA, TP4, AXES.num_tokens, composition)["all_reduce"]
    np.testing.assert_allclose(term.time_ms, direct)
    return np.asarray(term.time_ms)


BOTH = {"all_reduce:vllm_graph": GRAPH_MS, "all_reduce:vllm_eager": EAGER_MS}
PER_STEP = 2 * LLAMA.num_layers       # after attention and after the FFN, in every layer


def test_steps_above_the_largest_graph_launch_their_all_reduces_eagerly():
    result = _result(BOTH)
    assert all_reduce_eager_target(result) == "all_reduce:vllm_eager"
    expected = np.where(AXES.num_tokens > GRAPH_MAX_TOKENS, EAGER_MS, GRAPH_MS) * PER_STEP
    np.testing.assert_allclose(_all_reduce(result, Composition()), expected)
    assert expected[-1] > expected[0]                 # the 2048-token step is priced eager


@pytest.mark.parametrize("all_reduce, composition", [
    (BOTH, Composition(graph_max_tokens=None)),                  # told to price every step as a graph replay
    ({"all_reduce:vllm_graph": GRAPH_MS}, Composition()),        # no eager data: the graph one throughout
    ({"all_reduce:nccl": GRAPH_MS}, Composition()),              # one implementation, modes unknown
])
def test_without_an_eager_profile_or_told_not_every_step_is_priced_one_way(all_reduce, composition):
    np.testing.assert_allclose(_all_reduce(_result(all_reduce), composition), GRAPH_MS * PER_STEP)
