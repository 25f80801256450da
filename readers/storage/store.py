"""An object store (S3, GCS) seen as one dataset or source folder: read, list, put, and the
conditional writes that replace rename, fsync and flock there.

fsspec (`s3fs`, `gcsfs`) is imported only when an ``s3://`` or ``gs://`` location is
opened; a missing package is one `StorageError` naming the ``pip install imgshard[s3]``
extra. Credentials and endpoints come from the standard settings of each SDK
(``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``..., ``GOOGLE_APPLICATION_CREDENTIALS``,
``STORAGE_EMULATOR_HOST``) plus the ``storage_options`` given (``--storage-option KEY=VALUE``).

The three conditional operations are what the cron guarantees rest on:

* `create` - write only if no object has the name (S3 ``If-None-Match: *``, GCS
  ``ifGenerationMatch=0``): the run lock;
* `replace` - write only if the object is still the version read (S3 ``If-Match: ETAG``,
  GCS ``ifGenerationMatch=GEN``): publishing the manifest, renewing or taking over a lock;
* `delete(..., if_version=)` - delete only that version: releasing a lock one still holds.

Each raises `PreconditionFailed` when the condition does not hold. Every object is
written with one request (fsspec uses a multipart upload for large files, which the
store makes visible whole when it completes), so a reader never sees half an object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import quote

from readers.storage.url import OBJECT_SCHEMES, split_url


class StorageError(OSError):
    """An object-store operation failed; the message names the URL, the reason and the fix."""


class PreconditionFailed(StorageError):
    """A conditional write or delete found the object missing, present, or at another version."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object: its name relative to the store's root, its size and its version
    (the S3 ETag, the GCS generation), which changes whenever the object is rewritten."""

    name: str
    size: int
    version: str


def _is_precondition(e: BaseException) -> bool:
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, FileExistsError):
            return True
        code = getattr(seen, "code", None)
        response = getattr(seen, "response", None)
        if code == 412 or (isinstance(response, dict) and (
                response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict")
                or response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412))):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _import_fs(scheme: str) -> Any:
    protocol, extra, package = OBJECT_SCHEMES[scheme]
    try:
        __import__(package)
        import fsspec
    except ImportError as e:
        raise StorageError(f"{scheme}:// locations need the {package} package, which is not installed "
                           f"({e}); install it with: pip install 'imgshard[{extra}]'") from e
    return fsspec, protocol


class ObjectStore:
    """The objects under ``scheme://bucket/prefix/``; names are relative to that prefix."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.scheme, self.bucket, self.prefix = split_url(url)
        fsspec, self.protocol = _import_fs(self.scheme)
        options = dict(storage_options or {})
        options.setdefault("skip_instance_cache", True)
        options.setdefault("use_listings_cache", False)
        self.storage_options = dict(storage_options or {})
        self._fsspec, self._options = fsspec, options
        self._fs, self._pid = self._connect(), os.getpid()

    def _connect(self) -> Any:
        try:
            return self._fsspec.filesystem(self.protocol, **self._options)
        except Exception as e:  # bad options, unreadable credentials file, ...
            raise StorageError(f"{self.url}: cannot set up {self.protocol} access ({e}); check "
                               "--storage-option values and the credentials settings") from e

    @property
    def fs(self) -> Any:
        """The fsspec filesystem; a forked child (Keras `use_multiprocessing`, a process pool)
        gets its own, since fsspec's clients and event loop are not fork-safe."""
        if self._pid != os.getpid():
            self._fs, self._pid = self._connect(), os.getpid()
        return self._fs

    # -- names ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, name: str = "") -> str:
        return "/".join(p for p in (self.prefix, name.strip("/")) if p)

    def path(self, name: str = "") -> str:
        return f"{self.bucket}/{self.key(name)}".rstrip("/")

    def url_of(self, name: str) -> str:
        return f"{self.scheme}://{self.path(name)}"

    def child(self, name: str) -> "ObjectStore":
        """The store rooted at a sub-prefix (``store.child("train")``)."""
        return ObjectStore(self.url_of(name), self.storage_options)

    def __reduce__(self) -> tuple:  # picklable for worker processes: rebuilt from URL + options
        return (ObjectStore, (self.url, self.storage_options))

    def _fail(self, what: str, name: str, e: BaseException) -> StorageError:
        if isinstance(e, StorageError):
            return e
        if isinstance(e, FileNotFoundError):
            return StorageError(f"{self.url_of(name)}: {what} failed: no such object (or no such bucket); "
                                "check the URL")
        if isinstance(e, PermissionError):
            return StorageError(f"{self.url_of(name)}: {what} failed: access denied ({e}); check the "
                                "credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS)")
        return StorageError(f"{self.url_of(name)}: {what} failed: {type(e).__name__}: {e}; check the "
                            "endpoint (AWS_ENDPOINT_URL, --storage-option endpoint_url=...) and the network")

    # -- reading ----------------------------------------------------------------------------
    def _info_of(self, raw: dict) -> ObjectInfo:
        path = raw["name"]
        prefix = self.path() + "/"
        name = path[len(prefix):] if path.startswith(prefix) else path.rsplit("/", 1)[-1]
        version = raw.get("generation") or raw.get("ETag") or raw.get("etag") or ""
        return ObjectInfo(name=name, size=int(raw.get("size") or 0), version=str(version).strip('"'))

    def info(self, name: str) -> ObjectInfo:
        """Size and version of one object; `FileNotFoundError` when there is none."""
        try:
            raw = self.fs.info(self.path(name))
        except FileNotFoundError:
            raise
        except Exception as e:
            raise self._fail("reading the object's metadata", name, e) from e
        if raw.get("type") != "file":
            raise FileNotFoundError(f"{self.url_of(name)} is a prefix (a folder), not an object")
        return self._info_of(raw)

    def exists(self, name: str) -> bool:
        try:
            self.info(name)
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under `prefix` (recursively), sorted by name; [] when there is none."""
        try:
            found = self.fs.find(self.path(prefix), detail=True)
        except FileNotFoundError:
            return []
        except Exception as e:
            raise self._fail("listing", prefix, e) from e
        return sorted((self._info_of(v) for v in found.values() if v.get("type", "file") == "file"),
                      key=lambda i: i.name)

    def read(self, name: str) -> bytes:
        """The whole object (one GET)."""
        try:
            return self.fs.cat_file(self.path(name))
        except FileNotFoundError:
            raise
        except Exception as e:
            raise self._fail("reading", name, e) from e

    def read_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object (one ranged GET)."""
        try:
            return self.fs.cat_file(self.path(name), start=start, end=end)
        except FileNotFoundError:
            raise
        except Exception as e:
            raise self._fail(f"reading bytes {start}-{end}", name, e) from e

    def download(self, name: str, local: str) -> None:
        try:
            self.fs.get_file(self.path(name), local)
        except FileNotFoundError:
            raise
        except Exception as e:
            raise self._fail("downloading", name, e) from e

    def iter_chunks(self, name: str, chunk: int = 8 << 20) -> Iterator[bytes]:
        """The object in ranged GETs of `chunk` bytes (bounded memory for large objects)."""
        size = self.info(name).size
        for start in range(0, size, chunk):
            yield self.read_range(name, start, min(size, start + chunk))

    # -- writing ----------------------------------------------------------------------------
    def put(self, name: str, data: bytes) -> None:
        """Write one object whole (unconditional)."""
        try:
            self.fs.pipe_file(self.path(name), data)
        except Exception as e:
            raise self._fail("writing", name, e) from e

    def put_file(self, name: str, local: str) -> None:
        """Upload a local file as one object (multipart above fsspec's block size)."""
        try:
            self.fs.put_file(local, self.path(name))
        except Exception as e:
            raise self._fail(f"uploading {local}", name, e) from e

    def delete(self, name: str, if_version: str | None = None) -> None:
        """Delete one object (only that version when `if_version` is given); missing is fine."""
        try:
            if if_version is None:
                self.fs.rm_file(self.path(name))
            elif self.protocol == "s3":
                self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key(name), IfMatch=f'"{if_version}"')
            else:
                self.fs.call("DELETE", f"{self.fs._location}/storage/v1/b/{self.bucket}/o/{quote(self.key(name), safe='')}",
                             ifGenerationMatch=if_version)
        except FileNotFoundError:
            return
        except Exception as e:
            if _is_precondition(e):
                raise PreconditionFailed(f"{self.url_of(name)}: not deleted: it changed since it was read "
                                         f"(expected version {if_version})") from e
            raise self._fail("deleting", name, e) from e

    def create(self, name: str, data: bytes) -> str:
        """Write `name` only if no object has that name; returns the new version."""
        return self._conditional(name, data, None)

    def replace(self, name: str, data: bytes, if_version: str) -> str:
        """Write `name` only if it is still at `if_version`; returns the new version."""
        return self._conditional(name, data, if_version)

    def _conditional(self, name: str, data: bytes, if_version: str | None) -> str:
        try:
            if self.protocol == "s3":
                cond = {"IfNoneMatch": "*"} if if_version is None else {"IfMatch": f'"{if_version}"'}
                out = self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key(name), Body=data, **cond)
                return str(out["ETag"]).strip('"')
            out = self.fs.call("POST", f"{self.fs._location}/upload/storage/v1/b/{self.bucket}/o",
                               uploadType="media", name=self.key(name), data=data, json_out=True,
                               ifGenerationMatch=0 if if_version is None else if_version)
            return str(out["generation"])
        except Exception as e:
            if _is_precondition(e):
                state = "already exists" if if_version is None else f"is no longer at version {if_version}"
                raise PreconditionFailed(f"{self.url_of(name)} {state}") from e
            raise self._fail("conditional write", name, e) from e


def open_store(url: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> ObjectStore:
    """The object store of an ``s3://`` or ``gs://`` URL."""
    return ObjectStore(os.fspath(url), storage_options)


__all__ = ["ObjectInfo", "ObjectStore", "PreconditionFailed", "StorageError", "open_store"]
