"""Stable reads of local source files: the bytes of one version of the file, never two.

A source rewritten in place while `convert` reads it (``rsync --inplace``, sync clients,
an editor saving over the file) can give half the old picture and half the new. Such a
read must never be published, and its fingerprint must never pair the stamp of one
version with the digest of another (the next run would then keep the torn record for
good). So each read is bracketed by two ``fstat`` calls on the open file: size, mtime,
ctime, inode and device must not move, and the bytes read must be the size the file
has. A file modified less than `RACY_NS` before the read may be in the middle of being
rewritten by a writer that pauses between its writes: it is read again once it has been
quiet that long (waiting at most `READ_WAIT_S`). The fingerprint's stamp is the mtime of
the bracketing ``fstat``, so it always belongs to the version whose bytes were hashed.

A file that is still moving after `READ_WAIT_S` raises `SourceChangedError`; the sample is
a bad input of kind ``changed_during_read``: nothing of it is published or recorded, so the
next run finds it new and converts it (a torn read never becomes a record).

Limit: a writer that rewrites part of a file, pauses longer than `RACY_NS`, then writes the
rest, leaves a read that looks stable; its later write moves the mtime, so the next run
sees the source as changed (kept with a warning under the default ``--on-change keep``,
re-converted with ``--on-change replace``).
"""

from __future__ import annotations

import errno
import os
import time

from readers.files import open_regular_file

#: A file modified less than this long before its read ends is read again once it is that old.
RACY_NS = 100_000_000
#: How long a file may keep changing before it is a bad input, seconds.
READ_WAIT_S = 1.0
#: The shortest pause before a re-read, seconds.
REREAD_PAUSE_S = 0.005


class SourceChangedError(OSError):
    """The file kept changing while it was read."""


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


def _read_once(path: str) -> tuple[bytes, os.stat_result | None]:
    """(bytes, their fstat) or (bytes, None) when the file moved during the read."""
    f = open_regular_file(path)
    with f:
        before = os.fstat(f.fileno())
        data = f.read()
        after = os.fstat(f.fileno())
    stable = _identity(before) == _identity(after) and len(data) == after.st_size
    return data, after if stable else None


def read_stable(path: str) -> tuple[bytes, int]:
    """(the bytes of one version of the local file `path`, its mtime_ns under the same fstat).
    `SourceChangedError` when it kept changing; `readers.files.NotRegularFileError`,
    `FileNotFoundError` or `OSError` as opening it does."""
    deadline = time.monotonic() + READ_WAIT_S
    previous = None
    while True:
        data, st = _read_once(path)
        age_ns = time.time_ns() - st.st_mtime_ns if st is not None else 0
        if st is not None and age_ns >= RACY_NS:
            return data, st.st_mtime_ns
        if st is not None and age_ns < 0 and previous == (_identity(st), data):
            return data, st.st_mtime_ns  # an mtime in the future (clock skew): two equal reads a pause apart
        previous = None if st is None else (_identity(st), data)
        if time.monotonic() >= deadline:
            raise SourceChangedError(errno.EAGAIN, f"kept changing while it was read (for {READ_WAIT_S:g} s)", path)
        wait_s = REREAD_PAUSE_S if age_ns < 0 else (RACY_NS - age_ns) / 1e9
        time.sleep(max(REREAD_PAUSE_S, min(wait_s, deadline - time.monotonic(), RACY_NS / 1e9)))
