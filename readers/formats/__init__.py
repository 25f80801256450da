"""Shard file formats: one adapter module per format, registered by `FileFormat`.

Record schema shared by every format (see README "Shard format"):

* image: the manifest's ``image.dtype`` (uint8, or uint16 little-endian) and ``image.channels``
  (1..16; 3: RGB), shape (H, W, C), row-major (docs/IMAGES.md)
* mask (segmentation): class map, shape (H, W), uint8 (uint16 when more than 255
  classes, little-endian), ignore index in the manifest's ``mask.ignore_index``;
  or with ``mask.encoding == "onehot"`` uint8 planes of shape (H, W, C)
* label (classification): int64 class index
* key: the source image path relative to SRC, '/'-separated

TFRecord: one ``tf.train.Example`` per sample with features ``image`` (bytes, raw),
``mask`` (bytes, raw) or ``label`` (int64), ``height`` (int64), ``width`` (int64),
``key`` (bytes, UTF-8).

NPZ: one ``.npz`` per shard holding ``images`` (N,H,W,C) uint8/uint16, ``masks`` (N,H,W)
or ``labels`` (N,) int64, and ``keys`` (N,) unicode; never pickled objects.

Encoded storage (manifest ``image.codec`` png/jpeg/webp, ``mask.codec`` png; see
`readers.formats.encoding`): TFRecord ``image``/``mask`` features hold the PNG/JPEG/
WebP bytes; NPZ replaces ``images``/``masks`` with ``image_bytes`` (uint8, all records
concatenated) + ``image_offsets`` (int64, N+1) and ``mask_bytes`` + ``mask_offsets``.
"""

from __future__ import annotations

from readers.choice import Choice


class FileFormat(Choice):
    TFRECORD = "tfrecord"
    NPZ = "npz"

    @classmethod
    def _argument(cls) -> str:
        return "format"


#: Allowed compressions per format; the first is the default.
COMPRESSIONS = {
    FileFormat.TFRECORD: ("none", "gzip"),
    FileFormat.NPZ: ("deflate", "none"),
}

#: File suffix per format.
SUFFIXES = {FileFormat.TFRECORD: ".tfrecord", FileFormat.NPZ: ".npz"}

FEATURE_IMAGE = "image"
FEATURE_MASK = "mask"
FEATURE_LABEL = "label"
FEATURE_HEIGHT = "height"
FEATURE_WIDTH = "width"
FEATURE_KEY = "key"

NPZ_IMAGES = "images"
NPZ_MASKS = "masks"
NPZ_LABELS = "labels"
NPZ_KEYS = "keys"
#: How image / mask bytes may be stored (manifest ``image.codec`` / ``mask.codec``; see
#: `readers.formats.encoding`): raw arrays, or PNG / JPEG / WebP files.
IMAGE_CODECS = ("raw", "png", "jpeg", "webp")
MASK_CODECS = ("raw", "png")

#: Encoded records (see `readers.formats.encoding`): concatenated bytes + int64 offsets (N+1).
NPZ_IMAGE_BYTES = "image_bytes"
NPZ_IMAGE_OFFSETS = "image_offsets"
NPZ_MASK_BYTES = "mask_bytes"
NPZ_MASK_OFFSETS = "mask_offsets"


def default_compression(fmt: "str | FileFormat") -> str:
    return COMPRESSIONS[FileFormat.parse(fmt)][0]


def check_compression(fmt: "str | FileFormat", compression: "str | None") -> str:
    fmt = FileFormat.parse(fmt)
    if compression is None:
        return COMPRESSIONS[fmt][0]
    if compression not in COMPRESSIONS[fmt]:
        raise ValueError(
            f"compression for format {fmt.value!r} must be one of {list(COMPRESSIONS[fmt])}. "
            f"Received: {compression!r}"
        )
    return compression


def check_choice(value: object, allowed: "tuple[str, ...] | list[str]", what: str) -> str:
    """`value` when it is one of `allowed`, else a ValueError naming `what` (codecs in the manifest)."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{what} must be one of {list(allowed)}. Received: {value!r}")
    return value
