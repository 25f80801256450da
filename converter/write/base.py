"""The one shard writer: temporary name, encode, flush, fsync, rename, checksum.

Format adapters (`ShardEncoder` subclasses) only turn samples into bytes; everything
that makes a shard safe on disk lives here:

* the shard is written under a temporary name (`.tmp-<name>-<pid>-<random>`) in the
  output folder, so a crash leaves nothing under a final name that a manifest could
  list; the random part keeps two attempts at the same shard apart even when they run
  on different machines of a cluster with the same pid (a retried Dask task);
* on a clean exit of the ``with`` block the encoder finishes, the file is flushed
  and fsynced, and renamed to its final name; its digest (xxh3-128,
  `converter.plan.fingerprint`) is computed as the bytes are written (formats that write
  front to back, like TFRecord), or by reading the file back when the encoder went
  back to patch bytes it had written (zip headers);
* on an exception the temporary file is removed and nothing is renamed (a writer that
  publishes on failure is the classic way to ship half a dataset).

Publishing the manifest is `converter.publish.manifest`'s job; the directory fsync that makes
the renames durable happens there, once per run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import IO, Any

from converter.plan.fingerprint import DEFAULT_ALGORITHM, digest_file, new_hasher
from converter.fsutil import TMP_PREFIX
from readers.formats.encoder import SampleArrays, ShardEncoder

@dataclass(frozen=True)
class WrittenShard:
    file: str
    records: int
    bytes: int
    digest: str  # "xxh3_128:HEX"


class _HashingFile:
    """The shard's file object, hashing the bytes as they are appended (xxh3-128).

    A write at any position other than the end (an encoder that seeks back to patch
    a header, as `zipfile` does) turns the running hash off: `digest()` is then None
    and the writer hashes the finished file instead.
    """

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self._hash: Any = new_hasher(DEFAULT_ALGORITHM)
        self._pos = 0
        self._end = 0

    def write(self, data: Any) -> int:
        n = self._f.write(data)
        if self._hash is not None:
            if self._pos == self._end:
                self._hash.update(data)
                self._end += n
            else:
                self._hash = None
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._pos = self._f.seek(offset, whence)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def digest(self, size: int) -> str | None:
        """'xxh3_128:HEX' of the `size`-byte file, if every byte was hashed in order."""
        if self._hash is None or self._end != size:
            return None
        return f"{DEFAULT_ALGORITHM}:{self._hash.hexdigest()}"

    def __getattr__(self, name: str) -> Any:  # flush, fileno, seekable, closed, close, ...
        return getattr(self._f, name)


class ShardWriter:
    """Context manager writing one shard atomically.

    >>> with ShardWriter(out_dir, "train-00000.tfrecord", encoder_cls, compression="none", capacity=8) as w:
    ...     w.add(sample)
    >>> w.result  # WrittenShard, set only after a clean exit
    """

    def __init__(self, out_dir: str, name: str, encoder_cls: type[ShardEncoder], *, compression: str,
                 capacity: int) -> None:
        if os.sep in name or name.startswith("."):
            raise ValueError(f"shard name must be a plain file name. Received: {name!r}")
        self.out_dir = out_dir
        self.name = name
        self.final_path = os.path.join(out_dir, name)
        self.tmp_path = os.path.join(out_dir, f"{TMP_PREFIX}{name}-{os.getpid()}-{os.urandom(4).hex()}")
        self._encoder_cls = encoder_cls
        self._compression = compression
        self._capacity = capacity
        self._file: IO[bytes] | None = None
        self._hashing: _HashingFile | None = None
        self._encoder: ShardEncoder | None = None
        self.records = 0
        self.result: WrittenShard | None = None

    def __enter__(self) -> "ShardWriter":
        self._file = open(self.tmp_path, "wb")
        self._hashing = _HashingFile(self._file)
        self._encoder = self._encoder_cls(self._hashing,  # type: ignore[arg-type]
                                          compression=self._compression, capacity=self._capacity)
        return self

    def add(self, sample: SampleArrays) -> None:
        if self._encoder is None:
            raise RuntimeError("ShardWriter.add called outside its `with` block")
        self._encoder.add(sample)
        self.records += 1

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        f = self._file
        try:
            if exc_type is None and f is not None and self._encoder is not None:
                self._encoder.finish()
                f.flush()
                os.fsync(f.fileno())
                f.close()
                size = os.path.getsize(self.tmp_path)
                digest = self._hashing.digest(size) if self._hashing is not None else None
                if digest is None:  # the encoder patched bytes it had written: read the file back
                    digest = digest_file(self.tmp_path)
                os.replace(self.tmp_path, self.final_path)
                self.result = WrittenShard(self.name, self.records, size, digest)
                return
        except BaseException:
            self._discard(f)
            raise
        self._discard(f)

    def _discard(self, f: IO[bytes] | None) -> None:
        if f is not None and not f.closed:
            f.close()
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass
