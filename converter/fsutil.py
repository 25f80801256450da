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


def write_atomic(path: str, data: bytes) -> None:
    """Temporary file, fsync, rename, fsync of the folder."""
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f"{TMP_PREFIX}{os.path.basename(path)}-{os.getpid()}")
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
    fsync_dir(folder)


def remove_files(out_dir: str, names: Iterable[str]) -> None:
    for name in names:
        try:
            os.unlink(os.path.join(out_dir, name))
        except FileNotFoundError:
            pass


__all__ = ["TMP_PREFIX", "fsync_dir", "remove_files", "write_atomic"]
