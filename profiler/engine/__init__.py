"""The real serving engine: the simulator's schedulers driving the torch model on a device."""
from stepcal.profiler.engine.engine import Engine, EngineConfig, EngineResult

__all__ = ["Engine", "EngineConfig", "EngineResult"]
