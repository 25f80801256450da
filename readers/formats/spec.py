"""The record layout: one stored sample (`Record`), the dataset's layout read from its
manifest (`RecordSpec`), and one shard of a split (`ShardRef`). NumPy only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.manifest import Manifest, ManifestError, ShardEntry
from readers.tasks import TaskKind, task_kind

MASK_DTYPES = ("uint8", "uint16")
IMAGE_DTYPES = ("uint8", "uint16")
MASK_ENCODINGS = ("class_map", "onehot")


@dataclass(frozen=True)
class Record:
    """One sample as stored.

    Attributes:
        key: the source image path relative to SRC.
        image: array of shape (H, W, C), uint8 or uint16 (the manifest's image dtype and channels).
        mask: class map (H, W) uint8/uint16, or (H, W, C) uint8 planes when the manifest's
            mask encoding is "onehot"; None for classification.
        label: class index for classification, else None.
    """

    key: str
    image: np.ndarray
    mask: np.ndarray | None = None
    label: int | None = None


@dataclass(frozen=True)
class RecordSpec:
    """The record layout of one dataset, read from its manifest."""

    task: str
    height: int
    width: int
    channels: int
    num_classes: int
    mask_dtype: str | None
    mask_encoding: str | None
    ignore_index: int | None
    compression: str
    #: How images and masks are stored (`readers.formats.encoding`): raw bytes or encoded.
    image_codec: str = "raw"
    mask_codec: str = "raw"
    #: The stored image dtype ("uint8" or "uint16") and band names (() when not named).
    image_dtype: str = "uint8"
    bands: tuple[str, ...] = ()

    @classmethod
    def from_manifest(cls, manifest: Manifest, where: str = "manifest") -> "RecordSpec":
        h, w, c = manifest.image_shape
        image_dtype = str(manifest.image.get("dtype", "uint8"))
        if image_dtype not in IMAGE_DTYPES:
            raise ManifestError(f"{where}: image dtype must be one of {IMAGE_DTYPES}. Received: {image_dtype!r}")
        if min(h, w, c) < 1:
            raise ManifestError(f"{where}: image height, width and channels must be >= 1. Received: {(h, w, c)}")
        mask = manifest.mask
        if task_kind(manifest.task).dense:
            if mask is None:
                raise ManifestError(f"{where}: a segmentation manifest needs a 'mask' entry. Received: None")
            dtype = str(mask.get("dtype", "uint8"))
            encoding = str(mask.get("encoding", "class_map"))
            if dtype not in MASK_DTYPES:
                raise ManifestError(f"{where}: mask dtype must be one of {MASK_DTYPES}. Received: {dtype!r}")
            if encoding not in MASK_ENCODINGS:
                raise ManifestError(f"{where}: mask encoding must be one of {MASK_ENCODINGS}. Received: {encoding!r}")
            if encoding == "onehot" and dtype != "uint8":
                raise ManifestError(f"{where}: one-hot masks are stored as uint8. Received: mask dtype {dtype!r}")
            ignore = mask.get("ignore_index", 255)
            ignore = int(ignore) if ignore is not None else None
            if ignore is not None and ignore < manifest.num_classes:
                raise ManifestError(
                    f"{where}: mask ignore_index must be >= the number of classes "
                    f"({manifest.num_classes}) so it never collides with a class. Received: {ignore}"
                )
        else:
            dtype = encoding = ignore = None
        image_codec, mask_codec = _codecs(manifest, where)
        return cls(manifest.task, h, w, c, manifest.num_classes, dtype, encoding, ignore, manifest.compression,
                   image_codec, mask_codec, image_dtype, tuple(manifest.image.get("bands") or ()))

    @property
    def encoded(self) -> bool:
        """Whether images or masks are stored encoded (PNG/JPEG/WebP) rather than raw."""
        return self.image_codec != "raw" or self.mask_codec != "raw"

    @property
    def kind(self) -> TaskKind:
        """The task's strategy (what y is, where it is stored)."""
        return task_kind(self.task)

    @property
    def segmentation(self) -> bool:
        return self.kind.dense

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)

    @property
    def mask_shape(self) -> tuple[int, ...]:
        if self.mask_encoding == "onehot":
            return (self.height, self.width, self.num_classes)
        return (self.height, self.width)

    @property
    def image_np_dtype(self) -> np.dtype:
        """The stored image dtype (little-endian uint16 on disk)."""
        return np.dtype("<u2") if self.image_dtype == "uint16" else np.dtype(np.uint8)

    @property
    def image_max(self) -> int:
        """The largest value of the image dtype: `normalize=True` divides by it."""
        return 65535 if self.image_dtype == "uint16" else 255

    @property
    def image_bytes(self) -> int:
        """Bytes of one stored raw image."""
        return self.height * self.width * self.channels * self.image_np_dtype.itemsize

    @property
    def mask_np_dtype(self) -> np.dtype:
        return np.dtype("<u2") if self.mask_dtype == "uint16" else np.dtype(np.uint8)


def _codecs(manifest: Manifest, where: str) -> tuple[str, str]:
    """(image codec, mask codec) from the manifest; absent means raw (datasets written before encodings)."""
    from readers.formats import IMAGE_CODECS, MASK_CODECS, check_choice

    try:
        image = check_choice(str(manifest.image.get("codec", "raw")), IMAGE_CODECS, "image codec")
        mask = check_choice(str((manifest.mask or {}).get("codec", "raw")), MASK_CODECS, "mask codec")
    except ValueError as e:
        raise ManifestError(f"{where}: {e}") from e
    rgb8 = manifest.image_shape[2] == 3 and manifest.image.get("dtype", "uint8") == "uint8"
    if image != "raw" and not rgb8 and not (image == "png" and manifest.image_shape[2] == 1):
        raise ManifestError(f"{where}: encoded images are 8-bit RGB (PNG: also one channel of 8 or 16 bits). "
                            f"Received: {image} {manifest.image_shape} {manifest.image.get('dtype', 'uint8')}")
    return image, mask


@dataclass(frozen=True)
class ShardRef:
    """One shard of a split: its absolute path (or URL), its manifest entry and its position.

    `source`: for a shard of a bucket dataset, its `readers.remote.RemoteFile` (how its
    bytes are read: `readers.sources.open_source`); None for a local file at `path`.
    """

    path: str
    entry: ShardEntry
    position: int
    source: Any = None

    @property
    def records(self) -> int:
        return self.entry.records




def y_signature(spec: RecordSpec, *, batched: bool = True) -> tuple[Any, ...]:
    """Shape (with a leading None when batched) and dtype name of the compact target."""
    lead = (None,) if batched else ()
    if not spec.segmentation:
        return lead, "int64"
    return lead + spec.mask_shape, spec.mask_dtype or "uint8"


__all__ = ["IMAGE_DTYPES", "MASK_DTYPES", "MASK_ENCODINGS", "Record", "RecordSpec", "ShardRef", "y_signature"]
