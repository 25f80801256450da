"""NPZ shard encoder: one `.npz` per shard, arrays stacked per shard.

Written with `zipfile` directly (not `np.savez`) so that every member carries a fixed
timestamp: the same samples give the same bytes. Members are `images`, `masks` or
`labels`, and `keys` (a fixed-width unicode array, never a pickled object array).
"""

from __future__ import annotations

import zipfile
from typing import IO

import numpy as np

from readers.formats.encoder import SampleArrays, ShardEncoder
from readers.formats import NPZ_IMAGES, NPZ_KEYS, NPZ_LABELS, NPZ_MASKS, SUFFIXES, FileFormat

ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
#: zlib level for compressed shards: level 1 keeps most of the size win of level 6 on
#: image bytes at a fraction of the time.
DEFLATE_LEVEL = 1


def write_npz_member(zf: zipfile.ZipFile, name: str, array: np.ndarray, compress: bool) -> None:
    info = zipfile.ZipInfo(name + ".npy", date_time=ZIP_EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    if compress:
        # `compress_level` is public from Python 3.13; `_compresslevel` is what 3.10-3.12 read.
        setattr(info, "compress_level" if hasattr(zipfile.ZipInfo, "compress_level") else "_compresslevel",
                DEFLATE_LEVEL)
    info.external_attr = 0o644 << 16
    with zf.open(info, "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


class NpzEncoder(ShardEncoder):
    suffix = SUFFIXES[FileFormat.NPZ]

    def __init__(self, fileobj: IO[bytes], *, compression: str, capacity: int) -> None:
        super().__init__(fileobj, compression=compression, capacity=capacity)
        self._images: np.ndarray | None = None
        self._masks: np.ndarray | None = None
        self._labels: list[int] = []
        self._keys: list[str] = []

    def add(self, sample: SampleArrays) -> None:
        i = len(self._keys)
        if self._images is None:  # preallocate once: the shard's size is planned
            self._images = np.empty((self.capacity,) + sample.image.shape, np.uint8)
            if sample.mask is not None:
                self._masks = np.empty((self.capacity,) + sample.mask.shape, sample.mask.dtype)
        if i >= self.capacity:
            raise ValueError(f"NPZ shard holds at most {self.capacity} samples (its planned size). Received: one more")
        self._images[i] = sample.image
        if self._masks is not None:
            self._masks[i] = sample.mask
        if sample.label is not None:
            self._labels.append(int(sample.label))
        self._keys.append(sample.key)

    def finish(self) -> None:
        n = len(self._keys)
        compress = self.compression != "none"
        with zipfile.ZipFile(self.fileobj, "w", allowZip64=True) as zf:
            if self._images is not None:
                write_npz_member(zf, NPZ_IMAGES, self._images[:n], compress)
            if self._masks is not None:
                write_npz_member(zf, NPZ_MASKS, self._masks[:n], compress)
            if self._labels:
                write_npz_member(zf, NPZ_LABELS, np.asarray(self._labels, dtype=np.int64), compress)
            write_npz_member(zf, NPZ_KEYS, np.asarray(self._keys, dtype=np.str_), compress)
