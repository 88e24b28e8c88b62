"""Packaging: the repository's top-level stage folders install under the one import name `stepcal`.

`profiler/` installs as `stepcal.profiler`, `core/` (the ground floor) as `stepcal.core`, and so on;
`stepcal/` itself holds the package root. The rest of the metadata is in pyproject.toml; only the
package list and its folders are computed here, so a new subpackage is installed without being
listed by hand.
"""
from setuptools import find_packages, setup

# core is the ground floor every stage imports; it imports none of them
STAGES = ("core", "simulator", "costmodel", "profiler", "experiments")


def stage_packages(stage: str) -> list[str]:
    """`stepcal.<stage>` and every subpackage below it (folders with an __init__.py)."""
    return [f"stepcal.{stage}", *(f"stepcal.{stage}.{sub}" for sub in find_packages(stage))]


setup(
    packages=["stepcal", *(name for stage in STAGES for name in stage_packages(stage))],
    package_dir={"stepcal": "stepcal", **{f"stepcal.{stage}": stage for stage in STAGES}},
)
