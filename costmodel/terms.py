"""A T_step term on its grid: shared by composition (writes) and the tables (reads).

Kept apart so that loading tables never imports scikit-learn."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Term:
    """One additive term: values (and spreads) on a 1-D or 2-D grid, in ms for the whole model."""
    name: str
    axes: tuple[str, ...]
    knots: tuple[np.ndarray, ...]
    time_ms: np.ndarray
    spread_ms: np.ndarray
    description: str
    intercept_ms: float = 0.0     # the whole-step term's constant
