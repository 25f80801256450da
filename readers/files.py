"""Opening the files of a dataset safely: regular files only, inside the dataset folder.

Standard library only (the converter's `verify` and `inspect` use it too).

* `open_regular` opens with ``O_NONBLOCK`` and checks `os.fstat` before anything is read:
  a FIFO (which would block the reader forever), a character device (``/dev/zero``
  never ends), a socket or a folder is refused with `NotRegularFileError`.
* `check_inside` resolves symlinks (`os.path.realpath`) and refuses a file whose real
  path lies outside the dataset folder's real path with `OutsideDatasetError`: a shard
  that is a symlink to ``/etc/passwd``, or lies under a symlinked sub-folder pointing
  elsewhere, is never read. A dataset folder that is itself a symlink is fine (both
  sides are resolved).
"""

from __future__ import annotations

import fcntl
import os
import stat

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFileError(OSError):
    """A dataset file (shard or manifest) is not a regular file."""


class OutsideDatasetError(OSError):
    """A dataset file resolves (through symlinks) to a path outside the dataset folder."""


def kind_of(mode: int) -> str:
    """'a FIFO (named pipe)', 'a folder', ... for a non-regular `st_mode`; 'a regular file' otherwise."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def open_regular(path: str | os.PathLike) -> int:
    """A read-only descriptor of `path`, which must be a regular file.

    Opened with ``O_NONBLOCK`` (opening a FIFO that has no writer returns at once
    instead of waiting for one), checked with `os.fstat` (the file opened, not whatever
    stood at the path a moment earlier), then set back to blocking. Raises
    `NotRegularFileError` naming the path and what it is, or the `OSError` of the open.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(
                f"{os.fspath(path)} is {kind_of(mode)}, not a regular file; refusing to read it")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular_file(path: str | os.PathLike) -> "os.FileIO":
    """`open_regular` as a binary file object (`open(path, "rb")` for dataset files)."""
    return os.fdopen(open_regular(path), "rb")


def check_inside(root: str | os.PathLike, path: str | os.PathLike) -> str:
    """The real path of `path`; raises `OutsideDatasetError` when it lies outside `root`'s.

    `root` may be given already resolved (callers checking many files resolve it once).
    """
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and os.path.commonpath([real_root, real]) == real_root:
        return real
    raise OutsideDatasetError(
        f"{os.fspath(path)} resolves to {real}, outside the dataset folder {real_root} (a symlink "
        "leads out of it); refusing to read it. Copy the file into the dataset folder, or convert again")


__all__ = ["NotRegularFileError", "OutsideDatasetError", "check_inside", "kind_of", "open_regular",
           "open_regular_file"]
