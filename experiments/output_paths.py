"""Output paths checked before any work: a command that cannot write its result refuses at once,
in one line naming the flag, instead of failing with a traceback after minutes of work.

Loads only the standard library (and core.errors), so the check runs before any heavy import.
"""
from __future__ import annotations

import os
from pathlib import Path

from stepcal.core.errors import InputError

# Kernel views, not storage: writes there fail or, worse, poke the kernel. /dev/shm is a real tmpfs.
PSEUDO_FILESYSTEMS = (Path("/proc"), Path("/sys"), Path("/dev"))
REAL_UNDER_PSEUDO = (Path("/dev/shm"),)


def check_output(path: str | Path, *, kind: str = "dir", flag: str = "--out", staged: bool = True,
                 suffixes: tuple[str, ...] = ()) -> Path:
    """`path` as an output the command can write, or an InputError `FLAG PATH: why`. Creates nothing.

    kind "dir": a directory, new or existing (its files are replaced); "file": a file, new or
    existing. `staged`: written through a temporary sibling and renamed into place (core.io),
    so the parent must be writable too; False for directories filled in place (resumable runs).
    `suffixes`: the file name must end in one of them (lower case, e.g. (".csv", ".parquet")).
    """
    path = Path(path)
    where = f"{flag} {path}"
    _check_not_pseudo(path, where)
    if os.path.lexists(path) and not path.exists():
        raise InputError(f"{where}: is a broken symbolic link")
    if kind == "dir" and path.exists() and not path.is_dir():
        raise InputError(f"{where}: is an existing file, not a directory")
    if kind == "file":
        _check_file_name(path, where, suffixes)
    if path.is_dir():
        _check_writable(path, where)
    if staged or not path.is_dir():
        _check_writable(_nearest_existing(path.parent), where)
    return path


def check_store_uri(uri: str | None, *, flag: str, bare_kind: str) -> None:
    """A store named by a URL or a path: sqlite:///PATH is a file to write, a bare path one of
    `bare_kind` ("file" or "dir"); other URLs (postgresql://, http://) name a server, left to it."""
    if not uri:
        return
    if uri.startswith("sqlite:///"):
        check_output(uri.removeprefix("sqlite:///"), kind="file", flag=flag)
    elif "://" not in uri:
        check_output(uri, kind=bare_kind, flag=flag, staged=False)


def _check_file_name(path: Path, where: str, suffixes: tuple[str, ...]) -> None:
    if path.is_dir():
        raise InputError(f"{where}: is a directory; give a file name")
    if suffixes and path.suffix.lower() not in suffixes:
        raise InputError(f"{where}: must end in {' or '.join(suffixes)}")


def _check_not_pseudo(path: Path, where: str) -> None:
    # resolve() so that a symbolic link or `..` cannot lead into /proc unnoticed
    resolved = path.resolve()
    if any(resolved.is_relative_to(real) for real in REAL_UNDER_PSEUDO):
        return
    for root in PSEUDO_FILESYSTEMS:
        if resolved.is_relative_to(root):
            raise InputError(f"{where}: {root} is a system pseudo filesystem, not a place for output")


def _nearest_existing(path: Path) -> Path:
    """`path` or its closest ancestor that exists. Stops at the first existing component, so that
    `somefile/child` yields `somefile` (and is refused as not a directory) rather than its parent."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(path.anchor)


def _check_writable(directory: Path, where: str) -> None:
    if not directory.is_dir():
        raise InputError(f"{where}: {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"{where}: cannot write in {directory} (no write permission, or a read-only filesystem)")
