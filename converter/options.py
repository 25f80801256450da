"""Options of a conversion, as frozen dataclasses validated once in `__post_init__`.

`OutputOptions` holds everything that changes the bytes of the output; it is stored
in the manifest and compared on every incremental run. `RunOptions` holds what only
changes how a run goes (workers, bad-input policy, what to do with changed sources).
The CLI builds both from its arguments and does nothing else with them.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from readers.choice import Choice
from readers.formats import FileFormat, check_compression
from readers.tasks import Task


class Fit(Choice):
    STRETCH = "stretch"
    COVER = "cover"
    CONTAIN = "contain"
    CROP_OR_PAD = "crop-or-pad"


class ImageFilter(Choice):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"
    BOX = "box"


class MaskEncoding(Choice):
    CLASS_MAP = "class_map"
    ONEHOT = "onehot"


class ImageEncoding(Choice):
    """How images are stored in the shards (see `readers.formats.encoding`)."""

    RAW = "raw"
    PNG = "png"
    JPEG = "jpeg"
    WEBP = "webp"

    @property
    def lossy(self) -> bool:
        return self in (ImageEncoding.JPEG, ImageEncoding.WEBP)


class UnknownColor(Choice):
    FAIL = "fail"
    IGNORE = "ignore"


class OnChange(Choice):
    KEEP = "keep"
    REPLACE = "replace"
    FAIL = "fail"


MAX_SIDE_PX = 65535
DEFAULT_SHARD_SIZE_BYTES = 128 * 1024 * 1024
#: Pillow's own decompression-bomb limit; we keep Pillow's guard and add ours on top.
DEFAULT_MAX_PIXELS = 178_956_970


def check_val_fraction(value: Any, task: Task | None) -> float | None:
    """`--val-fraction` checked once for convert, scan and preview: None, or a number
    strictly between 0 and 1 for a classification task (None: the task is not known yet)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"--val-fraction must be a number strictly between 0 and 1. Received: {value!r}")
    if task is not None and Task.parse(task, "task") is not Task.CLASSIFICATION:
        raise ValueError("--val-fraction applies to classification datasets in the flat layout "
                         f"SRC/<class>/*. Received: --val-fraction {value} with task {Task.parse(task).value!r}")
    return float(value)


def parse_size(text: str) -> tuple[int, int]:
    """Parse ``HxW`` (e.g. ``512x512``) into (height, width)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX,]\s*(\d+)\s*", str(text))
    if not m:
        raise ValueError(f"--size must look like HxW, e.g. 512x512 or 360x480. Received: {text!r}")
    h, w = int(m.group(1)), int(m.group(2))
    return h, w


def parse_bytes(text: str | int) -> int:
    """Parse a byte count such as ``128MB``, ``64MiB``, ``1G`` or ``1000000``."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"--shard-size must be a size such as 128MB or 64MiB. Received: {text!r}")
    unit = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * unit)


@dataclass(frozen=True)
class OutputOptions:
    """Everything that determines the output bytes. Stored in the manifest."""

    size: tuple[int, int]
    task: Task = Task.SEGMENTATION
    fit: Fit = Fit.STRETCH
    image_filter: ImageFilter = ImageFilter.BILINEAR
    format: FileFormat = FileFormat.TFRECORD
    compression: str | None = None  # None -> the format's default
    mask_encoding: MaskEncoding = MaskEncoding.CLASS_MAP
    color_tolerance: int = 0
    unknown_color: UnknownColor = UnknownColor.FAIL
    seed: int = 0
    #: Classification, flat layout only: the share of samples put in "val", chosen by
    #: hashing each key (stable across incremental runs). None: everything in "train".
    val_fraction: float | None = None
    #: Image storage: raw uint8 (default), or PNG / JPEG / WebP bytes encoded in the workers.
    image_encoding: ImageEncoding = ImageEncoding.RAW
    #: JPEG/WebP quality 1..100; None for raw and PNG (None with a lossy encoding -> 90).
    quality: int | None = None

    def __post_init__(self) -> None:
        size = self.size
        if isinstance(size, str):
            size = parse_size(size)
        if (
            not isinstance(size, (tuple, list))
            or len(size) != 2
            or not all(isinstance(v, int) and 0 < v <= MAX_SIDE_PX for v in size)
        ):
            raise ValueError(
                f"size must be (height, width) with 1..{MAX_SIDE_PX} pixels each. Received: {self.size!r}"
            )
        object.__setattr__(self, "size", (int(size[0]), int(size[1])))
        object.__setattr__(self, "task", Task.parse(self.task, "task"))
        object.__setattr__(self, "fit", Fit.parse(self.fit, "--fit"))
        object.__setattr__(self, "image_filter", ImageFilter.parse(self.image_filter, "--image-filter"))
        object.__setattr__(self, "format", FileFormat.parse(self.format))
        object.__setattr__(self, "compression", check_compression(self.format, self.compression))
        object.__setattr__(self, "mask_encoding", MaskEncoding.parse(self.mask_encoding, "--mask-encoding"))
        object.__setattr__(self, "unknown_color", UnknownColor.parse(self.unknown_color, "--unknown-color"))
        if not isinstance(self.color_tolerance, int) or not 0 <= self.color_tolerance <= 255:
            raise ValueError(f"--color-tolerance must be an integer in 0..255. Received: {self.color_tolerance!r}")
        if not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int. Received: {self.seed!r}")
        object.__setattr__(self, "val_fraction", check_val_fraction(self.val_fraction, self.task))
        self._check_encoding()

    def _check_encoding(self) -> None:
        from readers.formats.encoding import DEFAULT_QUALITY

        encoding = ImageEncoding.parse(self.image_encoding, "--image-encoding")
        object.__setattr__(self, "image_encoding", encoding)
        q = self.quality
        if q is not None and (isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 100):
            raise ValueError(f"--quality must be an integer in 1..100. Received: {q!r}")
        if not encoding.lossy and q is not None:
            raise ValueError(f"--quality applies to --image-encoding jpeg or webp (lossy). Received: --quality {q} "
                             f"with --image-encoding {encoding.value}; drop --quality.")
        if encoding.lossy and q is None:
            object.__setattr__(self, "quality", DEFAULT_QUALITY)

    @property
    def height(self) -> int:
        return self.size[0]

    @property
    def width(self) -> int:
        return self.size[1]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, enum.Enum):
                d[k] = v.value
        d["size"] = [self.size[0], self.size[1]]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "OutputOptions":
        d = dict(d)
        d["size"] = tuple(d["size"])
        return cls(**d)  # datasets written before image_encoding existed read as raw

    @property
    def mask_codec(self) -> str:
        from readers.formats.encoding import mask_codec_for

        return mask_codec_for(self.image_encoding.value)

    def differences(self, other: "OutputOptions") -> list[str]:
        """Human-readable list of option differences (self = requested, other = stored)."""
        mine, theirs = self.to_json(), other.to_json()
        return [
            f"{k}: dataset has {theirs.get(k)!r}, this run asks for {mine.get(k)!r}"
            for k in sorted(set(mine) | set(theirs))
            if mine.get(k) != theirs.get(k)
        ]


@dataclass(frozen=True)
class RunOptions:
    """How one run goes; none of these change the bytes of a shard."""

    workers: int = 0  # 0 -> all cores
    shard_size_bytes: int = DEFAULT_SHARD_SIZE_BYTES
    max_bad: int = 0
    max_pixels: int = DEFAULT_MAX_PIXELS
    on_change: OnChange = OnChange.KEEP
    prune: bool = False
    rebuild: bool = False
    backend: str = "local"
    scheduler: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"--workers must be an integer >= 0 (0 = all cores). Received: {self.workers!r}")
        if not isinstance(self.shard_size_bytes, int) or self.shard_size_bytes < 1:
            raise ValueError(f"--shard-size must be a positive size. Received: {self.shard_size_bytes!r}")
        if not isinstance(self.max_bad, int) or self.max_bad < 0:
            raise ValueError(f"--max-bad must be an integer >= 0. Received: {self.max_bad!r}")
        if not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise ValueError(f"--max-pixels must be a positive integer. Received: {self.max_pixels!r}")
        object.__setattr__(self, "on_change", OnChange.parse(self.on_change, "--on-change"))
        if self.backend not in ("local", "dask"):
            raise ValueError(f"--backend must be one of ['local', 'dask']. Received: {self.backend!r}")
        if self.scheduler is not None and self.backend != "dask":
            raise ValueError(
                f"--scheduler only applies with --backend dask. Received: --backend {self.backend} "
                f"--scheduler {self.scheduler}"
            )

    @property
    def effective_workers(self) -> int:
        return self.workers or (os.cpu_count() or 1)


@dataclass(frozen=True)
class SourceSpec:
    """Where the sources are: a CamVid-style root, or explicit folders."""

    root: str | None = None
    images: str | None = None
    masks: str | None = None
    split: str = "train"
    classes: str | None = None  # class_dict.csv; default root/class_dict.csv

    def __post_init__(self) -> None:
        if self.root is None and self.images is None:
            raise ValueError("Give a source folder SRC, or --images DIR (with --masks DIR and --classes CSV).")
        if self.root is not None and self.images is not None:
            raise ValueError(
                f"Give either SRC or --images/--masks, not both. Received: SRC={self.root!r}, --images={self.images!r}"
            )
        if self.masks is not None and self.images is None:
            raise ValueError(f"--masks needs --images. Received: --masks {self.masks!r} without --images")
        if not re.fullmatch(r"[A-Za-z0-9_.]+", self.split) or self.split.startswith("."):
            raise ValueError(f"--split must be a plain name such as train or val. Received: {self.split!r}")

    @property
    def base(self) -> str:
        """The folder keys are relative to."""
        return os.path.abspath(self.root if self.root is not None else self.images)
