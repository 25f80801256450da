"""NPZ shard encoder: one `.npz` per shard, arrays stacked per shard.

Written with `zipfile` directly (not `np.savez`) so that every member carries a fixed
timestamp: the same samples give the same bytes. Members are `images`, `masks` or
`labels`, and `keys` (a fixed-width unicode array, never a pickled object array).

Encoded samples (``--image-encoding png|jpeg|webp``, see `converter.write.encoded`)
are stored object-free as one byte string per field plus offsets: `image_bytes`
(uint8, every record's encoded image concatenated) and `image_offsets` (int64, N+1:
record i is ``image_bytes[offsets[i]:offsets[i+1]]``), likewise `mask_bytes` and
`mask_offsets` for PNG masks. Those two byte members are always stored (deflating
JPEG/PNG/WebP bytes saves next to nothing and would cost a full inflate per read);
offsets, labels and keys follow --compression.
"""

from __future__ import annotations

import zipfile
from typing import IO

import numpy as np

from readers.formats import (
    NPZ_IMAGE_BYTES,
    NPZ_IMAGE_OFFSETS,
    NPZ_IMAGES,
    NPZ_KEYS,
    NPZ_LABELS,
    NPZ_MASK_BYTES,
    NPZ_MASK_OFFSETS,
    NPZ_MASKS,
    SUFFIXES,
    FileFormat,
)
from readers.formats.encoder import SampleArrays, ShardEncoder

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
        self._encoded: dict[str, list[bytes]] = {}  # "image"/"mask" -> stored bytes per record

    def _add_encoded(self, name: str, value: object, i: int) -> bool:
        """Collect `value` when it is stored bytes; False when it is an array."""
        is_bytes = isinstance(value, (bytes, bytearray, memoryview))
        parts = self._encoded.get(name)
        if (parts is not None) != is_bytes and i > 0:
            raise ValueError(f"NPZ shard mixes encoded and raw {name}s. Received: record {i} "
                             f"{'encoded' if is_bytes else 'raw'}, earlier ones the other way")
        if is_bytes:
            self._encoded.setdefault(name, []).append(bytes(value))  # type: ignore[arg-type]
        return is_bytes

    def add(self, sample: SampleArrays) -> None:
        i = len(self._keys)
        if i >= self.capacity:
            raise ValueError(f"NPZ shard holds at most {self.capacity} samples (its planned size). Received: one more")
        image_encoded = self._add_encoded("image", sample.image, i)
        mask_encoded = sample.mask is not None and self._add_encoded("mask", sample.mask, i)
        if image_encoded or mask_encoded:
            if not image_encoded or (sample.mask is not None and not mask_encoded):
                raise ValueError("NPZ shard: an encoded image needs an encoded mask and the other way round. "
                                 f"Received: image {'encoded' if image_encoded else 'raw'}, mask "
                                 f"{'encoded' if mask_encoded else 'raw'}")
            if sample.label is not None:
                self._labels.append(int(sample.label))
            self._keys.append(sample.key)
            return
        if self._images is None:  # preallocate once: the shard's size is planned
            self._images = np.empty((self.capacity,) + sample.image.shape, sample.image.dtype.newbyteorder("<"))
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
            for name, (data_member, offsets_member) in (("image", (NPZ_IMAGE_BYTES, NPZ_IMAGE_OFFSETS)),
                                                        ("mask", (NPZ_MASK_BYTES, NPZ_MASK_OFFSETS))):
                parts = self._encoded.get(name)
                if parts is not None:
                    offsets = np.zeros(len(parts) + 1, np.int64)
                    np.cumsum([len(p) for p in parts], out=offsets[1:])
                    write_npz_member(zf, data_member, np.frombuffer(b"".join(parts), np.uint8), False)
                    write_npz_member(zf, offsets_member, offsets, compress)
            if self._images is not None:
                write_npz_member(zf, NPZ_IMAGES, self._images[:n], compress)
            if self._masks is not None:
                write_npz_member(zf, NPZ_MASKS, self._masks[:n], compress)
            if self._labels:
                write_npz_member(zf, NPZ_LABELS, np.asarray(self._labels, dtype=np.int64), compress)
            write_npz_member(zf, NPZ_KEYS, np.asarray(self._keys, dtype=np.str_), compress)
