"""What every kernel of a sweep shares (OpContext): the model shape, the device, the dtype, and the
model itself, built on first use."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from stepcal.core.model_spec import ModelSpec
from stepcal.profiler.model import LlamaModel, torch_dtype
from stepcal.profiler.point import Point


@dataclass
class OpContext:
    """What every kernel of a sweep shares: the model shape, device, dtype, and the lazily built model."""
    spec: ModelSpec
    device: str
    dtype: str
    seed: int = 0
    rotate_bytes: int = 0
    _model: LlamaModel | None = field(default=None, repr=False)

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    @property
    def dtype_bytes(self) -> int:
        return torch.empty(0, dtype=self.torch_dtype).element_size()

    @property
    def model_built(self) -> bool:
        return self._model is not None

    def model(self) -> LlamaModel:
        if self._model is None:
            self._model = LlamaModel(self.spec, dtype=self.torch_dtype, device=self.device, seed=self.seed)
        return self._model

    def generator(self, point: Point) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1_000_003 + hash_point(point))


def hash_point(point: Point) -> int:
    return int(point.key.rsplit("/", 1)[-1], 16) % (2**31)
