"""File-system helpers shared by the writer, publishing and the runners: the temporary
name prefix, directory fsync, atomic replacement of a small file, quiet removal."""

from __future__ import annotations

import os
from typing import Iterable

#: Prefix of every temporary file imgshard writes in an output folder (swept by the next run).
TMP_PREFIX = ".tmp-"


def fsync_dir(path: str) -> None:
    """Make renames in `path` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, *, sync_dir: bool = True) -> None:
    """Temporary file, fsync, rename, fsync of the folder (`sync_dir=False`: the caller
    fsyncs the folder once for many files, as a run's publish does for its index files).
    The temporary name holds the pid and a random part: two writers never share it."""
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f"{TMP_PREFIX}{os.path.basename(path)}-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if sync_dir:
        fsync_dir(folder)


def remove_files(out_dir: str, names: Iterable[str]) -> None:
    for name in names:
        try:
            os.unlink(os.path.join(out_dir, name))
        except FileNotFoundError:
            pass


__all__ = ["TMP_PREFIX", "fsync_dir", "remove_files", "write_atomic"]
