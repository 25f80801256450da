"""Datasets in buckets (``s3://``, ``gs://``): the manifest, index files and shards read
from an object store, checked as strictly as a local folder.

* `load_manifest` reads ``imgshard.json`` with the same limits as a local file (its
  size is asked first: a 5 GB object is refused before any byte is read) and the same
  schema validation (`readers.manifest`).
* `list_objects` lists the dataset's prefix once (one LIST, paginated): sizes and
  versions of every shard and index file, so `readers.open` checks each shard's size
  without one request per shard.
* `RemoteFile` is one object the manifest lists, with the manifest's size and digest: a
  whole read (one GET) is checked against both before a parser sees a byte; a ranged read
  must return exactly the bytes asked for; with a `readers.cache.ShardCache` the object is
  read from its verified local copy instead.

Every error names the object's URL, what was expected and the fix.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import Any

from readers.digest import DIGEST_ALGORITHMS, algorithm_of, digest_bytes
from readers.errors import FIX_HINT, CacheFault, ShardError
from readers.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, ManifestError, parse_manifest_bytes
from readers.sources import ByteSource, FileSource, MemorySource, RangedSource, SourceStat

def digest_of(data: Any, digest: str) -> str:
    """The digest of `data` with the algorithm `digest` ("ALGORITHM:HEX") names."""
    return digest_bytes(data, algorithm_of(digest))


def load_manifest(store: Any) -> Manifest:
    """The manifest of the dataset in `store` (an `ObjectStore`), size-capped and validated."""
    url = store.url_of(MANIFEST_NAME)
    try:
        info = store.info(MANIFEST_NAME)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"No imgshard dataset at {store.url!r}: {MANIFEST_NAME} not found. Run `imgshard convert SRC "
            f"{store.url}` first, or pass the prefix that holds the manifest.") from None
    if info.size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{url} is {info.size} bytes, more than a manifest may hold ({MAX_MANIFEST_BYTES}); "
                            "it is not an imgshard manifest.")
    data = store.read(MANIFEST_NAME)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{url} is more than {MAX_MANIFEST_BYTES} bytes; it is not an imgshard manifest.")
    return Manifest.from_json(parse_manifest_bytes(data, url), url)


def list_objects(store: Any) -> dict[str, Any]:
    """Name -> `ObjectInfo` of every object under the dataset's prefix."""
    return {info.name: info for info in store.list()}


def _version_stamp(version: str) -> int:
    """A number standing in for a file's mtime: changes when the object's version does."""
    return zlib.crc32(version.encode("utf-8")) if version else 0


@dataclass(frozen=True)
class RemoteFile:
    """One object of a bucket dataset with the size and digest its manifest gives.

    Picklable (the store is rebuilt from its URL and options; the cache from its folder
    and bound), so random-access readers and worker processes carry it.
    """

    store: Any  # readers.storage.ObjectStore
    name: str  # relative to the dataset prefix
    size: int
    digest: str  # "ALGORITHM:HEX" from the manifest
    version: str = ""  # ETag / generation from the listing
    cache: Any = None  # readers.cache.ShardCache or None
    what: str = "shard"  # "shard" or "index file": how errors name it

    @property
    def url(self) -> str:
        return self.store.url_of(self.name)

    @property
    def stat(self) -> SourceStat:
        return SourceStat(self.size, _version_stamp(self.version), 0)

    @property
    def cached(self) -> bool:
        return self.cache is not None and self.cache.fits(self.size)

    def index_file(self, ref: Any) -> "RemoteFile":
        """The index object (`IndexRef` of this shard's manifest entry) in the same store and cache."""
        return RemoteFile(self.store, ref.file, ref.bytes, ref.digest, "", self.cache, "index file")

    def error(self, problem: str) -> ShardError:
        return ShardError(f"{self.what} {self.url}: {problem}. {FIX_HINT}", path=self.url)

    def open(self, *, ranged: bool = False) -> ByteSource:
        """The bytes: the verified local copy (with a cache), ranged reads, or one whole checked read."""
        if self.cached:
            try:
                try:
                    return FileSource(self.cache.fetch(self), name=self.url)
                except FileNotFoundError:  # evicted by another process between the check and the open
                    return FileSource(self.cache.fetch(self), name=self.url)
            except CacheFault as e:  # a full or failing cache disk: this object is read into memory
                _warn_cache_fault(self.cache.directory, e)
        if ranged:
            return RangedSource(self)
        return MemorySource(self.url, self.read_whole(), self.stat)

    def _get(self, start: int | None = None, end: int | None = None) -> bytes:
        try:
            if start is None:
                return self.store.read(self.name)
            return self.store.read_range(self.name, start, end)
        except FileNotFoundError:
            raise self.error(f"the object is missing (the manifest lists it with {self.size} bytes); a newer "
                             "convert may have replaced the dataset since it was opened: open it again") from None
        except OSError as e:  # StorageError: names the URL, the reason, the endpoint fix
            raise self.error(f"cannot read it ({e})") from e

    def read_whole(self) -> bytes:
        """The whole object (one GET), checked against the manifest's size and digest."""
        data = self._get()
        self.check(data)
        return data

    def check(self, data: Any) -> None:
        if len(data) != self.size:
            raise self.error(f"read {len(data)} bytes, the manifest says {self.size} (the object is truncated "
                             "or was rewritten)")
        try:
            got = digest_of(data, self.digest)
        except ValueError as e:
            raise self.error(f"cannot check its digest: {e}") from e
        if got != self.digest:
            raise self.error(f"its digest is {got}, the manifest says {self.digest} (the object is damaged or "
                             "was rewritten)")

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (one ranged GET); anything but exactly those bytes is an error."""
        data = self._get(start, end)
        if len(data) != end - start:
            raise self.error(f"a read of bytes {start}-{end} returned {len(data)} bytes (the object is "
                             "truncated or was rewritten)")
        return data


_warned_caches: set[str] = set()


def _warn_cache_fault(directory: str, e: OSError) -> None:
    """One warning per cache folder and process; later faults are logged at debug level."""
    import logging
    import warnings

    if directory in _warned_caches:
        logging.getLogger(__name__).debug("cache fault, reading into memory: %s", e)
        return
    _warned_caches.add(directory)
    message = (f"{e.strerror or e}. Reading objects into memory instead while the cache folder cannot take them (as for "
               "objects larger than cache_max_bytes); free space there or pass another cache_dir.")
    logging.getLogger(__name__).warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def remote_file(store: Any, objects: dict[str, Any], name: str, size: int, digest: str, cache: Any,
                what: str) -> RemoteFile:
    """The `RemoteFile` of `name` after checking the listing: present, with the manifest's size."""
    info = objects.get(name)
    url = store.url_of(name)
    if info is None:
        raise FileNotFoundError(f"{what.capitalize()} {url} is missing (the manifest lists it with {size} bytes). "
                                f"{FIX_HINT}")
    if info.size != size:
        raise ShardError(f"{what.capitalize()} {url} has the wrong size: expected {size} bytes (from the manifest). "
                         f"Received: {info.size} bytes. The object is truncated or was rewritten. {FIX_HINT}",
                         path=url)
    return RemoteFile(store, name, size, digest, info.version, cache, what)


def local_copy_name(remote: RemoteFile) -> str:
    """A file name for `remote`'s bytes: its digest (content-addressed) and its base name."""
    algorithm, _, hexdigest = remote.digest.partition(":")
    if algorithm not in DIGEST_ALGORITHMS or not hexdigest or hexdigest.strip("0123456789abcdef"):
        raise remote.error(f"the manifest gives it the digest {remote.digest!r}, expected ALGORITHM:HEX with "
                           f"ALGORITHM one of {list(DIGEST_ALGORITHMS)}")
    return f"{algorithm}-{hexdigest[:32]}-{os.path.basename(remote.name)}"


__all__ = ["DIGEST_ALGORITHMS", "RemoteFile", "digest_of", "list_objects", "load_manifest",
           "local_copy_name", "remote_file"]
