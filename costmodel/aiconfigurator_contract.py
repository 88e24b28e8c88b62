"""What AIConfigurator's loader requires of a system (its reader contract), as observed on its
0.12.0 release reading the vLLM 0.14.0 tables: a `<system>.yaml` whose `data_dir` names the
tables' directory, and one Parquet file per kernel table at
`<data_dir>/<family>/<backend>/<version>/<table>.parquet`.

Its loader refuses a table without one of the columns listed here, and an integer column stored
as floats ("Cannot access Double as Long"); it ignores columns it does not know, so an export may
add its own (`stepcal_source`). It looks shapes up in a grid and interpolates between grid points,
so a table must hold the grid its lookups land in: SHAPES gives the grid of each table, the same
points AIConfigurator's own vLLM tables hold on an H100.

The system yaml's required keys (SYSTEM_KEYS): without any of them it stops with a missing-field
or KeyError. Everything here is plain data, so a test can check an export without AIConfigurator.
"""
from __future__ import annotations

from dataclasses import dataclass

INT, FLOAT, TEXT = "int64", "double", "string"


@dataclass(frozen=True)
class TableContract:
    """One kernel table: its family directory, its required columns and their Parquet types, and
    the columns that say which shape a row times (no two rows may share them)."""
    family: str
    columns: dict[str, str]
    key: tuple[str, ...]


_ATTENTION = {"batch_size": INT, "isl": INT, "num_heads": INT, "num_key_value_heads": INT,
              "head_dim": INT, "beam_width": INT,     # beam_width: not required, but in its own files
              "attn_dtype": TEXT, "kv_cache_dtype": TEXT, "latency": FLOAT}
_MLA = {"mla_dtype": TEXT, "kv_cache_dtype": TEXT, "num_heads": INT, "batch_size": INT, "isl": INT,
        "tp_size": INT, "step": INT, "latency": FLOAT}
TABLES = {
    "gemm_perf": TableContract("gemm", {"gemm_dtype": TEXT, "m": INT, "n": INT, "k": INT, "latency": FLOAT},
                               ("gemm_dtype", "m", "n", "k")),
    "context_attention_perf": TableContract(
        "attention", _ATTENTION,
        ("kv_cache_dtype", "num_heads", "num_key_value_heads", "head_dim", "batch_size", "isl")),
    "generation_attention_perf": TableContract(
        "attention", {**_ATTENTION, "step": INT},
        ("kv_cache_dtype", "num_heads", "num_key_value_heads", "head_dim", "batch_size", "step")),
    "custom_allreduce_perf": TableContract(
        "comm", {"allreduce_dtype": TEXT, "num_gpus": INT, "message_size": INT, "latency": FLOAT, "backend": TEXT},
        ("backend", "allreduce_dtype", "num_gpus", "message_size")),
    "moe_perf": TableContract(
        "moe", {"moe_dtype": TEXT, "num_tokens": INT, "hidden_size": INT, "inter_size": INT, "topk": INT,
                "num_experts": INT, "moe_tp_size": INT, "moe_ep_size": INT, "distribution": TEXT,
                "latency": FLOAT},
        ("moe_dtype", "distribution", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
         "moe_ep_size", "num_tokens")),
    "context_mla_perf": TableContract("mla", _MLA, ("kv_cache_dtype", "num_heads", "tp_size", "batch_size", "isl")),
    "generation_mla_perf": TableContract("mla", _MLA,
                                         ("kv_cache_dtype", "num_heads", "tp_size", "batch_size", "step")),
}
# Tables no estimate runs without, an MLA model's included (all-reduce only under TP > 1).
REQUIRED_TABLES = ("gemm_perf", "context_attention_perf", "generation_attention_perf")

# The system yaml: section -> keys its loader requires (data_dir is top-level).
SYSTEM_KEYS = {"gpu": ("mem_bw", "mem_capacity", "bfloat16_tc_flops"),
               "node": ("num_gpus_per_node", "inter_node_bw", "intra_node_bw"),
               "misc": ("nccl_mem", "other_mem")}


@dataclass(frozen=True)
class Shapes:
    """The lookup grid of AIConfigurator's vLLM tables (its H100 collection)."""
    gemm_m: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1024,
                               2048, 4096, 8192)
    gemm_nk: tuple[int, ...] = (32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120,
                                6144, 7168, 8192, 10240, 12288, 16384, 65536)
    heads: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64)
    kv_heads: tuple[int, ...] = (1, 2, 4, 8)        # and, for prefill, kv = heads (multi-head attention)
    prefill_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    prefill_isl: tuple[int, ...] = (1, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
                                    10240, 12288, 16384)
    prefill_max_tokens: int = 131072               # batch_size x isl at most
    decode_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    decode_step: tuple[int, ...] = (1, 3, 7, 15, 31, 63, 127, 255, 511, 1023, 2047, 4095, 8191, 16383, 32767)
    decode_max_tokens: int = 262144                # batch_size x (step + 1) at most
    allreduce_gpus: tuple[int, ...] = (2, 4, 8)
    allreduce_sizes: tuple[int, ...] = tuple(2 ** e for e in range(7, 30))    # elements, 128 to 2^29
    moe_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 768,
                                   1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
    moe_tp: tuple[int, ...] = (1, 2, 4, 8, 16, 32)       # with moe_ep_size 1
    moe_ep: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # with moe_tp_size 1
    mla_heads_x_tp: tuple[int, ...] = (64, 128)     # num_heads on one GPU x tp_size
    mla_prefill_max_tokens: int = 65536
    mla_decode_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    mla_decode_step: tuple[int, ...] = decode_step + (65535, 131071)
    mla_decode_max_tokens: int = 16777216


SHAPES = Shapes()


def table_path(data_dir: str, table: str, backend: str, version: str) -> str:
    """Where AIConfigurator looks for a table, relative to the systems directory."""
    return f"{data_dir}/{TABLES[table].family}/{backend}/{version}/{table}.parquet"


def table_problems(table: str, columns: dict[str, str], keys: list[tuple]) -> list[str]:
    """What in a table AIConfigurator's loader would refuse or misread: missing columns, columns of
    another type, shapes timed twice. `columns`: name -> Parquet type name; `keys`: each row's key."""
    contract = TABLES[table]
    problems = [f"{table}: no column {name!r}" for name in contract.columns if name not in columns]
    problems += [f"{table}: column {name!r} is {columns[name]}, AIConfigurator reads {kind}"
                 for name, kind in contract.columns.items() if name in columns and columns[name] != kind]
    if len(set(keys)) != len(keys):
        problems.append(f"{table}: {len(keys) - len(set(keys))} shapes appear twice")
    return problems


def system_problems(spec: dict) -> list[str]:
    """The system yaml's missing keys, and figures that are not positive numbers."""
    problems = [] if isinstance(spec.get("data_dir"), str) else ["system yaml: no data_dir"]
    for section, keys in SYSTEM_KEYS.items():
        part = spec.get(section)
        if not isinstance(part, dict):
            problems.append(f"system yaml: no {section} section")
            continue
        problems += [f"system yaml: no {section}.{key}" for key in keys if key not in part]
    for key in SYSTEM_KEYS["gpu"]:
        value = (spec.get("gpu") or {}).get(key)
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            problems.append(f"system yaml: gpu.{key} must be a positive number, got {value!r}")
    return problems
