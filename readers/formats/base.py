"""What every format adapter shares: the adapter base class, the random-access reader
base, errors that name the shard, and the checksum policy.

NumPy only at import time; TensorFlow is imported inside the functions that build
graphs. The record layout is `readers.formats.spec`, the pipeline options
`readers.formats.pipeline`, the (x, y) expansion `readers.formats.expand`.
"""

from __future__ import annotations

import abc
import contextlib
import os
import zlib
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from readers.errors import ShardError, describe, missing_shard_error, shard_error
from readers.formats import FileFormat
from readers.formats.pipeline import PipelineOptions
from readers.formats.spec import Record, RecordSpec, ShardRef

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf


class CountError(ValueError):
    """A shard whose records cannot be counted: `reason` says why (without the file name),
    `record` which record broke (None when it is not about one record)."""

    def __init__(self, reason: str, record: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.record = record


class FileAdapter(abc.ABC):
    """Reader side of one shard format."""

    file_format: FileFormat

    @abc.abstractmethod
    def iter_shard(self, shard: ShardRef, spec: RecordSpec) -> Iterator[Record]:
        """Yield the records of one shard in order (NumPy only). Errors name the file."""

    def iter_stored(self, shard: ShardRef, spec: RecordSpec) -> Iterator[Record]:
        """Like `iter_shard`, but encoded images and masks stay the stored PNG/JPEG/WebP
        bytes (`readers.formats.encoding`): what a rewrite copies without re-encoding."""
        return self.iter_shard(shard, spec)

    @abc.abstractmethod
    def tf_dataset(self, shards: Sequence[ShardRef], spec: RecordSpec, options: PipelineOptions,
                   ids: "np.ndarray | None" = None) -> "tf.data.Dataset":
        """One epoch of batched (x, y) over `shards`, expanded per `options` (no repeat,
        no cardinality assertion, no final prefetch: the caller adds those). `ids`: one
        uint64 per record of `shards` (its key's id) for augmentation draws."""

    @abc.abstractmethod
    def count_records(self, path: str, spec: RecordSpec, *, check_crc: bool = False) -> int:
        """The records in the shard at `path`, read from its framing or headers (no record
        decoded); a shard that does not match `spec` raises `CountError`."""

    @abc.abstractmethod
    def random_access(self, shard: ShardRef, spec: RecordSpec) -> "RandomAccessShard":
        """A reader of single records by index (for `keras.utils.PyDataset`)."""


class RandomAccessShard(abc.ABC):
    """Records of one shard by index; cheap to create, opens files lazily."""

    @abc.abstractmethod
    def read(self, index: int) -> tuple[np.ndarray, np.ndarray | int]:
        """(image, mask-or-label) of record `index`."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release open files."""

    @property
    def ranged(self) -> bool:
        """Whether reads go to an object store as ranged GETs (latency-bound: read a batch's
        records concurrently, `readers.sources.parallel_io`)."""
        from readers.sources import is_ranged

        return is_ranged(getattr(self, "shard", None))


@contextlib.contextmanager
def naming_shard(path: str, record: int | None = None) -> Iterator[None]:
    """Re-raise any read/decode error as a `ShardError` naming `path` (and `record`)."""
    try:
        yield
    except ShardError:
        raise
    except FileNotFoundError as e:
        if e.filename is not None and os.fspath(e.filename) != os.fspath(path):
            raise shard_error(path, f"cannot read it ({describe(e)})", record=record) from e
        raise missing_shard_error(path, record=record) from e  # gone since `open`: rewritten, or damaged
    except (OSError, ValueError, EOFError, KeyError, IndexError, TypeError, zlib.error) as e:
        raise shard_error(path, f"cannot read it ({describe(e)})", record=record) from e


# -- checksums -----------------------------------------------------------------------------------

#: "once": training pipelines check a shard's checksums the first time this process reads
#: it (and again if its size, mtime or inode change); "always": on every read.
#: `Dataset.records()` always checks.
CRC_POLICY = "once"
_verified: set[tuple[str, int, int, int]] = set()


def crc_due(path: str, st: os.stat_result, check_crc: "bool | str") -> tuple[bool, tuple[str, int, int, int] | None]:
    """Whether to check `path`'s checksums now, and the key to mark it verified with.

    `st`: the status of the file as opened (`os.fstat`), so that the decision is about
    the file being read, not one that stood at `path` a moment earlier. `check_crc`
    True/False forces it; "once" defers to `CRC_POLICY`.
    """
    if check_crc is not True and check_crc != "once":
        return False, None
    if check_crc is True or CRC_POLICY == "always":
        return True, None
    key = file_key(path, st)
    return key not in _verified, key


def file_key(path: str, st: Any) -> tuple[str, int, int, int]:
    """What identifies the content of the file at `path` as opened (`st`: its `fstat`): path,
    size, modification time and inode. A file rewritten in place gets a new key (the checksum
    policy's verified files and the remembered layouts of `readers.formats.layouts` use it)."""
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


def mark_verified(key: tuple[str, int, int, int] | None) -> None:
    if key is not None:
        _verified.add(key)


__all__ = [
    "CRC_POLICY",
    "CountError",
    "FileAdapter",
    "RandomAccessShard",
    "crc_due",
    "file_key",
    "mark_verified",
    "naming_shard",
]
