"""One run per output folder: a kernel lock (flock) that dies with its process.

A killed run never leaves a stale lock: the kernel drops an flock when the process
that holds it exits, however it exits. The lock file also records who holds it, so a
second run can name the running process in its message.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time

LOCK_NAME = ".imgshard.lock"
EX_TEMPFAIL = 75


class LockedError(RuntimeError):
    """Another run holds the lock of this output folder."""

    exit_code = EX_TEMPFAIL


class OutputLock:
    def __init__(self, out_dir: str) -> None:
        self.path = os.path.join(out_dir, LOCK_NAME)
        self._fd: int | None = None

    def __enter__(self) -> "OutputLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = self._holder(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LockedError(
                    f"Another imgshard run is writing to {os.path.dirname(self.path)} ({holder}). "
                    "Only one run per output folder at a time; this run changed nothing. Try again later."
                ) from None
            raise
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "command": " ".join(sys.argv)}
        os.write(fd, (json.dumps(info) + "\n").encode())
        os.fsync(fd)
        self._fd = fd
        return self

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            info = json.loads(os.read(fd, 4096).decode() or "{}")
            return f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}: {info.get('command')}"
        except (OSError, ValueError):
            return "holder unknown"

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
