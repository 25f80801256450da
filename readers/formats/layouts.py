"""Shard layouts (where each record or array lies in a file), found once per process.

One cache for every format (`remember` / `recall`, keyed by `readers.formats.base.file_key`:
path, size, modification time and inode, like the checksum policy; least recently used
out past `LAYOUT_CACHE_FILES`): the NPZ reader keeps its members' offsets there, the
TFRecord reader its records' (`Layout`). A file rewritten in place gets a new key and is
parsed (and checked) again.

TFRecord: loading an uncompressed shard for the `tf.data` generator pipeline maps it and
walks its records: framing, the `tf.train.Example` features, the record count and, once
per process, the CRCs. Every epoch loads every shard again; the walk (Python, per record)
was ~10% of the compact pipeline's CPU on the bench's 512x512 TFRecord shards. With the
shard's `Layout` known, later loads skip the walk: float pipelines map the file and view
the records at the known offsets (`MappedColumn`); compact pipelines, whose records go
unchanged into their batch rows, keep the file open and read each record with `pread`
straight into its row (`ReadColumn`, `read_rows`: a batch in one C call), which saves the
page faults and the unmapping of the mapping (+10%, and +14% more in one call per batch;
for float batches a `pread` into a scratch row was 9% slower than the mapping).

NumPy and the standard library (and `readers._warp` when built).
"""
from __future__ import annotations

import collections
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.errors import shard_error

try:  # `read_rows`: a batch's records read with the GIL released once
    from readers import _warp
except ImportError:  # pragma: no cover - built without a C compiler: one pread per record
    _warp = None

#: File layouts kept per process (least recently used out); a TFRecord layout is two
#: int64 offsets per record, an NPZ layout a few hundred bytes.
LAYOUT_CACHE_FILES = 16384

_layouts: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True)
class Layout:
    """Byte offsets of each record's image and target (mask) in a TFRecord shard; for
    classification shards `labels` instead of target offsets."""

    images: np.ndarray
    targets: np.ndarray | None = None
    labels: np.ndarray | None = None


def recall(key: tuple | None) -> Any:
    """The layout remembered for `key` (path, size, mtime_ns, inode), or None."""
    if key is None:
        return None
    with _lock:
        layout = _layouts.get(key)
        if layout is not None:
            _layouts.move_to_end(key)
        return layout


def remember(key: tuple, layout: Any) -> None:
    with _lock:
        _layouts[key] = layout
        _layouts.move_to_end(key)
        while len(_layouts) > LAYOUT_CACHE_FILES:
            _layouts.popitem(last=False)


def forget_all() -> None:
    """Drop every remembered layout (tests)."""
    with _lock:
        _layouts.clear()


class _Column:
    """One field (image or mask) of a shard's records at the offsets of its `Layout`."""

    def __init__(self, offsets: np.ndarray, row_shape: tuple[int, ...], row_dtype: Any):
        self.offsets = offsets
        self.row_shape = tuple(row_shape)
        self.row_dtype = np.dtype(row_dtype)
        self.row_bytes = int(np.prod(self.row_shape)) * self.row_dtype.itemsize

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def nbytes(self) -> int:
        return len(self.offsets) * self.row_bytes


class MappedColumn(_Column):
    """Records as views on the shard's mapping (`column[i]`: record i, no copy)."""

    def __init__(self, buf: np.ndarray, offsets: np.ndarray, row_shape: tuple[int, ...], row_dtype: Any):
        super().__init__(offsets, row_shape, row_dtype)
        self.buf = buf

    def __getitem__(self, index: int) -> np.ndarray:
        offset = int(self.offsets[index])
        return self.buf[offset:offset + self.row_bytes].view(self.row_dtype).reshape(self.row_shape)


class OpenShard:
    """A shard's open `FileSource`, closed when the last column reading it is gone."""

    def __init__(self, source: Any) -> None:
        self.fd = source.fileno()
        self.name = source.name
        self._finalizer = weakref.finalize(self, source.close)


class ReadColumn(_Column):
    """Records read from the file with `os.preadv`: `read_into(i, out)` reads record i
    straight into `out` (a batch row); `column[i]` into a new array. Safe from several
    threads at once (`pread` has no file position)."""

    def __init__(self, shard: OpenShard, offsets: np.ndarray, row_shape: tuple[int, ...], row_dtype: Any):
        super().__init__(offsets, row_shape, row_dtype)
        self.shard = shard

    def read_into(self, index: int, out: np.ndarray) -> None:
        offset = int(self.offsets[index])
        try:
            got = os.preadv(self.shard.fd, [out], offset) if self.row_bytes else 0
        except OSError as e:
            raise shard_error(self.shard.name, f"could not be read ({e.strerror or e})", record=int(index),
                              offset=offset) from e
        if got != self.row_bytes:
            self.short(index, got)

    def short(self, index: int, got: int) -> None:
        raise shard_error(self.shard.name, f"read {got} of the record's {self.row_bytes} bytes: the file shrank "
                          "or changed while it was read", record=int(index), offset=int(self.offsets[index]))

    def __getitem__(self, index: int) -> np.ndarray:
        out = np.empty(self.row_shape, self.row_dtype)
        self.read_into(index, out)
        return out


def read_rows(rows: list[tuple[ReadColumn, int]], out: np.ndarray) -> None:
    """out[j] = record i of column c for (c, i) = rows[j] (same row size), in one C call
    that releases the GIL once for the whole batch (`readers._warp.read_rows`); a short or
    failed read is a `ShardError` naming the file and the record."""
    if _warp is None or not out.flags.c_contiguous or not rows:
        for j, (column, i) in enumerate(rows):
            column.read_into(i, out[j])
        return
    fds = np.fromiter((column.shard.fd for column, _ in rows), np.int32, len(rows))
    offsets = np.fromiter((column.offsets[i] for column, i in rows), np.int64, len(rows))
    try:
        bad, got = _warp.read_rows(fds, offsets, out, rows[0][0].row_bytes)
    except OSError:  # which file: read them one by one (`read_into` names it)
        for j, (column, i) in enumerate(rows):
            column.read_into(i, out[j])
        raise
    if bad >= 0:
        column, i = rows[bad]
        column.short(i, got)


def columns(layout: Layout, images: tuple[tuple[int, ...], Any], targets: tuple[tuple[int, ...], Any] | None,
            *, buf: np.ndarray | None = None, shard: OpenShard | None = None) -> tuple[_Column, Any]:
    """(image column, target column or labels) of a shard with a known `layout`: views on
    its mapping `buf`, or reads from its open file `shard`. `images` / `targets`: (row
    shape, dtype); `targets` None: a classification shard (its labels)."""
    def column(offsets: np.ndarray, row: tuple[tuple[int, ...], Any]) -> _Column:
        if shard is not None:
            return ReadColumn(shard, offsets, *row)
        return MappedColumn(buf, offsets, *row)

    first = column(layout.images, images)
    return first, (layout.labels if targets is None else column(layout.targets, targets))


def offsets_of(views: list[np.ndarray], base: np.ndarray) -> np.ndarray:
    """The byte offsets in `base` (a 1-D uint8 array over the whole file) of `views` on it."""
    start = base.ctypes.data
    return np.fromiter((v.ctypes.data - start for v in views), np.int64, len(views))


def _new_locks() -> None:  # a forked child (keras_dataset workers) must not inherit a lock a thread held
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_locks)


__all__ = ["LAYOUT_CACHE_FILES", "Layout", "MappedColumn", "OpenShard", "ReadColumn", "columns", "read_rows", "forget_all",
           "offsets_of", "recall", "remember"]
