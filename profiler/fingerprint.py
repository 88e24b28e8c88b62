"""Hardware fingerprint: what a profile was measured on, for provenance columns and meta.json."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

# The fields that make two profiles comparable; clocks and hostnames may differ between runs.
IDENTITY_FIELDS = ("cpu_model", "num_cpus", "gpu_name", "gpu_driver", "cuda_version",
                   "torch_version", "num_threads")
NVIDIA_SMI_FIELDS = ("driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem",
                     "clocks.max.mem", "power.limit", "temperature.gpu", "persistence_mode")


def hardware_fingerprint(device: str, num_threads: int) -> dict:
    import torch  # lazy: loads torch
    info = {
        "device": device,
        "cpu_model": cpu_model(),
        "num_cpus": os.cpu_count(),
        "num_cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": _meminfo_bytes("MemTotal"),
        "cpu_l2_bytes": cpu_l2_bytes(),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "num_threads": num_threads,
        "gpu_name": None, "gpu_driver": None, "cuda_version": None,
    }
    if device.startswith("cuda"):
        info.update(gpu_fingerprint(device))
    return info


def gpu_fingerprint(device: str) -> dict:
    import torch  # lazy: loads torch
    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    info = {
        "gpu_name": props.name,
        "gpu_count": torch.cuda.device_count(),
        "gpu_memory_bytes": props.total_memory,
        "gpu_sm_count": props.multi_processor_count,
        "gpu_compute_capability": f"{props.major}.{props.minor}",
        "gpu_l2_bytes": getattr(props, "L2_cache_size", None),
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version(),
    }
    smi = nvidia_smi(index)
    info["gpu_driver"] = smi.pop("driver_version", None)
    info.update({f"gpu_{k.replace('.', '_')}": v for k, v in smi.items()})
    return info


def nvidia_smi(index: int) -> dict:
    """Driver, clocks and power from nvidia-smi; empty when it is not there or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run([exe, f"--id={index}", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.strip().splitlines()[0].split(",")] if out.strip() else []
    return dict(zip(NVIDIA_SMI_FIELDS, values)) if len(values) == len(NVIDIA_SMI_FIELDS) else {}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_l2_bytes(cache_dir: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """One core's L2 cache (Linux sysfs: cpu0's level-2 data or unified cache); None where unknown."""
    for index in sorted(Path(cache_dir).glob("index*")):
        try:
            if (index / "level").read_text().strip() != "2" or (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20}.get(size[-1:], 1)
        digits = size[:-1] if size[-1:] in ("K", "M") else size
        return int(digits) * scale if digits.isdigit() else None
    return None


def device_name(info: dict) -> str:
    return info["gpu_name"] if info.get("gpu_name") else info["cpu_model"]


def fingerprint_id(info: dict) -> str:
    """Short hash of the identity fields: equal ids mean comparable hardware and software."""
    text = json.dumps({k: info.get(k) for k in IDENTITY_FIELDS}, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def available_bytes(device: str) -> int | None:
    """Memory a new point can still take: free device memory plus what torch caches, or MemAvailable."""
    if device.startswith("cuda"):
        import torch  # lazy: loads torch
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return _meminfo_bytes("MemAvailable")


def _meminfo_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
