"""What Vidur (microsoft/vidur) reads from a profile directory: its model configs' filter keys, the
row filters of its execution-time predictor, the columns it trains on, and the sweeps its
profilers run. Facts from Vidur's repository, cited where they are used; nothing here imports Vidur.

Vidur keeps only the rows of mlp.csv and attention.csv whose keys equal its model config's (and the
replica's tensor-parallel degree and block size): a key that differs by one (vocab_size 32000 for
32768) leaves it no rows, and it stops with "Training data for model attn_pre_proj is empty".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from stepcal.core.errors import InputError
from stepcal.core.model_spec import ModelSpec

VIDUR_REPO = "microsoft/vidur"


@dataclass(frozen=True)
class VidurModel:
    """The fields of one of Vidur's model configs that its row filters read (and num_layers)."""
    name: str                 # Vidur's model name: its profiles sit in data/profiling/compute/<device>/<name>/
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    embedding_dim: int
    mlp_hidden_dim: int
    use_gated_mlp: bool
    vocab_size: int


# vidur/config/model_config.py @ 86e0a99a9624931a4ef7ae61d2e73d7122ff8b35 (microsoft/vidur). Llama-2,
# CodeLlama and their kin inherit vocab_size 32768 from Llama2ModelConfig (Hugging Face: 32000), and
# Vidur's own profiles of them carry 32768 too.
#           name                                   layers q_heads kv_heads  embd  mlp_hidden gated  vocab
VIDUR_MODELS = {m.name: m for m in (
    VidurModel("meta-llama/Llama-2-7b-hf",            32,   32,     32,     4096,  11008,    True,  32768),
    VidurModel("meta-llama/Llama-2-70b-hf",           80,   64,      8,     8192,  28672,    True,  32768),
    VidurModel("meta-llama/Meta-Llama-3-8B",          32,   32,      8,     4096,  14336,    True, 128256),
    VidurModel("meta-llama/Meta-Llama-3-70B",         80,   64,      8,     8192,  28672,    True, 128256),
    VidurModel("codellama/CodeLlama-34b-Instruct-hf", 48,   64,      8,     8192,  22016,    True,  32768),
    VidurModel("Qwen/Qwen-72B",                       80,   64,     64,     8192,  24576,    True, 152064),
    VidurModel("internlm/internlm-20b",               60,   40,     40,     5120,  13824,    True, 103168),
    VidurModel("internlm/internlm2-20b",              48,   48,      8,     6144,  16384,    True,  92544),
    VidurModel("microsoft/phi-2",                     32,   32,     32,     2560,  10240,    False, 51200),
)}


@dataclass(frozen=True)
class FilterKey:
    """One key Vidur filters profile rows on: its CSV column, the Vidur config field it is compared
    with, and what of ours it is."""
    column: str           # the column of mlp.csv / attention.csv
    vidur: str            # the VidurModel (model config) field; "tp" / "block_size": the replica's
    ours: str             # a ModelSpec field; "gated": always (our models are SwiGLU); "tp", "block_size"
    shape: bool           # part of the layer's shape (a mismatch refuses); False: Vidur only filters on it


# Ours -> theirs. sklearn_execution_time_predictor.py (_load_compute_df, _load_attention_df) @ 16525b6.
# The keys both files share; the query heads' column is n_head in mlp.csv, n_q_head in attention.csv.
_KV_HEADS = FilterKey("n_kv_head", "num_kv_heads", "num_kv_heads", True)
_EMBD = FilterKey("n_embd", "embedding_dim", "hidden_size", True)
_TP = FilterKey("num_tensor_parallel_workers", "tp", "tp", False)
MLP_KEYS = (
    FilterKey("n_head", "num_q_heads", "num_heads", True), _KV_HEADS, _EMBD,
    FilterKey("n_expanded_embd", "mlp_hidden_dim", "ffn_size", True),
    FilterKey("use_gated_mlp", "use_gated_mlp", "gated", True),
    FilterKey("vocab_size", "vocab_size", "vocab_size", False), _TP,
)
ATTENTION_KEYS = (
    _EMBD, FilterKey("n_q_head", "num_q_heads", "num_heads", True), _KV_HEADS,
    FilterKey("block_size", "block_size", "block_size", False), _TP,
)
MODEL_COLUMNS = tuple(k.column for k in MLP_KEYS if k.column != "num_tensor_parallel_workers")
SHAPE_COLUMNS = tuple(k.column for k in MLP_KEYS if k.shape)
# The paged-attention block size Vidur's replica schedulers and attention profiler default to.
VIDUR_BLOCK_SIZE = 16

# The operators Vidur trains a model of each from mlp.csv (time_stats.<op>.median over num_tokens),
# and from attention.csv; the other columns it reads.
MLP_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act", "input_layernorm",
           "post_attention_layernorm", "attn_rope", "add")
ATTENTION_OPS = ("attn_prefill", "attn_decode", "attn_kv_cache_save")
STATS = ("min", "max", "mean", "median", "std")
MLP_REQUIRED = tuple(k.column for k in MLP_KEYS) + ("num_tokens",) + tuple(f"time_stats.{op}.median" for op in MLP_OPS)
ATTENTION_REQUIRED = tuple(k.column for k in ATTENTION_KEYS) + (
    "batch_size", "prefill_chunk_size", "kv_cache_size") + tuple(f"time_stats.{op}.median" for op in ATTENTION_OPS)

# Vidur's attention profiler defaults (vidur/profiling/attention/main.py @ 1478250): sequences up to
# 4096 tokens, decode batches of 1 to 128.
VIDUR_MAX_SEQ_LEN = 4096
VIDUR_MAX_BATCH_SIZE = 128


def stat_columns(op: str, time_ms: np.ndarray, spread_ms: np.ndarray) -> dict[str, np.ndarray]:
    """The time_stats.<op>.<stat> columns Vidur's profiles hold, from a time and its spread (one
    standard deviation): Vidur trains on the median; min and max are a spread either side."""
    return {f"time_stats.{op}.min": np.maximum(time_ms - spread_ms, 0.5 * time_ms),
            f"time_stats.{op}.max": time_ms + spread_ms,
            f"time_stats.{op}.mean": time_ms, f"time_stats.{op}.median": time_ms,
            f"time_stats.{op}.std": spread_ms}


def vidur_model(name: str) -> VidurModel:
    """A Vidur model config by its name ("meta-llama/Llama-2-7b-hf"), or by the part after the
    slash in any case ("llama-2-7b-hf")."""
    if name in VIDUR_MODELS:
        return VIDUR_MODELS[name]
    short = {n.split("/")[-1].lower(): m for n, m in VIDUR_MODELS.items()}
    if name.lower() in short:
        return short[name.lower()]
    raise InputError(f"--vidur-model: unknown Vidur model {name!r}; known: {', '.join(VIDUR_MODELS)}")


def model_keys(model: VidurModel) -> dict:
    """The mlp.csv model keys (column -> value) of a Vidur model config."""
    fields = asdict(model)
    return {k.column: fields[k.vidur] for k in MLP_KEYS if k.column in MODEL_COLUMNS}


def spec_keys(spec: ModelSpec) -> dict:
    """The mlp.csv model keys (column -> value) of our model spec, as written (vocabulary unpadded)."""
    fields = {**asdict(spec), "gated": True}
    return {k.column: fields[k.ours] for k in MLP_KEYS if k.column in MODEL_COLUMNS}


def like_spec(spec: ModelSpec) -> VidurModel | None:
    """The Vidur config of our model spec in Vidur's convention: same layers and layer shape; of
    several (Llama-2-70B and Llama-3-70B differ in vocabulary only), the one with our vocabulary,
    else the smallest vocabulary above ours (Vidur pads Llama-2's 32000 to 32768)."""
    if spec.is_moe or spec.is_mla:
        return None
    ours = spec_keys(spec)
    same = [m for m in VIDUR_MODELS.values() if m.num_layers == spec.num_layers
            and all(model_keys(m)[c] == ours[c] for c in SHAPE_COLUMNS)]
    exact = [m for m in same if m.vocab_size == spec.vocab_size]
    above = sorted((m for m in same if m.vocab_size > spec.vocab_size), key=lambda m: m.vocab_size)
    return (exact or above or [None])[0]


def as_vidur_model(spec: ModelSpec) -> VidurModel:
    """Vidur's config of our model spec: its own where it has one of the same shape (like_spec), else
    the config a person would add to Vidur for it (the spec's sizes, SwiGLU)."""
    like = like_spec(spec)
    if like is not None:
        return like
    keys = spec_keys(spec)
    return VidurModel(spec.name, spec.num_layers, keys["n_head"], keys["n_kv_head"], keys["n_embd"],
                      keys["n_expanded_embd"], keys["use_gated_mlp"], keys["vocab_size"])


def num_tokens_sweep(max_num_tokens: int) -> np.ndarray:
    """The num_tokens Vidur's MLP profiler times, ascending, up to max_num_tokens: 1, 2, 4, every 8
    to 1024, every 16 to 2048, every 32 to 4096, then every 64, 128, 256, 512, 1024 up to 131072
    (each step doubling with the range: the powers of two among them).
    get_num_tokens_to_profile, vidur/profiling/utils/__init__.py @ 4867101."""
    space = ([1, 2, 4] + list(range(8, 1024, 8)) + list(range(1024, 2 * 1024 + 1, 16))
             + list(range(2 * 1024, 4 * 1024 + 1, 32)) + list(range(4 * 1024, 8 * 1024 + 1, 64))
             + list(range(8 * 1024, 16 * 1024 + 1, 128)) + list(range(16 * 1024, 32 * 1024 + 1, 256))
             + list(range(32 * 1024, 64 * 1024 + 1, 512)) + list(range(64 * 1024, 128 * 1024 + 1, 1024)))
    return np.array(sorted({t for t in space if t <= max_num_tokens}), dtype=np.int64)


def attention_inputs(max_seq_len: int = VIDUR_MAX_SEQ_LEN, max_batch_size: int = VIDUR_MAX_BATCH_SIZE) -> pd.DataFrame:
    """The points Vidur's attention profiler times (get_attention_input_combinations and
    AttentionInput.is_valid, vidur/profiling/ @ 4867101): chunked prefills of each chunk size over
    caches of whole chunks, full prefills, and decode batches of 1..max_batch_size over every cache
    length. Columns prefill_chunk_size, kv_cache_size, batch_size, is_prefill."""
    chunks = [c for c in (list(range(64, 128 + 1, 16)) + list(range(128, 1024 + 1, 32))
                          + list(range(1024, 4 * 1024 + 1, 64)) + list(range(4 * 1024, 16 * 1024 + 1, 128))
                          + list(range(16 * 1024, 64 * 1024 + 1, 256))) if c <= max_seq_len]
    lengths = [s for s in (list(range(0, 1024 + 1, 32)) + list(range(1024, 4 * 1024 + 1, 64))
                           + list(range(4 * 1024, 64 * 1024 + 1, 256))) if s < max_seq_len]
    batches = [b for b in list(range(1, 128 + 1)) + list(range(128, 1024 + 1, 8)) if b <= max_batch_size]
    rows = [(c, c * i, 1, True) for c in chunks for i in range(max_seq_len // c)]
    rows += [(s, 0, 1, True) for s in lengths]
    rows += [(0, s, b, False) for s in lengths for b in batches]

    def valid(chunk, kv, batch, is_prefill) -> bool:
        if is_prefill:
            return batch == 1 and chunk > 0 and chunk + kv <= max_seq_len
        return chunk == 0 and 0 < kv <= max_seq_len

    frame = pd.DataFrame([r for r in rows if valid(*r)],
                         columns=["prefill_chunk_size", "kv_cache_size", "batch_size", "is_prefill"])
    return frame.drop_duplicates(ignore_index=True)


def mlp_rows(frame: pd.DataFrame, model: VidurModel, tp: int) -> pd.DataFrame:
    """The rows of an mlp.csv (as pandas reads it) that Vidur trains on for `model` at TP `tp`."""
    wanted = {**model_keys(model), "num_tensor_parallel_workers": tp}
    return _matching(frame.drop_duplicates(), wanted)


def attention_rows(frame: pd.DataFrame, model: VidurModel, tp: int,
                   block_size: int = VIDUR_BLOCK_SIZE) -> pd.DataFrame:
    """The rows of an attention.csv that Vidur trains on for `model` at TP `tp`."""
    fields = {**asdict(model), "tp": tp, "block_size": block_size}
    return _matching(frame.drop_duplicates(), {k.column: fields[k.vidur] for k in ATTENTION_KEYS})


def _matching(frame: pd.DataFrame, wanted: dict) -> pd.DataFrame:
    keep = np.ones(len(frame), dtype=bool)
    for column, value in wanted.items():
        keep &= (frame[column] == value).to_numpy()
    return frame[keep]


def contract_problems(mlp: pd.DataFrame, attention: pd.DataFrame, model: VidurModel, tp: int) -> list[str]:
    """What would stop Vidur training its predictors on these files for `model` at TP `tp`: missing
    columns, no rows left by its filters, missing or non-positive times where it reads them. Empty
    when Vidur can run."""
    problems = [f"mlp.csv lacks {c}" for c in MLP_REQUIRED if c not in mlp.columns]
    problems += [f"attention.csv lacks {c}" for c in ATTENTION_REQUIRED if c not in attention.columns]
    if problems:
        return problems
    rows = mlp_rows(mlp, model, tp)
    if rows.empty:
        got = mlp[list(MODEL_COLUMNS) + ["num_tensor_parallel_workers"]].drop_duplicates().to_dict("records")
        problems.append(f"no mlp.csv row passes Vidur's filter for {model.name} at TP {tp} (rows hold {got})")
    for op in MLP_OPS:
        times = rows[f"time_stats.{op}.median"]
        if times.isna().any() or (times < 0).any():
            problems.append(f"mlp.csv: time_stats.{op}.median missing or negative")
    att = attention_rows(attention, model, tp)
    decode = att[att["prefill_chunk_size"] == 0]
    prefill = att[att["prefill_chunk_size"] > 0]
    for what, part, op in (("decode", decode, "attn_decode"), ("prefill", prefill, "attn_prefill")):
        if part.empty:
            problems.append(f"no attention.csv {what} row passes Vidur's filter for {model.name} at TP {tp}")
        elif part[f"time_stats.{op}.median"].isna().any() or (part[f"time_stats.{op}.median"] <= 0).any():
            problems.append(f"attention.csv: time_stats.{op}.median missing or not positive on {what} rows")
    if att["time_stats.attn_kv_cache_save.median"].isna().any():
        problems.append("attention.csv: time_stats.attn_kv_cache_save.median missing")
    return problems
