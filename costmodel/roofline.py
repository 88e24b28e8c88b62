"""A memory roofline for the element-wise kernels of a layer (norms, RoPE, activation, residual adds,
embedding lookup) and for greedy sampling: what a step costs beyond its GEMMs and attention when the
kernel tables (AIConfigurator's) hold no element-wise rows.

One kernel takes  launch_us + bytes_moved / (bandwidth x efficiency):  a floor a tiny kernel never
goes under (launch and one wave of blocks) plus the bytes it reads and writes at a share of the
datasheet bandwidth. The constants are per class of kernel, fitted to Vidur's measured operators
(studies/elementwise_roofline.py prints the fit and its held-out errors across devices; the shipped
values are in costmodel/data/devices.json). One pair for all kernels misses by ~40% (MAPE): Vidur's
RMSNorm runs at ~40% of the bandwidth where its residual add streams at ~100%, and its embedding
gather at under 20%.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import pandas as pd

from stepcal.costmodel.devices import DeviceSpec, data_document

# The class of kernel each operator is timed as: its constants are shared within a class. The final
# norm (and MLA's latent norms) are RMSNorms like the layers' own; greedy sampling reads each sequence's logits once and
# reduces them to one index, the access pattern of a norm's reduction over a row.
OP_CLASSES = {"emb": "emb", "input_layernorm": "norm", "post_attention_layernorm": "norm",
              "final_norm": "norm", "latent_norm": "norm", "q_norm": "norm", "k_norm": "norm",
              "attn_rope": "rope", "mlp_act": "act",
              "add": "add", "sampling": "norm"}
CLASSES = ("emb", "norm", "rope", "act", "add")

# Bytes an operator reads and writes per element core.model_spec.elementwise_widths_of() counts,
# in units of the element's size, as Vidur's profiler runs the operator (vidur/profiling/mlp/mlp_impl.py):
PASSES_PER_WIDTH_ELEMENT = {
    "emb": 2.0,                       # width = hidden: gathers one table row per token, writes it
    "input_layernorm": 2.0,           # width = hidden: reads x, writes norm(x) (the weight: one row)
    "post_attention_layernorm": 2.0,
    "final_norm": 2.0,
    "latent_norm": 2.0,               # MLA: width = the query and KV latents, normed like hidden states
    "q_norm": 2.0,                    # width = heads x head_dim: each query head normed in place
    "k_norm": 2.0,                    # width = kv_heads x head_dim
    "attn_rope": 2.0,                 # width = (heads + kv_heads) x head_dim: q and k rotated in place
    "mlp_act": 1.0,                   # width = 3 x ffn already counts reading gate and up, writing the product
    "add": 1.5,                       # width = 2 x hidden counts the two operands; the sum is written too
    "sampling": 1.0,                  # width = vocabulary: the logits are read once (greedy argmax)
}


@dataclass(frozen=True, slots=True)
class KernelConstants:
    """One class of kernel on any device: the share of the datasheet bandwidth it streams at, the
    floor of its time, and the relative spread of the roofline's error (one standard deviation,
    from predicting one device with constants fitted on another)."""
    efficiency: float
    launch_us: float
    relative_sd: float = 0.0

    def kernel_ms(self, bytes_moved, bandwidth_bytes_per_s: float):
        """The roofline time of one kernel moving `bytes_moved` bytes, in ms."""
        seconds = np.asarray(bytes_moved, dtype=np.float64) / (bandwidth_bytes_per_s * self.efficiency)
        return self.launch_us * 1e-3 + seconds * 1e3


def bytes_moved(op: str, width, num_tokens, dtype_bytes: float):
    """Bytes one call of `op` reads and writes at `num_tokens` tokens (rows), `width` elements per
    row as elementwise_widths_of() counts them."""
    return PASSES_PER_WIDTH_ELEMENT[op] * np.asarray(width, dtype=np.float64) * num_tokens * dtype_bytes


@cache
def shipped_constants() -> dict[str, KernelConstants]:
    """The constants composition uses, by class (devices.json's elementwise_roofline)."""
    table = data_document()["elementwise_roofline"]["constants"]
    return {name: KernelConstants(float(c["efficiency"]), float(c["launch_us"]), float(c["relative_sd"]))
            for name, c in table.items()}


def op_constants(op: str) -> KernelConstants:
    return shipped_constants()[OP_CLASSES[op]]


# ---------------------------------------------------------------------------- fitting

def measured_rows(records: pd.DataFrame, device: DeviceSpec) -> pd.DataFrame:
    """The element-wise records of one device (Vidur's importer's) as fitting rows: class, op,
    num_tokens, bytes moved, the datasheet bandwidth and the measured time in us."""
    rows = records[records["op"] == "elementwise"]
    names = rows["name"].astype(str)
    width = rows["width"].to_numpy(dtype=np.float64)
    passes = names.map(PASSES_PER_WIDTH_ELEMENT).to_numpy(dtype=np.float64)
    # Vidur times fp16/bf16 activations: two bytes an element (its importer records bfloat16).
    moved = passes * width * rows["num_tokens"].to_numpy(dtype=np.float64) * 2.0
    return pd.DataFrame({"device": device.name, "op": names.to_numpy(), "cls": names.map(OP_CLASSES).to_numpy(),
                         "num_tokens": rows["num_tokens"].to_numpy(dtype=np.float64), "bytes": moved,
                         "bandwidth": device.memory_bandwidth_bytes_per_s,
                         "time_us": rows["time_ms"].to_numpy(dtype=np.float64) * 1e3})


def fit_class(rows: pd.DataFrame) -> KernelConstants:
    """launch_us and efficiency minimising the squared relative error over `rows` (one class):
    time = a + b x (bytes / bandwidth) is linear in (a, b = 1 / efficiency), so weighted least
    squares solves it exactly. Relative, not absolute: a 2 us kernel counts as much as a 300 us one,
    since a decode step runs hundreds of the small ones. Each device's octave of num_tokens (1, 2-3,
    4-7, ...) weighs the same in all: Vidur sweeps every 8 tokens, so without this the launch-bound
    calls of decode steps (a few rows below 64 tokens) would count for ~2% of the fit."""
    ideal_us = rows["bytes"].to_numpy() / rows["bandwidth"].to_numpy() * 1e6
    time_us = rows["time_us"].to_numpy()
    octave = np.floor(np.log2(rows["num_tokens"].to_numpy()))
    bins = pd.Series(list(zip(rows["device"], octave)))
    weight = np.sqrt(1.0 / bins.map(bins.value_counts()).to_numpy(dtype=np.float64))
    design = np.column_stack([np.ones(len(rows)), ideal_us]) / time_us[:, None] * weight[:, None]
    (launch_us, slope), *_ = np.linalg.lstsq(design, weight, rcond=None)
    return KernelConstants(efficiency=float(1.0 / slope), launch_us=float(launch_us))


def fit_constants(rows: pd.DataFrame) -> dict[str, KernelConstants]:
    """One KernelConstants per class present in `rows`."""
    return {cls: fit_class(part) for cls, part in rows.groupby("cls", sort=True)}


def predict_us(rows: pd.DataFrame, constants: dict[str, KernelConstants]) -> np.ndarray:
    """The roofline's time of each row in us, by the row's class and the row's device bandwidth."""
    out = np.empty(len(rows))
    for cls, index in rows.groupby("cls").indices.items():
        part = rows.iloc[index]
        out[index] = constants[cls].kernel_ms(part["bytes"].to_numpy(), part["bandwidth"].to_numpy()) * 1e3
    return out


def cross_device_predictions(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with `predicted_us`: each device's rows predicted with constants fitted on the other
    devices' rows only (held out by device)."""
    parts = []
    for device, held_out in rows.groupby("device", sort=True):
        constants = fit_constants(rows[rows["device"] != device])
        parts.append(held_out.assign(predicted_us=predict_us(held_out, constants)))
    return pd.concat(parts)


def fit_shipped_constants(rows: pd.DataFrame) -> dict[str, KernelConstants]:
    """The constants devices.json ships: each class fitted on every row, with relative_sd the root
    mean square of the relative error of the cross-device predictions (how far off the roofline is
    on a device none of its constants were fitted on)."""
    fitted = fit_constants(rows)
    held = cross_device_predictions(rows)
    relative = held["predicted_us"] / held["time_us"] - 1.0
    sd = np.sqrt((relative ** 2).groupby(held["cls"]).mean())
    return {cls: KernelConstants(c.efficiency, c.launch_us, float(sd[cls])) for cls, c in fitted.items()}
