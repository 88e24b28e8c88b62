"""The system yaml of an AIConfigurator export: the device's datasheet figures (costmodel.devices),
its GPU-to-GPU links, and AIConfigurator's own corrections where stepcal has no figure of its own.

The memory roofline corrections (mem_bw_empirical_scaling_factor, mem_empirical_constant_latency)
and the memory set aside for NCCL and the runtime (misc) are the values AIConfigurator ships for
its own systems: its element-wise operators and memory plan use them, and stepcal's tables hold
nothing that replaces them.
"""
from __future__ import annotations

import yaml

from stepcal.costmodel.devices import DeviceSpec

GIB = 2 ** 30
GPUS_PER_NODE = 8
# One GPU's bandwidth to the other GPUs of its node, one direction, bytes/s: NVLink where the part
# has it (4th generation 450 GB/s, 3rd 300 GB/s, 5th 900 GB/s), else its PCIe slot (5.0 x16: 64 GB/s,
# 4.0 x16: 32 GB/s).
INTRA_NODE_BYTES_PER_S = {"h100_sxm": 450e9, "h200_sxm": 450e9, "b200": 900e9, "a100_sxm": 300e9,
                          "a100_sxm_40gb": 300e9, "h100_pcie": 64e9, "l40s": 32e9}
PCIE_BYTES_PER_S = {"a100_sxm": 32e9, "a100_sxm_40gb": 32e9, "l40s": 32e9}
DEFAULT_PCIE_BYTES_PER_S = 64e9
# GPUs whose Tensor Cores run FP8 (Ada, Hopper, Blackwell), at twice their dense BF16 rate; an
# export with fp8 tables needs the figure (AIConfigurator refuses an fp8 quant mode without it).
FP8_DEVICES = ("h100_sxm", "h100_pcie", "h200_sxm", "l40s", "b200", "rtx_pro_6000_server")
# Between nodes: one 400 Gb/s network port per GPU.
INTER_NODE_BYTES_PER_S = 50e9
# AIConfigurator's corrections of its own systems (see the module's notes).
MEM_BW_SCALING = 0.8
MEM_CONSTANT_LATENCY_S = 3e-6
NCCL_MEM_BYTES = {1: 0, 2: 358612992, 4: 411041792, 8: 411041792}
OTHER_MEM_BYTES = 3758096384


def system_spec(device: DeviceSpec, data_dir: str) -> dict:
    """The yaml's content for `device`, its tables under `data_dir` (relative to the yaml)."""
    pcie = PCIE_BYTES_PER_S.get(device.name, DEFAULT_PCIE_BYTES_PER_S)
    gpu = {"mem_bw": int(device.memory_bandwidth_bytes_per_s),
           "mem_bw_empirical_scaling_factor": MEM_BW_SCALING,
           "mem_empirical_constant_latency": MEM_CONSTANT_LATENCY_S,
           "mem_capacity": int(device.memory_gb * GIB),
           "bfloat16_tc_flops": int(device.bf16_dense_tflops * 1e12)}
    if device.name in FP8_DEVICES:
        gpu["fp8_tc_flops"] = 2 * gpu["bfloat16_tc_flops"]
    return {
        "data_dir": data_dir,
        "gpu": gpu,
        "node": {"num_gpus_per_node": GPUS_PER_NODE, "inter_node_bw": int(INTER_NODE_BYTES_PER_S),
                 "intra_node_bw": int(INTRA_NODE_BYTES_PER_S.get(device.name, pcie)), "pcie_bw": int(pcie)},
        "misc": {"nccl_mem": dict(NCCL_MEM_BYTES), "other_mem": OTHER_MEM_BYTES},
    }


def system_yaml(device: DeviceSpec, data_dir: str) -> str:
    header = (f"# {device.title}, written by `stepcal tables export --format aiconfigurator`.\n"
              f"# gpu figures: {device.source_title}; memory corrections and misc: AIConfigurator's own.\n")
    return header + yaml.safe_dump(system_spec(device, data_dir), sort_keys=False)
