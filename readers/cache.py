"""The local cache of a bucket dataset's shards and index files (`readers.open(url, cache_dir=...)`).

Repeated epochs over a dataset in a bucket read each shard from local disk after the
first: `ShardCache.fetch` returns the path of a verified local copy of an object.

* **Content-addressed**: a copy is named after the manifest's digest of the object
  (``xxh3_128-<32 hex>-train-00003-r1a2b3c4d.tfrecord``), so a republished dataset (new
  bytes, new digest) never gets stale bytes, and two datasets sharing a shard share
  the copy.
* **Verified before use**: a copy is used only when its size and digest equal the
  manifest's; checked once per process and again whenever the file changes (size,
  mtime or inode). A truncated or corrupt copy is deleted and downloaded again, never
  read; a download whose bytes do not match the manifest is an error naming the URL.
* **Safe to share** between processes: a download goes to a temporary name in the cache
  folder and is renamed into place (atomic on POSIX), so a reader sees a whole copy or
  none; two processes downloading the same object both rename a whole file.
* **Bounded**: after each download the least recently used copies (by access time, set on
  every use) are deleted until the folder holds at most `max_bytes`. An object larger
  than the bound is not cached (it is read into memory as without a cache). Deleting a
  copy another process has open or mapped is safe: it keeps reading it.
* **Never fatal**: a full or failing cache disk (no space, quota, read-only, I/O error,
  permissions on the folder) raises `CacheFault`; the reader then reads that object
  into memory as without a cache, with one warning per cache folder
  (`readers.remote.RemoteFile.open`), and tries the cache again for the next object.

Standard library only (xxhash when a digest is checked).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from readers.errors import CacheFault

logger = logging.getLogger(__name__)

#: Default bound of a cache folder.
CACHE_MAX_BYTES = 10 << 30
#: Prefix of downloads in progress; older than `STALE_TMP_SECONDS` they are removed.
TMP_PREFIX = ".download-"
STALE_TMP_SECONDS = 3600
_CHUNK_BYTES = 8 << 20

_verified: set[tuple[str, int, int, int]] = set()
_verified_lock = threading.Lock()
_evict_lock = threading.Lock()


#: errno values that can only come from the local disk: a download failing with one of
#: them is a cache fault, not a network one.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})


def _disk_errno(e: BaseException, directory: str) -> int | None:
    """The errno of a local disk fault in `e`'s chain (a store wraps the write error it
    met), or None when nothing in it comes from the disk."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        code = getattr(e, "errno", None)
        if code in _DISK_ERRNOS:
            return code
        if code in (errno.EACCES, errno.EPERM) and not os.access(directory, os.W_OK):
            return code
        e = e.__cause__ or e.__context__
    return None


def _new_locks() -> None:  # a forked child must not inherit a lock a loader thread held
    global _verified_lock, _evict_lock
    _verified_lock, _evict_lock = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_new_locks)


def _file_key(path: str, st: os.stat_result) -> tuple[str, int, int, int]:
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


def file_digest(path: str, digest: str) -> str:
    """The digest of the file at `path` with the algorithm `digest` names (read in chunks)."""
    from readers.digest import algorithm_of, digest_stream

    with open(path, "rb") as f:
        return digest_stream(f, algorithm_of(digest), _CHUNK_BYTES)


@dataclass(frozen=True)
class ShardCache:
    """A cache folder and its bound (picklable: worker processes share the folder)."""

    directory: str
    max_bytes: int = CACHE_MAX_BYTES

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)) or not os.fspath(self.directory):
            raise TypeError(f"cache_dir must be a folder path (str or os.PathLike). Received: {self.directory!r}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise ValueError(f"cache_max_bytes must be an integer >= 1. Received: {self.max_bytes!r}")
        object.__setattr__(self, "directory", os.path.abspath(os.fspath(self.directory)))
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise OSError(f"cache_dir {self.directory}: cannot create the folder ({e}); pass a writable "
                          "cache_dir") from e

    def fits(self, size: int) -> bool:
        return size <= self.max_bytes

    def path_of(self, remote: Any) -> str:
        from readers.remote import local_copy_name

        return os.path.join(self.directory, local_copy_name(remote))

    def fetch(self, remote: Any) -> str:
        """The path of a verified local copy of `remote` (a `readers.remote.RemoteFile`),
        downloaded when there is none or the one there is damaged. Raises `CacheFault` when
        the disk cannot take it (the caller reads the object into memory instead)."""
        path = self.path_of(remote)
        try:
            if self._usable(path, remote):
                return path
            self._download(remote, path)
            self.evict(keep=path)
        except CacheFault:
            raise
        except OSError as e:
            code = _disk_errno(e, self.directory)
            if code is None or isinstance(e, FileNotFoundError):
                raise
            raise CacheFault(code, f"cache folder {self.directory}: {os.strerror(code)} (while caching "
                                   f"{remote.url})") from e
        return path

    def _usable(self, path: str, remote: Any) -> bool:
        """Whether the copy at `path` exists and holds `remote`'s bytes (a damaged one is deleted)."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        key = _file_key(path, st)
        with _verified_lock:
            known = key in _verified
        if not known:
            good = st.st_size == remote.size and file_digest(path, remote.digest) == remote.digest
            if not good:
                logger.warning("cache copy %s of %s is damaged (size or digest differs from the manifest); "
                               "downloading it again", path, remote.url)
                _remove(path)
                return False
            with _verified_lock:
                _verified.add(key)
        _touch(path, st)
        return True

    def _download(self, remote: Any, path: str) -> None:
        tmp = os.path.join(self.directory, f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
        try:
            try:
                remote.store.download(remote.name, tmp)
            except FileNotFoundError:
                raise remote.error("the object has disappeared since the dataset was opened; a newer convert "
                                   "may have replaced the dataset: open it again") from None
            except OSError as e:
                if _disk_errno(e, self.directory) is not None:
                    raise  # the disk, not the network: `fetch` makes it a CacheFault
                raise remote.error(f"cannot download it into the cache ({e})") from e
            st = os.stat(tmp)
            if st.st_size != remote.size:
                raise remote.error(f"downloaded {st.st_size} bytes, the manifest says {remote.size} (the object "
                                   "is truncated or was rewritten)")
            got = file_digest(tmp, remote.digest)
            if got != remote.digest:
                raise remote.error(f"its digest is {got}, the manifest says {remote.digest} (the object is "
                                   "damaged or was rewritten)")
            os.replace(tmp, path)
            st = os.stat(path)
            with _verified_lock:
                _verified.add(_file_key(path, st))
        finally:
            _remove(tmp)

    def entries(self) -> list[tuple[str, os.stat_result]]:
        """(path, stat) of every cached copy (downloads in progress excluded)."""
        out = []
        for entry in os.scandir(self.directory):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if entry.name.startswith(TMP_PREFIX):
                if time.time() - st.st_mtime > STALE_TMP_SECONDS:
                    _remove(entry.path)  # left by a killed process
                continue
            if entry.is_file(follow_symlinks=False):
                out.append((entry.path, st))
        return out

    def evict(self, keep: str | None = None) -> int:
        """Delete least recently used copies until at most `max_bytes` remain; returns bytes freed."""
        with _evict_lock:
            entries = sorted(self.entries(), key=lambda e: e[1].st_atime_ns)
            total = sum(st.st_size for _, st in entries)
            freed = 0
            for path, st in entries:
                if total <= self.max_bytes:
                    break
                if path == keep:
                    continue
                _remove(path)
                total -= st.st_size
                freed += st.st_size
            return freed


def _touch(path: str, st: os.stat_result) -> None:
    """Mark `path` used now (its access time; the mtime, part of the verified key, is kept)."""
    try:
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
    except OSError as e:  # evicted by another process meanwhile: the open that follows says so
        logger.debug("cannot touch %s: %s", path, e)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["CACHE_MAX_BYTES", "CacheFault", "ShardCache", "file_digest"]
