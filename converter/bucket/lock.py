"""The run lock of a dataset in a bucket: the object ``.imgshard.lock``.

An object store has no flock, and a process killed with SIGKILL cannot delete what it
created, so the lock object carries its holder and an expiry:

* taking it: a conditional create (S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``)
  of ``{"host", "pid", "run_id", "created", "expires", "command"}``; of two runs that
  try at once exactly one succeeds;
* a held lock is renewed by a heartbeat thread every third of its time to live with a
  conditional replace on the version this run wrote (``If-Match``), so it never expires
  under a live run; a refused renewal (someone took it over) or a lock whose expiry
  passed without a renewal is *lost*, and the run stops before publishing (`check`);
* a lock past its expiry (its run was killed) is taken over with a conditional replace
  on the stale version: of two runs taking over at once only one wins;
* released with a conditional delete of this run's own version.

A run that finds a live lock raises `converter.run.lock.LockedError` (exit 75) naming
the holder and when the lock expires.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time

from converter.run.lock import LOCK_NAME, LockedError
from readers.storage import ObjectStore, PreconditionFailed, StorageError

log = logging.getLogger(__name__)

HEARTBEAT_THREAD_NAME = "imgshard-lock-heartbeat"


class LockLostError(LockedError):
    """This run no longer holds the bucket's lock (renewal refused or too late); nothing was published."""


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def describe_holder(info: dict) -> str:
    return (f"run {info.get('run_id')} (pid {info.get('pid')} on {info.get('host')}, started "
            f"{info.get('created')}: {info.get('command')})")


class BucketLock:
    """Context manager: the lock of the dataset in `store`, held and renewed while inside.

    >>> with BucketLock(store, run_id, ttl_seconds=300) as lock:
    ...     lock.check()   # before publishing: raises LockLostError if it was lost
    """

    def __init__(self, store: ObjectStore, run_id: str, ttl_seconds: float = 300.0) -> None:
        self.store = store
        self.run_id = run_id
        self.ttl = float(ttl_seconds)
        self.version: str | None = None
        self.expires = 0.0
        self.lost: str | None = None  # why the lock was lost, once it was
        self.took_over: dict | None = None  # the stale holder this run replaced
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def _body(self) -> tuple[bytes, float]:
        now = time.time()
        info = {"host": socket.gethostname(), "pid": os.getpid(), "run_id": self.run_id, "created": _stamp(now),
                "expires": _stamp(now + self.ttl), "expires_epoch": round(now + self.ttl, 3),
                "command": " ".join(sys.argv)}
        return json.dumps(info).encode("utf-8"), now + self.ttl

    def __enter__(self) -> "BucketLock":
        for _ in range(5):  # the holder may release (or a taker win) between our create and read
            body, expires = self._body()
            try:
                self.version = self.store.create(LOCK_NAME, body)
                self.expires = expires
                break
            except PreconditionFailed:
                pass
            try:
                current = self.store.info(LOCK_NAME)
                holder = json.loads(self.store.read(LOCK_NAME).decode("utf-8"))
            except FileNotFoundError:
                continue  # released meanwhile: try to create it again
            except ValueError:
                holder = {}  # unreadable lock: treat it as expired (it names no expiry we could honour)
            if self._live(holder):
                raise LockedError(
                    f"Another imgshard run holds {self.store.url_of(LOCK_NAME)}: {describe_holder(holder)}; the "
                    f"lock expires at {holder.get('expires')} unless that run renews it. Only one run per dataset "
                    "at a time; this run changed nothing. Try again later.")
            if self._take_over(current.version, holder):
                break
        else:
            raise LockedError(f"{self.store.url_of(LOCK_NAME)}: could not take the lock after 5 tries (other runs "
                              "keep taking and releasing it); this run changed nothing. Try again later.")
        self._thread = threading.Thread(target=self._heartbeat, name=HEARTBEAT_THREAD_NAME, daemon=True)
        self._thread.start()
        return self

    @staticmethod
    def _live(holder: dict) -> bool:
        expires = holder.get("expires_epoch")
        return isinstance(expires, (int, float)) and expires > time.time()

    def _take_over(self, stale_version: str, holder: dict) -> bool:
        """Replace the expired lock at `stale_version`; False when another run changed it first."""
        body, expires = self._body()
        try:
            self.version = self.store.replace(LOCK_NAME, body, if_version=stale_version)
        except PreconditionFailed:
            return False
        self.expires = expires
        self.took_over = holder
        log.warning("took over the expired lock %s of %s (expired at %s)", self.store.url_of(LOCK_NAME),
                    describe_holder(holder), holder.get("expires"))
        return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self.renew()
            if self.lost:
                return

    def renew(self) -> None:
        """Extend the lock (conditional on this run's version); marks it lost when refused or late."""
        with self._mutex:
            if self.lost or self.version is None:
                return
            body, expires = self._body()
            try:
                self.version = self.store.replace(LOCK_NAME, body, if_version=self.version)
                self.expires = expires
            except PreconditionFailed:
                self.lost = "another run replaced or removed the lock object"
            except StorageError as e:  # a network failure: retried at the next beat, lost once expired
                log.warning("could not renew the lock %s (%s); retrying", self.store.url_of(LOCK_NAME), e)
                if time.time() >= self.expires:
                    self.lost = f"it expired while renewals failed ({e})"
            if self.lost:
                log.error("lost the lock %s: %s", self.store.url_of(LOCK_NAME), self.lost)

    def check(self) -> None:
        """Raise `LockLostError` unless this run still holds a live lock (call it right before publishing)."""
        with self._mutex:
            if self.lost is None and time.time() >= self.expires:
                self.lost = f"it expired at {_stamp(self.expires)} without a renewal"
            if self.lost:
                raise LockLostError(
                    f"This run lost the lock {self.store.url_of(LOCK_NAME)} ({self.lost}); nothing was published "
                    "and the shards it uploaded are removed by the next run. Re-run; if it happens again, raise "
                    "--lock-ttl (the lock must be renewed within it).")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._mutex:
            if self.version is None or self.lost:
                return
            try:
                self.store.delete(LOCK_NAME, if_version=self.version)
            except PreconditionFailed:
                log.warning("the lock %s was taken over before this run released it", self.store.url_of(LOCK_NAME))
            except StorageError as e:
                log.warning("could not release the lock %s (%s); it expires at %s", self.store.url_of(LOCK_NAME),
                            e, _stamp(self.expires))
            self.version = None
