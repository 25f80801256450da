"""The source files as discovery, the planner and the workers see them: one small interface,
two implementations, chosen by the path.

Every question discovery asks about the sources goes through `files_for(path)`: is this a
folder, which sub-folders and files does it hold, which image files lie below it, what are
a file's size and stamp (the fingerprint's second half), and its bytes. A local path (or
``file://``) gets `LocalFiles` (``os.scandir``/``os.walk``/``os.stat``, as before); an
``s3://`` or ``gs://`` URL gets `BucketFiles`, which answers every folder question from
**one listing** of the source prefix (``ObjectStore.list``: no request per object) and reads
a file with one GET (``ObjectStore.read``). The layouts never branch on the kind of location.

On an object store a file's stamp is a 63-bit hash of its version (the S3 ETag, the GCS
generation), so (size, stamp) stands where a local file has (size, mtime_ns): an object
that is not rewritten keeps both and is never downloaded again on incremental runs; a
rewritten one gets a new version (S3 keeps the ETag of identical bytes in one part).

Listings are kept while a `source_scope()` is open (a command's discovery, planning and
reporting share one listing) and dropped when the outermost scope ends, so the next run
lists again. Storage options (``--storage-option``) are registered per bucket
(`use_storage_options`), also in worker processes, which only read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat as stat_module
import threading
from typing import Any, Iterator, Protocol

import xxhash

from converter.discover.stable import read_stable
from readers.files import NotRegularFileError, open_regular_file
from readers.storage.url import freeze_storage_options, is_remote, split_url, thaw_storage_options

log = logging.getLogger(__name__)

_STAMP_MASK = (1 << 63) - 1


def version_stamp(version: str) -> int:
    """The int64 stamp of an object version (ETag / generation): what stands in the mtime_ns slot."""
    return xxhash.xxh3_64_intdigest(version.encode("utf-8")) & _STAMP_MASK


class SourceFiles(Protocol):
    """What discovery, planning and the workers need of the place the sources live."""

    def is_dir(self, path: str) -> bool: ...

    def is_file(self, path: str) -> bool: ...

    def exists(self, path: str) -> bool: ...

    def entries(self, folder: str) -> tuple[list[str], list[str]]:
        """(sub-folder names, file names) directly in `folder`, hidden ones skipped, sorted."""

    def walk(self, folder: str) -> Iterator[tuple[str, list[str]]]:
        """(folder, its file names) for `folder` and every non-hidden folder below it."""

    def stat(self, path: str) -> tuple[int, int]:
        """(size, stamp) of a regular file; FileNotFoundError, NotRegularFileError or OSError."""

    def read(self, path: str) -> tuple[bytes, int | None]:
        """(the whole file, its stamp when the read tells it)."""

    def head(self, path: str, size: int) -> bytes:
        """The first `size` bytes of a regular file (fewer when it is shorter)."""


class LocalFiles:
    """A local folder: the file system calls discovery always made."""

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def is_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def entries(self, folder: str) -> tuple[list[str], list[str]]:
        dirs, files = [], []
        try:
            with os.scandir(folder) as it:
                for e in it:
                    if not e.name.startswith("."):
                        (dirs if e.is_dir() else files).append(e.name)
        except OSError:
            return [], []
        return sorted(dirs), sorted(files)

    def walk(self, folder: str) -> Iterator[tuple[str, list[str]]]:
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            yield dirpath, filenames

    def stat(self, path: str) -> tuple[int, int]:
        st = os.stat(path)
        if not stat_module.S_ISREG(st.st_mode):
            raise NotRegularFileError(f"{path}: not a regular file (a FIFO, socket or device)")
        return st.st_size, st.st_mtime_ns

    def read(self, path: str) -> tuple[bytes, int | None]:
        return _remembered(path, lambda: read_stable(path))  # one version of the file, or SourceChangedError

    def head(self, path: str, size: int) -> bytes:
        with open_regular_file(path) as f:
            return f.read(size)


class _Listing:
    """One listing of a prefix, as folders: files (size, stamp) by path, children by folder."""

    def __init__(self, url: str, bucket_url: str, infos: list) -> None:
        self.url = url
        self.files: dict[str, tuple[int, int]] = {}
        self.dirs: dict[str, tuple[set[str], list[str]]] = {url: (set(), [])} if infos else {}  # none: no folder
        for info in infos:
            path = f"{bucket_url}/{info.name}"
            self.files[path] = (info.size, version_stamp(info.version))
            parent, _, name = path.rpartition("/")
            self._folder(parent)[1].append(name)

    def _folder(self, path: str) -> tuple[set[str], list[str]]:
        node = self.dirs.get(path)
        if node is None:
            node = self.dirs[path] = (set(), [])
            parent, _, name = path.rpartition("/")
            self._folder(parent)[0].add(name)
        return node

    def covers(self, path: str) -> bool:
        return path == self.url or path.startswith(self.url + "/")


class BucketFiles:
    """The objects of one bucket, seen as folders through cached prefix listings."""

    def __init__(self, scheme: str, bucket: str, options: tuple = ()) -> None:
        self.scheme, self.bucket, self.options = scheme, bucket, options
        self._store = None
        self._lock = threading.Lock()

    @property
    def store(self):
        if self._store is None:
            from readers.storage.store import open_store

            self._store = open_store(f"{self.scheme}://{self.bucket}", thaw_storage_options(self.options))
        return self._store

    def key(self, path: str) -> str:
        return split_url(path)[2]

    def _listing(self, folder: str) -> _Listing:
        """The cached listing that covers `folder`, else one listing of `folder`'s prefix."""
        folder = folder.rstrip("/")
        for listing in _LISTINGS:
            if listing.covers(folder):
                return listing
        with self._lock:
            listing = _Listing(folder, f"{self.scheme}://{self.bucket}", self.store.list(self.key(folder)))
            if _SCOPE.depth:
                _LISTINGS.append(listing)
        return listing

    def is_dir(self, path: str) -> bool:
        return path.rstrip("/") in self._listing(path).dirs

    def is_file(self, path: str) -> bool:
        return self._file(path) is not None

    def exists(self, path: str) -> bool:
        return self.is_file(path) or self.is_dir(path)

    def _file(self, path: str) -> tuple[int, int] | None:
        """(size, stamp) from a listing that covers `path`'s folder, else one metadata request."""
        parent = path.rpartition("/")[0]
        if any(listing.covers(parent) for listing in _LISTINGS):
            return self._listing(parent).files.get(path)
        try:
            info = self.store.info(self.key(path))
        except FileNotFoundError:
            return None
        return info.size, version_stamp(info.version)

    def entries(self, folder: str) -> tuple[list[str], list[str]]:
        node = self._listing(folder).dirs.get(folder.rstrip("/"))
        if node is None:
            return [], []
        return (sorted(d for d in node[0] if not d.startswith(".")),
                sorted(f for f in node[1] if not f.startswith(".")))

    def walk(self, folder: str) -> Iterator[tuple[str, list[str]]]:
        listing = self._listing(folder)
        pending = [folder.rstrip("/")]
        while pending:
            here = pending.pop()
            node = listing.dirs.get(here)
            if node is None:
                continue
            yield here, list(node[1])
            pending += [f"{here}/{d}" for d in sorted(node[0], reverse=True) if not d.startswith(".")]

    def stat(self, path: str) -> tuple[int, int]:
        found = self._file(path)
        if found is None:
            raise FileNotFoundError(f"{path}: no such object")
        return found

    def read(self, path: str) -> tuple[bytes, int | None]:
        return _remembered(path, lambda: self._read(path))

    def _read(self, path: str) -> tuple[bytes, int | None]:
        known = None
        parent = path.rpartition("/")[0]
        if any(listing.covers(parent) for listing in _LISTINGS):
            known = self._listing(parent).files.get(path)
        return self.store.read(self.key(path)), None if known is None else known[1]

    def head(self, path: str, size: int) -> bytes:
        """The first `size` bytes: one ranged GET, not the whole object."""
        return self.store.read_range(self.key(path), 0, size)


class _Scope:
    depth = 0


class _Memo:
    depth = 0
    reads: dict[str, tuple[bytes, int | None]] = {}


def _remembered(path: str, read: Any) -> tuple[bytes, int | None]:
    """`read()`, or what it gave for `path` earlier in the open `read_memo()` block."""
    if not _MEMO.depth:
        return read()
    found = _MEMO.reads.get(path)
    if found is None:
        found = _MEMO.reads[path] = read()
    return found


_SCOPE = _Scope()
_MEMO = _Memo()
_LISTINGS: list[_Listing] = []
_LOCAL = LocalFiles()
_BUCKETS: dict[tuple[str, str], BucketFiles] = {}
_OPTIONS: dict[tuple[str, str], tuple] = {}
_DEFAULT_OPTIONS: list[tuple] = [()]


def use_storage_options(location: str | None, storage_options: Any = ()) -> None:
    """Reach the bucket of `location` (when it is an object-store URL) with `storage_options`;
    other buckets this process meets get them too (one set of options per command)."""
    if location is None or not is_remote(location):
        return
    scheme, bucket, _ = split_url(location)
    frozen = freeze_storage_options(storage_options)
    _DEFAULT_OPTIONS[0] = frozen
    if _OPTIONS.get((scheme, bucket)) != frozen:
        _OPTIONS[(scheme, bucket)] = frozen
        _BUCKETS.pop((scheme, bucket), None)


def files_for(path: str) -> SourceFiles:
    """`LocalFiles` for a local path, the `BucketFiles` of an object-store URL's bucket."""
    if not is_remote(path):
        return _LOCAL
    scheme, bucket, _ = split_url(path)
    found = _BUCKETS.get((scheme, bucket))
    if found is None:
        options = _OPTIONS.get((scheme, bucket), _DEFAULT_OPTIONS[0])
        found = _BUCKETS[(scheme, bucket)] = BucketFiles(scheme, bucket, options)
    return found


@contextlib.contextmanager
def source_scope() -> Iterator[None]:
    """Keep object-store listings while the block runs (re-entrant); drop them after the outermost."""
    _SCOPE.depth += 1
    try:
        yield
    finally:
        _SCOPE.depth -= 1
        if not _SCOPE.depth:
            _LISTINGS.clear()


@contextlib.contextmanager
def read_memo() -> Iterator[None]:
    """Read each source file at most once while the block runs (re-entrant): discovery asks
    several questions of the same files (the class table is a colour table? an RLE CSV? its
    rows; the first mask for the semantics and again for the cross-check of readings), and on
    a bucket each read is a GET. Kept for discovery only, which reads a few small files; the
    workers' reads of every image never enter it."""
    _MEMO.depth += 1
    try:
        yield
    finally:
        _MEMO.depth -= 1
        if not _MEMO.depth:
            _MEMO.reads = {}


def join(folder: str, *names: str) -> str:
    """`os.path.join` for local paths; '/'-joined for URLs."""
    if not is_remote(folder):
        return os.path.join(folder, *names)
    return "/".join([folder.rstrip("/"), *(n.strip("/") for n in names if n)])


def relative(path: str, base: str) -> str:
    """`path` relative to `base` ('/'-separated)."""
    if is_remote(path):
        base = base.rstrip("/")
        if path.rstrip("/") == base:
            return "."
        return path[len(base) + 1:] if path.startswith(base + "/") else path
    return os.path.relpath(path, base).replace(os.sep, "/")


def absolute(location: str) -> str:
    """`os.path.abspath` of a local path; a URL without its trailing slashes."""
    return location.rstrip("/") if is_remote(location) else os.path.abspath(location)


class WithStorage:
    """`fn` called after registering `storage_options` for `location`: a picklable wrapper for
    functions that worker processes run on sources in a bucket (fresh interpreters know no options)."""

    def __init__(self, fn: Any, location: str | None, storage_options: Any) -> None:
        self.fn, self.location, self.storage_options = fn, location, freeze_storage_options(storage_options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        use_storage_options(self.location, self.storage_options)
        return self.fn(*args, **kwargs)


def is_dir(path: str) -> bool:
    return files_for(path).is_dir(path)


def is_file(path: str) -> bool:
    return files_for(path).is_file(path)


def exists(path: str) -> bool:
    """Whether anything has the name (a dangling local link counts)."""
    return files_for(path).exists(path)


def subfolders(folder: str) -> list[str]:
    """Sub-folder names of `folder` (hidden ones skipped), sorted."""
    return files_for(folder).entries(folder)[0]


def file_names(folder: str) -> list[str]:
    """Names of the files directly in `folder` (hidden ones skipped), sorted."""
    return files_for(folder).entries(folder)[1]


def read_bytes(path: str) -> bytes:
    """The bytes of a small source-side file (a class table, a split list, a label map)."""
    if not is_remote(path):
        def read() -> tuple[bytes, None]:
            with open_regular_file(path) as f:
                return f.read(), None
        return _remembered(path, read)[0]
    return files_for(path).read(path)[0]


def read_head(path: str, size: int) -> bytes:
    """The first `size` bytes of a source file (a header to probe), without reading the rest."""
    if _MEMO.depth and path in _MEMO.reads:
        return _MEMO.reads[path][0][:size]
    if _MEMO.depth and is_remote(path) and _listed_size(path) <= size:
        return files_for(path).read(path)[0]  # the whole object in the one GET, kept for later questions
    return files_for(path).head(path, size)


def _listed_size(path: str) -> int:
    """An object's size from its bucket's listing; a huge size for one not listed."""
    try:
        return files_for(path).stat(path)[0]
    except (OSError, ValueError):
        return 1 << 62


__all__ = ["BucketFiles", "LocalFiles", "SourceFiles", "WithStorage", "absolute", "exists", "file_names",
           "files_for", "is_dir", "is_file", "join", "read_bytes", "read_head", "read_memo", "relative", "source_scope",
           "subfolders", "use_storage_options", "version_stamp"]
