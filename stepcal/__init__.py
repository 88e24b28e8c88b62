"""stepcal: calibrate LLM-serving performance models on real hardware, and say how right they are.

The one import name the project installs. Its stages are subpackages: `stepcal.profiler` (device
sweeps), `stepcal.costmodel` (T_step tables), `stepcal.simulator` (the discrete-event simulator) and
`stepcal.experiments` (the CLI, campaigns and validation). In the repository they are the top-level
folders of the same names; `setup.py` maps them under this package.
"""
__version__ = "0.1.0"
