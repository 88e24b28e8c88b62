"""Atomic file output: write to a temporary name, then rename into place."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic_write(path: str | Path, write) -> None:
    """Call write(tmp_path) on a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _umask_mode())   # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    _atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n").encode())


def atomic_write_parquet(frame, path: str | Path) -> None:
    _atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def atomic_write_table(table, path: str | Path) -> None:
    """Write a pyarrow Table to Parquet as it is (no pandas conversion)."""
    import pyarrow.parquet as pq  # lazy: loads pyarrow
    _atomic_write(path, lambda tmp: pq.write_table(table, tmp))


@contextmanager
def atomic_output_dir(out: str | Path):
    """Yield a fresh staging directory; on success its files move into `out`.

    An interrupted or failed run leaves `out` as it was (no partial output directory).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.staging."))
    try:
        yield staging
        out.mkdir(exist_ok=True)
        for item in staging.iterdir():
            target = out / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(item, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _json_default(obj):
    import numpy as np  # lazy: loads numpy
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return None if not np.isfinite(obj) else float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")
