"""Upload a run's shards while it converts the next ones.

The local runner hands each finished shard (its file and its index file, in the
staging folder) to `Uploader.submit`, which returns at once; a small thread pool puts
each file with one request (`ObjectStore.put_file`: multipart above fsspec's block
size, visible whole when complete) and removes the staged copy. `wait` blocks until
every upload is done and raises the first failure: a run publishes nothing unless all
of its files are in the bucket.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from readers.storage import ObjectStore

log = logging.getLogger(__name__)

UPLOAD_THREADS = 4
UPLOAD_THREAD_PREFIX = "imgshard-upload"


class Uploader:
    """A pool of upload threads for one run (see the module docstring)."""

    def __init__(self, store: ObjectStore, staging: str, threads: int = UPLOAD_THREADS) -> None:
        self.store = store
        self.staging = staging
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=UPLOAD_THREAD_PREFIX)
        self._futures: list[Future] = []
        self._lock = threading.Lock()
        self.uploaded: list[str] = []  # names put so far (for the report, and to remove them on failure)
        self.bytes = 0
        self.busy_seconds = 0.0

    def submit(self, names: list[str], keep: tuple[str, ...] = ()) -> None:
        """Upload these staged files (in this order, in one thread) and remove them once uploaded,
        except those in `keep` (index files: small, and read again by a --rebuild's counts)."""
        self._futures.append(self._pool.submit(self._upload, list(names), frozenset(keep)))

    def _upload(self, names: list[str], keep: frozenset[str]) -> None:
        t0 = time.perf_counter()
        for name in names:
            path = os.path.join(self.staging, name)
            size = os.path.getsize(path)
            self.store.put_file(name, path)
            with self._lock:  # recorded first: a failed run removes what it uploaded
                self.uploaded.append(name)
                self.bytes += size
            if name not in keep:
                try:
                    os.unlink(path)
                except FileNotFoundError:  # a failed run's cleanup got there first
                    pass
        with self._lock:
            self.busy_seconds += time.perf_counter() - t0

    def raise_failed(self) -> None:
        """Raise the first failure of an upload that already ended (the run stops early)."""
        for future in self._futures:
            if future.done() and future.exception() is not None:
                future.result()

    def wait(self) -> None:
        """Block until every submitted upload finished; raise the first failure."""
        for future in self._futures:
            future.result()

    def close(self, *, cancel: bool = False) -> None:
        """Stop the pool (waiting for running uploads; `cancel`: drop the queued ones)."""
        self._pool.shutdown(wait=True, cancel_futures=cancel)
