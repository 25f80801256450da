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

from converter.imagekind import ImageKind
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


class ExifMode(Choice):
    """EXIF orientation of segmentation images (`converter.transform.exif`)."""

    AUTO = "auto"
    APPLY = "apply"
    IGNORE = "ignore"


class OnChange(Choice):
    KEEP = "keep"
    REPLACE = "replace"
    FAIL = "fail"


class RleOrder(Choice):
    """Which way RLE CSV runs go (`converter.discover.annotations.rlecsv`)."""

    COLUMNS = "columns"  # the Kaggle convention: down the columns first (1-based)
    ROWS = "rows"  # along the rows (Carvana's train_masks.csv: the kernels' `mask.flatten()`)


class Overlap(Choice):
    """Where shapes of an annotation overlap (`converter.discover.annotations`)."""

    TOOL = "tool"  # the producing tool's order: later on top (CVAT: z_order, then document order)
    FIRST = "first"  # the first shape drawn keeps its pixels
    IGNORE = "ignore"  # pixels claimed by two classes go to the ignore index


@dataclass(frozen=True)
class AnnotationOptions:
    """How annotation files (COCO, YOLO, LabelMe, CVAT, RLE CSV) become class maps."""

    overlap: Overlap = Overlap.TOOL
    keep_crowd: bool = False  # COCO iscrowd regions: their class (True) or the ignore index (False)
    rle_class: str | None = None  # RLE CSV without a ClassId column: the class name of its runs
    rle_order: RleOrder = RleOrder.COLUMNS  # RLE CSV runs: down the columns (Kaggle) or along the rows

    def __post_init__(self) -> None:
        object.__setattr__(self, "overlap", Overlap.parse(self.overlap, "--overlap"))
        object.__setattr__(self, "rle_order", RleOrder.parse(self.rle_order, "--rle-order"))
        if not isinstance(self.keep_crowd, bool):
            raise TypeError(f"--keep-crowd must be True or False. Received: {self.keep_crowd!r}")
        if self.rle_class is not None and not str(self.rle_class).strip():
            raise ValueError(f"--rle-class must be a class name. Received: {self.rle_class!r}")


class MaskSemantics(Choice):
    """How mask pixels become classes (`converter.transform.semantics`)."""

    COLOUR = "colour"  # RGB colour -> class via class_dict.csv
    INDEX = "index"  # the pixel value (grey level, palette index, 16-bit value) is the class id
    BINARY = "binary"  # {0,255} or {0,1} (JPEG: thresholded) -> background / foreground


MAX_SIDE_PX = 65535
#: Layouts `converter.discover.layouts` knows (`--layout NAME`).
LAYOUT_NAMES = ("camvid", "voc", "cityscapes", "ade", "mmseg", "unet", "explicit", "classfolders", "content", "spec")
#: Annotation formats (`converter.discover.annotations`), also `--layout NAME`.
ANNOTATION_FORMATS = ("coco", "yolo", "labelme", "cvat", "instances", "rlecsv")
LAYOUT_NAMES += ANNOTATION_FORMATS
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
    #: Segmentation: mask semantics, ignore values and label map (`LabelOptions`).
    labels: "LabelOptions | None" = None
    #: The stored image kind (`converter.imagekind`): dtype, channels, bands; None: uint8 RGB.
    image_kind: ImageKind | None = None
    #: Segmentation: EXIF orientation decided from the mask's size (auto), or applied / ignored.
    exif: ExifMode = ExifMode.AUTO

    def __post_init__(self) -> None:
        kind = self.image_kind
        if isinstance(kind, Mapping):
            kind = ImageKind.from_json(kind)
        if kind is not None and not isinstance(kind, ImageKind):
            raise TypeError(f"image_kind must be an ImageKind. Received: {self.image_kind!r}")
        object.__setattr__(self, "image_kind", kind if kind is not None else ImageKind())
        labels = self.labels
        if isinstance(labels, Mapping):
            labels = LabelOptions.from_json(labels)
        if labels is None:
            labels = LabelOptions()
        if not isinstance(labels, LabelOptions):
            raise TypeError(f"labels must be a LabelOptions. Received: {self.labels!r}")
        object.__setattr__(self, "labels", labels)
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
        object.__setattr__(self, "exif", ExifMode.parse(self.exif, "--exif"))
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
        d["labels"] = self.labels.to_json()  # type: ignore[union-attr]
        kind = self.image_kind
        d.pop("image_kind")
        if not kind.is_default:  # type: ignore[union-attr]  # uint8 RGB: as every earlier version wrote
            d["image_kind"] = kind.to_json()  # type: ignore[union-attr]
        if self.exif is ExifMode.AUTO:
            d.pop("exif")  # absent: auto, as every earlier version decided (by sizes)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "OutputOptions":
        d = dict(d)
        d["size"] = tuple(d["size"])
        if "labels" not in d and d.get("task", Task.SEGMENTATION.value) == Task.SEGMENTATION.value:
            d["labels"] = LabelOptions.colour_default()  # written before mask semantics existed
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
    #: fsspec options of an s3:// or gs:// OUT (``--storage-option KEY=VALUE``), as (key, value) pairs
    storage_options: tuple[tuple[str, Any], ...] = ()
    #: where a run into a bucket stages its files (None: the system's temporary folder)
    staging_dir: str | None = None
    #: how long the lock object of a bucket OUT stays valid unless renewed (renewed every third of it)
    lock_ttl_seconds: float = 300.0

    def __post_init__(self) -> None:
        if isinstance(self.storage_options, Mapping):
            object.__setattr__(self, "storage_options", tuple(sorted(self.storage_options.items())))
        if not isinstance(self.storage_options, tuple) or not all(
                isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in self.storage_options):
            raise TypeError("storage_options must be a mapping or (key, value) pairs (from --storage-option KEY=VALUE). "
                            f"Received: {self.storage_options!r}")
        if (isinstance(self.lock_ttl_seconds, bool) or not isinstance(self.lock_ttl_seconds, (int, float))
                or not 1 <= self.lock_ttl_seconds <= 86400):
            raise ValueError(f"--lock-ttl must be a number of seconds from 1 to 86400. Received: {self.lock_ttl_seconds!r}")
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


_SPLIT_NAME = re.compile(r"[A-Za-z0-9_.]+")


def check_split_name(name: Any, argument: str = "--split") -> str:
    """A split name: letters, digits, '_' and '.', not starting with '.'."""
    if not isinstance(name, str) or not _SPLIT_NAME.fullmatch(name) or name.startswith("."):
        raise ValueError(f"{argument} must be a plain split name such as train or val. Received: {name!r}")
    return name


@dataclass(frozen=True)
class SplitSource:
    """One folder pair of a split: images below `images`, their masks below `masks`.

    A name is ``<prefix><base><suffix>.<ext>`` on each side (`image_prefix`, `image_suffix`,
    `mask_prefix`, `mask_suffix`; a suffix None: found from the names). `split_list`: a file
    listing the bases this split keeps. `SourceSpec.sources` holds several (one run, several
    splits: `--spec FILE` or repeated `--images/--masks/--split`; `converter.discover.spec_file`).
    """

    split: str
    images: str
    masks: str | None = None
    image_prefix: str = ""
    image_suffix: str | None = None
    mask_prefix: str = ""
    mask_suffix: str | None = None
    split_list: str | None = None
    recursive: bool = True  # False: only the files directly in each folder (no mirrored sub-folders)
    skip_unpaired: bool = False  # images without a mask are skipped, not bad inputs (VOC's JPEGImages)
    #: Band folders in channel order (the first is `images`): one single-band file per band
    #: (`converter.discover.bands`); () for one image file per sample.
    bands: tuple[str, ...] = ()
    annotations: str | None = None  # an annotation file or folder instead of masks (`converter.discover.annotations`)
    annotation_format: str | None = None  # its format: one of `ANNOTATION_FORMATS`

    def __post_init__(self) -> None:
        check_split_name(self.split, "split")
        bands = self.bands
        if isinstance(bands, (str, os.PathLike)) or not all(isinstance(b, (str, os.PathLike)) and os.fspath(b)
                                                             for b in bands):
            raise ValueError(f"bands of split {self.split!r} must be a list of folder paths. Received: {bands!r}")
        object.__setattr__(self, "bands", tuple(os.fspath(b) for b in bands))
        if (self.annotations is None) != (self.annotation_format is None) or (
                self.annotation_format is not None and self.annotation_format not in ANNOTATION_FORMATS):
            raise ValueError(f"annotations of split {self.split!r} need their format, one of "
                             f"{list(ANNOTATION_FORMATS)}. Received: annotations={self.annotations!r}, "
                             f"format={self.annotation_format!r}")
        for name in ("recursive", "skip_unpaired"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} of split {self.split!r} must be true or false. "
                                f"Received: {getattr(self, name)!r}")
        for name in ("images", "masks", "split_list", "annotations"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (str, os.PathLike)) or not os.fspath(value)):
                raise ValueError(f"{name} of split {self.split!r} must be a folder path. Received: {value!r}")
            if value is not None:
                object.__setattr__(self, name, os.fspath(value))
        for name in ("image_prefix", "image_suffix", "mask_prefix", "mask_suffix"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or "/" in value or os.sep in value):
                raise ValueError(f"{name} of split {self.split!r} must be a name token without '/'. "
                                 f"Received: {value!r}")


@dataclass(frozen=True)
class SourceSpec:
    """Where the sources are: a CamVid-style root, or explicit folders.

    Any location may be a local path, a ``file://`` URL (made a plain path here) or an
    ``s3://``/``gs://`` URL; `storage_options` (``--storage-option KEY=VALUE``, as
    (key, value) pairs or a mapping) reach every bucket the sources name.
    """

    root: str | None = None
    images: str | None = None
    masks: str | None = None
    split: str = "train"
    classes: str | None = None  # class_dict.csv; default root/class_dict.csv
    layout: str | None = None  # force a layout (`LAYOUT_NAMES`); None: detected
    image_suffix: str | None = None  # name = <stem><image_suffix>.<ext>; None: found from the names
    mask_suffix: str | None = None  # name = <stem><mask_suffix>.<ext>
    split_lists: tuple[tuple[str, str], ...] = ()  # (split name, list file): one stem per line
    storage_options: Any = ()  # fsspec options for s3:// / gs:// sources: frozen (key, value) pairs
    #: Several folder pairs in one run (a source spec file, or repeated --images/--masks/--split);
    #: their folders are relative to `root` when it is given.
    sources: tuple[SplitSource, ...] = ()
    #: The source spec this run follows, as canonical JSON (recorded in the manifest); None: none.
    spec_text: str | None = None
    spec_file: str | None = None  # the file it was read from, as given (scan's command repeats it)
    annotations: AnnotationOptions = AnnotationOptions()  # annotation files (COCO, YOLO, ...): rules

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(self.sources))
        if not all(isinstance(s, SplitSource) for s in self.sources):
            raise TypeError(f"sources must be SplitSource objects. Received: {self.sources!r}")
        self._normalise_locations()
        if self.layout is not None and self.layout not in LAYOUT_NAMES:
            raise ValueError(f"--layout must be one of {list(LAYOUT_NAMES)}. Received: {self.layout!r}")
        lists = tuple((str(n), os.fspath(f)) for n, f in self.split_lists)
        for name, _ in lists:
            if not re.fullmatch(r"[A-Za-z0-9_.]+", name) or name.startswith("."):
                raise ValueError(f"--split-list NAME=FILE: NAME must be a plain split name such as train. "
                                 f"Received: {name!r}")
        if len({n for n, _ in lists}) != len(lists):
            raise ValueError(f"--split-list names a split twice. Received: {[n for n, _ in lists]}")
        object.__setattr__(self, "split_lists", lists)
        if self.sources and self.images is not None:
            raise ValueError(f"Give either folder pairs (a spec, repeated --images/--masks/--split) or one --images "
                             f"folder, not both. Received: --images {self.images!r}")
        if self.root is None and self.images is None and not self.sources:
            raise ValueError("Give a source folder SRC, or --images DIR (with --masks DIR and --classes CSV).")
        if self.root is not None and self.images is not None:
            raise ValueError(
                f"Give either SRC or --images/--masks, not both. Received: SRC={self.root!r}, --images={self.images!r}"
            )
        if self.masks is not None and self.images is None:
            raise ValueError(f"--masks needs --images. Received: --masks {self.masks!r} without --images")
        check_split_name(self.split)

    def _normalise_locations(self) -> None:
        """file:// -> plain path; unknown URL schemes refused; storage options frozen (hashable)."""
        from readers.storage.url import StorageURLError, freeze_storage_options, is_remote, local_path

        def fix(value: Any, argument: str) -> Any:
            if value is None:
                return None
            try:
                is_remote(value)
                return local_path(os.fspath(value))
            except StorageURLError as e:
                raise StorageURLError(f"{argument}: {e}") from e

        for name, argument in (("root", "SRC"), ("images", "--images"), ("masks", "--masks"),
                               ("classes", "--classes")):
            object.__setattr__(self, name, fix(getattr(self, name), argument))
        object.__setattr__(self, "split_lists", tuple((n, fix(f, "--split-list")) for n, f in self.split_lists))
        object.__setattr__(self, "storage_options", freeze_storage_options(self.storage_options))

    @property
    def base(self) -> str:
        """The folder keys are relative to (a URL without its trailing slash for object stores)."""
        from converter.discover.files import absolute

        if self.root is None and self.sources:
            paths = [absolute(s.images) for s in self.sources]
            if any("://" in p for p in paths):  # URLs: the common prefix up to a '/'
                common = os.path.commonprefix(paths)
                return common if all(p == common for p in paths) else common[:common.rfind("/")]
            return absolute(os.path.commonpath(paths))
        return absolute(self.root if self.root is not None else self.images)  # type: ignore[arg-type]

    @property
    def remote(self) -> bool:
        """Whether any source location is an object-store URL."""
        from readers.storage.url import is_remote

        return any(is_remote(p) for p in (self.root, self.images, self.masks, self.classes, *self._source_paths())
                   if p is not None)

    def _source_paths(self) -> list[str]:
        return [p for s in self.sources for p in (s.images, s.masks, s.split_list) if p is not None]

    def use_storage(self) -> None:
        """Register the storage options for every bucket the sources name (`converter.discover.files`)."""
        from converter.discover.files import use_storage_options

        for location in (self.root, self.images, self.masks, self.classes, *(f for _, f in self.split_lists),
                         *self._source_paths()):
            use_storage_options(location, self.storage_options)


MAX_MASK_VALUE = 65535


def _check_value(v: Any, argument: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_MASK_VALUE:
        raise ValueError(f"{argument} must be a mask value 0..{MAX_MASK_VALUE}. Received: {v!r}")
    return int(v)


@dataclass(frozen=True)
class LabelOptions:
    """How mask pixels become classes; part of `OutputOptions` (so stored in the manifest).

    None means "the layout's default" (`converter.discover.labels.resolve_labels` fills
    it in before a run; the manifest stores the resolved values, so an incremental run
    whose mapping differs is refused without --rebuild). Order of the mapping of a value
    v (index and binary semantics): v in `ignore_values` -> ignore; else through
    `label_map` (unlisted -> ignore); else `reduce_zero_label` (0 -> ignore, v -> v-1);
    a result >= the number of classes is an unknown value.
    """

    semantics: MaskSemantics | None = None
    ignore_values: tuple[int, ...] | None = None
    reduce_zero_label: bool | None = None
    label_map: tuple[tuple[int, int], ...] | None = None  # (source value, class id)
    label_map_file: str | None = None  # CLI input: a CSV or "cityscapes"; resolved into label_map
    num_classes: int | None = None  # index masks without a class table: class_0..class_{K-1}
    binary_threshold: int = 128  # binary masks with levels above 1: v >= threshold is foreground

    def __post_init__(self) -> None:
        if self.semantics is not None:
            object.__setattr__(self, "semantics", MaskSemantics.parse(self.semantics, "--mask-semantics"))
        if self.ignore_values is not None:
            values = tuple(sorted({_check_value(v, "--ignore-index") for v in self.ignore_values}))
            object.__setattr__(self, "ignore_values", values)
        if self.reduce_zero_label is not None and not isinstance(self.reduce_zero_label, bool):
            raise TypeError(f"--reduce-zero-label must be a bool. Received: {self.reduce_zero_label!r}")
        if self.label_map is not None:
            pairs = tuple(sorted((_check_value(int(a), "--label-map source id"), int(b)) for a, b in self.label_map))
            if len({a for a, _ in pairs}) != len(pairs):
                raise ValueError(f"--label-map lists a source id twice. Received: {pairs!r}")
            if any(b < 0 or b > 65533 for _, b in pairs):
                raise ValueError(f"--label-map class ids must be 0..65533. Received: {pairs!r}")
            object.__setattr__(self, "label_map", pairs)
        if self.reduce_zero_label and (self.label_map is not None or self.label_map_file is not None):
            raise ValueError("--reduce-zero-label and --label-map both renumber mask values; give one of them "
                             "(a label map can send 0 to the ignore index itself).")
        if self.num_classes is not None and (isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int)
                                             or not 1 <= self.num_classes <= 65534):
            raise ValueError(f"--num-classes must be an integer 1..65534. Received: {self.num_classes!r}")
        if isinstance(self.binary_threshold, bool) or not isinstance(self.binary_threshold, int) \
                or not 1 <= self.binary_threshold <= 65535:
            raise ValueError(f"--binary-threshold must be an integer 1..65535. Received: {self.binary_threshold!r}")
        if self.semantics is MaskSemantics.COLOUR and (self.label_map is not None or self.label_map_file
                                                       or self.reduce_zero_label or self.ignore_values):
            raise ValueError("--ignore-index, --reduce-zero-label and --label-map apply to index and binary masks "
                             "(pixel values), not to colour masks; use --mask-semantics index, or map colours "
                             "with class_dict.csv and --unknown-color ignore.")

    def summary(self) -> str:
        """One line for people: 'index, ignore 255, label map of 19 ids'."""
        parts = [self.semantics.value if self.semantics is not None else "default"]
        if self.ignore_values:
            parts.append("ignore " + " ".join(map(str, self.ignore_values)))
        if self.reduce_zero_label:
            parts.append("reduce-zero-label")
        if self.label_map is not None:
            parts.append(f"label map of {len(self.label_map)} ids")
        if self.num_classes is not None:
            parts.append(f"{self.num_classes} classes")
        if self.semantics is MaskSemantics.BINARY:
            parts.append(f"threshold {self.binary_threshold}")
        return ", ".join(parts)

    @classmethod
    def colour_default(cls) -> "LabelOptions":
        """The resolved options of a colour-mask dataset (also: manifests written before they existed)."""
        return cls(MaskSemantics.COLOUR, (), False, None, None, None)

    def to_json(self) -> dict[str, Any]:
        return {
            "semantics": self.semantics.value if self.semantics is not None else None,
            "ignore_values": list(self.ignore_values) if self.ignore_values is not None else None,
            "reduce_zero_label": self.reduce_zero_label,
            "label_map": [list(p) for p in self.label_map] if self.label_map is not None else None,
            "label_map_file": self.label_map_file,
            "num_classes": self.num_classes,
            "binary_threshold": self.binary_threshold,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "LabelOptions":
        d = dict(d)
        if d.get("ignore_values") is not None:
            d["ignore_values"] = tuple(d["ignore_values"])
        if d.get("label_map") is not None:
            d["label_map"] = tuple(tuple(p) for p in d["label_map"])
        return cls(**d)
