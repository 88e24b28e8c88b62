"""The built wheel installs one import name, `stepcal`, and runs from a fresh environment.

The wheel is built from the checkout and installed without -e into a new venv, run from a folder
outside the repository, so that nothing of the checkout can be imported by accident. The new venv
borrows the test environment's third-party packages through a .pth file (installing numpy, pandas
and pyarrow again would take a minute), but never its `stepcal`: the wheel's copy comes first.
"""
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(ROOT)],
                   check=True, capture_output=True, text=True)
    (built,) = dist.glob("stepcal-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its bin folder."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # after the venv's own site-packages, so the wheel's stepcal wins over the test environment's
    Path(site, "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--quiet", str(wheel)], check=True, capture_output=True, text=True)
    return env_dir / "bin"


def test_the_wheel_holds_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"stepcal"}
    for stage in ("simulator", "costmodel", "profiler", "experiments"):
        assert f"stepcal/{stage}/__init__.py" in names
    # the package data that the cost model and --host-defaults read at run time
    assert "stepcal/costmodel/data/devices.json" in names
    assert "stepcal/experiments/data/serving_defaults.json" in names


def test_the_installed_wheel_runs_help_and_a_simulation(installed, tmp_path):
    where = subprocess.run([str(installed / "python"), "-c", "import stepcal.simulator as s; print(s.__file__)"],
                           cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    assert str(installed.parent) in where            # the wheel's copy, not the checkout's
    help_text = subprocess.run([str(installed / "stepcal"), "--help"], cwd=tmp_path, check=True,
                               capture_output=True, text=True).stdout
    assert "simulate" in help_text and "calibrate" in help_text
    out = tmp_path / "sim"
    subprocess.run([str(installed / "stepcal"), "simulate", "--quiet",
                    "--trace", "poisson:rate=5,n=40,prompt=uniform:16:64,output=uniform:4:16",
                    "--scheduler", "vllm", "--step-model", "linear:8,0.03,0.0002", "--kv-blocks", "400",
                    "--out", str(out)], cwd=tmp_path, check=True, capture_output=True, text=True)
    assert (out / "summary.json").exists() and (out / "requests.parquet").exists()
