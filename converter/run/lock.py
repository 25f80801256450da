"""One run per output folder: a kernel lock (flock) that dies with its process.

A killed run never leaves a stale lock: the kernel drops an flock when the process
that holds it exits, however it exits. The lock file also records who holds it, so a
second run can name the running process in its message.

Worker processes outlive a run killed with SIGKILL (loky workers are not told that
their parent died, and tasks were already queued to them), so a killed run's workers
could still rename shards into the folder while the next run works there. Two more
guards close that gap:

* a worker holds a shared flock on `WORKERS_LOCK_NAME` for each whole task, and checks
  (under that lock, at the start of the task and again just before its shard is
  renamed into place) that the run that started it is still its parent; an orphaned
  worker writes nothing and exits;
* a new run, once it holds the output lock, takes that workers lock exclusively
  (`wait_for_orphans`) before it sweeps leftovers: every task of a dead run has then
  either finished or will see that its parent is gone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time

LOCK_NAME = ".imgshard.lock"
WORKERS_LOCK_NAME = ".imgshard.workers.lock"
EX_TEMPFAIL = 75
#: How long a new run waits for the tasks of a killed run's orphaned workers to end.
ORPHAN_WAIT_SECONDS = 120.0


class LockedError(RuntimeError):
    """Another run holds the lock of this output folder."""

    exit_code = EX_TEMPFAIL


#: Lock fds held by this process; closed in forked children (see `_close_in_child`).
_HELD_FDS: set[int] = set()


def _close_in_child() -> None:
    """After fork, the child closes its copies of our lock fds.

    An flock belongs to the open file description, which a forked child shares: a
    child that outlives a killed run (multiprocessing's Manager process does) would
    otherwise keep the output locked forever. Closing the child's copy leaves the
    parent's lock untouched.
    """
    for fd in list(_HELD_FDS):
        try:
            os.close(fd)
        except OSError:
            pass  # already closed in the child: nothing to release
    _HELD_FDS.clear()


os.register_at_fork(after_in_child=_close_in_child)


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
        info = {"pid": os.getpid(), "host": os.uname().nodename, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "command": " ".join(sys.argv)}
        os.write(fd, (json.dumps(info) + "\n").encode())
        os.fsync(fd)
        self._fd = fd
        _HELD_FDS.add(fd)
        return self

    @staticmethod
    def _holder(fd: int) -> str:
        for _ in range(20):  # the holder may have locked but not yet written who it is
            try:
                os.lseek(fd, 0, os.SEEK_SET)
                text = os.read(fd, 4096).decode()
                info = json.loads(text) if text.strip() else None
            except (OSError, ValueError):
                info = None
            if info:
                return (f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}: "
                        f"{info.get('command')}")
            time.sleep(0.025)
        return "holder unknown"

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            _HELD_FDS.discard(self._fd)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class OrphanedWorker(RuntimeError):
    """The run that started this worker is gone; the worker must not touch the folder."""


def owner_alive(owner_pid: int | None) -> bool:
    """True when the run `owner_pid` is this process or this process's parent.

    A worker whose parent died is re-parented at once (before the parent is even
    reaped), so `os.getppid()` tells exactly whether the run is still alive.
    """
    if owner_pid is None:
        return True
    return owner_pid in (os.getpid(), os.getppid())


class WorkerGuard:
    """Shared lock on the workers lock file for one task, plus the owner checks.

    >>> with WorkerGuard(out_dir, owner_pid) as guard:
    ...     guard.check()   # raises OrphanedWorker when the run is gone
    """

    def __init__(self, out_dir: str, owner_pid: int | None) -> None:
        self.path = os.path.join(out_dir, WORKERS_LOCK_NAME)
        self.owner_pid = owner_pid
        self._fd: int | None = None

    def __enter__(self) -> "WorkerGuard":
        if self.owner_pid is None:  # not a local run (e.g. Dask): nothing to guard
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.check()
        return self

    def check(self) -> None:
        if not owner_alive(self.owner_pid):
            raise OrphanedWorker(
                f"the imgshard run (pid {self.owner_pid}) that started worker pid {os.getpid()} is gone; "
                "this worker writes nothing more"
            )

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def wait_for_orphans(out_dir: str, timeout: float = ORPHAN_WAIT_SECONDS) -> None:
    """Wait until no worker of an earlier (killed) run is inside a task in `out_dir`.

    Call it while holding the output lock, before sweeping leftovers.
    """
    path = os.path.join(out_dir, WORKERS_LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() > deadline:
                raise LockedError(
                    f"Workers of an earlier imgshard run are still writing to {out_dir} after {timeout:.0f} s "
                    f"({WORKERS_LOCK_NAME} is held). Wait for them to end (or kill them) and try again."
                )
            time.sleep(0.05)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
