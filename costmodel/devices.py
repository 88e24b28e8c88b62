"""GPU datasheets shipped with the package (costmodel/data/devices.json): memory bandwidth, memory and
dense BF16 throughput per device, each with the NVIDIA page the figures come from.

What a roofline term needs of a device that its kernel tables do not hold. Loading reads one small
JSON file with the standard library only, so flags may list the known devices without slowing
`stepcal --help`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from stepcal.core.errors import InputError

DATA_FILE = "devices.json"


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One GPU as its datasheet describes it."""
    name: str                               # ours: the key in devices.json (h100_sxm, a100_sxm, ...)
    title: str
    memory_bandwidth_bytes_per_s: float
    memory_gb: float                        # as the datasheet prints it
    bf16_dense_tflops: float
    source_title: str
    source_url: str


def data_document() -> dict:
    """devices.json as loaded (devices and the element-wise roofline constants)."""
    return json.loads(_data_text())


@cache
def _data_text() -> str:
    return resources.files("stepcal.costmodel").joinpath("data", DATA_FILE).read_text(encoding="utf-8")


@cache
def _devices() -> dict[str, DeviceSpec]:
    specs = {}
    for name, entry in data_document()["devices"].items():
        specs[name] = DeviceSpec(name, entry["title"], float(entry["memory_bandwidth_bytes_per_s"]),
                                 float(entry["memory_gb"]), float(entry["bf16_dense_tflops"]),
                                 entry["source"]["title"], entry["source"]["url"])
    return specs


@cache
def _by_key() -> dict[str, str]:
    """Every accepted spelling (normalised) -> our name."""
    keys = {}
    for name, entry in data_document()["devices"].items():
        for alias in (name, *entry["names"]):
            keys[_key(alias)] = name
    return keys


def _key(text: str) -> str:
    """Case and punctuation do not tell devices apart: 'NVIDIA A100-SXM4-80GB' and 'a100 sxm4 80gb'
    are one name; a leading 'NVIDIA' is dropped."""
    words = re.sub(r"[^a-z0-9]+", " ", str(text).lower()).split()
    if words[:1] == ["nvidia"]:
        words = words[1:]
    return "".join(words)


def known_devices() -> tuple[str, ...]:
    """Our names of the devices in the table."""
    return tuple(_devices())


def find_device(name: str | None) -> DeviceSpec | None:
    """The datasheet of a device by any of its names; None for a name the table does not hold
    (a CPU, a GPU not listed)."""
    if name is None:
        return None
    ours = _by_key().get(_key(name))
    return _devices()[ours] if ours else None


def device_spec(name: str) -> DeviceSpec:
    """find_device() that insists: an unknown name is an InputError listing the known ones."""
    spec = find_device(name)
    if spec is None:
        raise InputError(f"unknown device {name!r}; known: {', '.join(known_devices())} "
                         f"(or a short or CUDA name such as H100 or 'NVIDIA H100 80GB HBM3')")
    return spec
