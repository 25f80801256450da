"""What every format adapter shares: the `Record`, the record layout read from the
manifest, the pipeline options, the adapter base class, and the (x, y) expansion.

NumPy only at import time; TensorFlow is imported inside the functions that build
graphs.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import logging
import os
import sys
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from readers.errors import ShardError, describe, shard_error
from readers.formats import FileFormat
from readers.manifest import Manifest, ManifestError, ShardEntry

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

logger = logging.getLogger(__name__)

#: Default bound on the bytes held by a shuffle buffer (serialized or decoded records).
SHUFFLE_BUFFER_BYTES = 256 * 1024 * 1024

MASK_DTYPES = ("uint8", "uint16")
MASK_ENCODINGS = ("class_map", "onehot")


@dataclass(frozen=True)
class Record:
    """One sample as stored.

    Attributes:
        key: the source image path relative to SRC.
        image: uint8 array of shape (H, W, 3).
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

    @classmethod
    def from_manifest(cls, manifest: Manifest, where: str = "manifest") -> "RecordSpec":
        h, w, c = manifest.image_shape
        if str(manifest.image.get("dtype", "uint8")) != "uint8":
            raise ManifestError(f"{where}: image dtype must be 'uint8'. Received: {manifest.image.get('dtype')!r}")
        if min(h, w, c) < 1:
            raise ManifestError(f"{where}: image height, width and channels must be >= 1. Received: {(h, w, c)}")
        mask = manifest.mask
        if manifest.task == "segmentation":
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
        return cls(manifest.task, h, w, c, manifest.num_classes, dtype, encoding, ignore, manifest.compression)

    @property
    def segmentation(self) -> bool:
        return self.task == "segmentation"

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)

    @property
    def mask_shape(self) -> tuple[int, ...]:
        if self.mask_encoding == "onehot":
            return (self.height, self.width, self.num_classes)
        return (self.height, self.width)

    @property
    def mask_np_dtype(self) -> np.dtype:
        return np.dtype("<u2") if self.mask_dtype == "uint16" else np.dtype(np.uint8)


@dataclass(frozen=True)
class ShardRef:
    """One shard of a split: its absolute path, its manifest entry and its position."""

    path: str
    entry: ShardEntry
    position: int

    @property
    def records(self) -> int:
        return self.entry.records


@dataclass(frozen=True)
class PipelineOptions:
    """Options of one `tf.data` / PyDataset pipeline, checked once."""

    batch_size: int
    shuffle: bool = True
    seed: int | None = None
    one_hot: bool = True
    normalize: bool = True
    drop_remainder: bool = False
    shuffle_buffer: int | None = None  # records; None = bounded by SHUFFLE_BUFFER_BYTES
    #: (num, index): keep every num-th record starting at index, over all shards in order
    #: (the fallback when there are fewer shards than input pipelines).
    record_shard: tuple[int, int] | None = None
    #: The epoch of the first pass and the batch it starts at (`Dataset.tf_dataset`).
    epoch: int = 0
    start_step: int = 0
    #: A `readers.augment.Augment`, or None; "host": applied in the pipeline, "device":
    #: handed over as ((uint8 images, params), targets) for `readers.device.augment_batch`.
    augment: Any = None
    augment_on: str = "host"

    def __post_init__(self) -> None:
        for name in ("epoch", "start_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0. Received: {name}={value!r}")
        if self.augment_on not in ("host", "device"):
            raise ValueError(f"augment_on must be 'host' or 'device'. Received: augment_on={self.augment_on!r}")
        if self.augment_on == "device" and (self.augment is None or self.normalize or self.one_hot):
            raise ValueError("augment_on='device' needs an augment and compact mode (normalize=False, "
                             f"one_hot=False). Received: augment={self.augment!r}, normalize={self.normalize}, "
                             f"one_hot={self.one_hot}")
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"batch_size must be a positive integer. Received: batch_size={self.batch_size!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))):
            raise TypeError(f"seed must be an int or None. Received: seed={self.seed!r}")
        if self.shuffle_buffer is not None and (
            isinstance(self.shuffle_buffer, bool) or not isinstance(self.shuffle_buffer, (int, np.integer))
            or self.shuffle_buffer < 1
        ):
            raise ValueError(
                "shuffle_buffer must be a positive number of records or None. "
                f"Received: shuffle_buffer={self.shuffle_buffer!r}"
            )

    def effective_seed(self) -> int:
        """The seed as a non-negative int; a fresh random one (per call) when None."""
        if self.seed is None:
            return int(np.random.SeedSequence().entropy) % (1 << 63)
        return int(self.seed) % (1 << 64)

    @property
    def planned(self) -> bool:
        """Whether the pipeline must be the planned generator (`readers.formats.batching`),
        whose stream is a pure function of (seed, epoch, step): a seed, augmentation, or a
        start other than the first batch of epoch 0."""
        return self.seed is not None or self.requires_plan

    @property
    def requires_plan(self) -> bool:
        """Augmentation or a resumed start: only the planned generator can do them."""
        return self.augment is not None or self.epoch != 0 or self.start_step != 0

    def buffer_records(self, shards: Sequence[ShardRef]) -> int:
        """Shuffle buffer size in records: the explicit value, else as many records as
        fit in `SHUFFLE_BUFFER_BYTES` (by the shards' average record size), never less
        than one batch and never more than the records there are."""
        total = sum(s.records for s in shards)
        if self.shuffle_buffer is not None:
            return int(self.shuffle_buffer)
        nbytes = sum(s.entry.bytes for s in shards)
        per_record = max(1, nbytes // max(1, total))
        return int(max(self.batch_size, min(max(total, 1), SHUFFLE_BUFFER_BYTES // per_record)))


class FileAdapter(abc.ABC):
    """Reader side of one shard format."""

    file_format: FileFormat

    @abc.abstractmethod
    def iter_shard(self, shard: ShardRef, spec: RecordSpec) -> Iterator[Record]:
        """Yield the records of one shard in order (NumPy only). Errors name the file."""

    @abc.abstractmethod
    def tf_dataset(self, shards: Sequence[ShardRef], spec: RecordSpec, options: PipelineOptions,
                   ids: "np.ndarray | None" = None) -> "tf.data.Dataset":
        """One epoch of batched (x, y) over `shards`, expanded per `options` (no repeat,
        no cardinality assertion, no final prefetch: the caller adds those). `ids`: one
        uint64 per record of `shards` (its key's id) for augmentation draws."""

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


@contextlib.contextmanager
def naming_shard(path: str, record: int | None = None) -> Iterator[None]:
    """Re-raise any read/decode error as a `ShardError` naming `path` (and `record`)."""
    try:
        yield
    except ShardError:
        raise
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
    key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
    return key not in _verified, key


def mark_verified(key: tuple[str, int, int, int] | None) -> None:
    if key is not None:
        _verified.add(key)


# -- allocator ---------------------------------------------------------------------------------

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -3, -4, -8
MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's ceiling for this setting on 64-bit
MALLOC_TRIM_THRESHOLD_BYTES = 256 << 20
_allocator_tuned: bool | None = None


def tune_allocator() -> bool:
    """Stop glibc malloc from handing the pipeline's big blocks back to the kernel.

    A 512x512 pipeline allocates and frees megabyte-sized strings and tensors thousands
    of times a second. With glibc's defaults many of those blocks are returned to the
    kernel (munmap, heap trimming) and faulted in again on the next use, zero-filled
    page by page: on a 2-core VM that doubled the CPU cost per sample (TFRecord: 284
    page faults per sample; NPZ shards, whose 40 MB members are above any mmap
    threshold: 510). This sets, once per process, `M_MMAP_THRESHOLD` = 32 MB,
    `M_TRIM_THRESHOLD` = 256 MB, `M_MMAP_MAX` = 0 (big blocks come from the heap and are
    reused) and `M_ARENA_MAX` = max(4, CPUs), which brought it down to ~20 faults and
    1.5x (TFRecord) to 2x (NPZ) the samples per CPU-second. The price: freed memory
    (up to 256 MB at the top of each malloc arena, and freed big blocks below it) stays
    in the process for reuse instead of being returned to the system.

    Called by `Dataset.tf_dataset` and `Dataset.keras_dataset`. Set the environment
    variable ``IMGSHARD_TUNE_MALLOC=0`` to leave the allocator alone. A no-op (returns
    False) off Linux/glibc.
    """
    global _allocator_tuned
    if _allocator_tuned is not None:
        return _allocator_tuned
    _allocator_tuned = False
    if os.environ.get("IMGSHARD_TUNE_MALLOC", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    arenas = max(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 4))
    done = [mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES),
            mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES),
            mallopt(_M_MMAP_MAX, 0),
            mallopt(_M_ARENA_MAX, arenas)]
    _allocator_tuned = all(done)
    logger.debug("imgshard: glibc malloc tuned for large blocks: %s", _allocator_tuned)
    return _allocator_tuned


# -- expansion: compact (uint8 image, class map / label) -> (x, y) ------------------------------

def _onehot_table(num_classes: int) -> np.ndarray:
    table = np.zeros((256, num_classes), np.float32)
    table[np.arange(num_classes), np.arange(num_classes)] = 1.0
    return table


def expand_numpy(images: np.ndarray, targets: np.ndarray, spec: RecordSpec, *, one_hot: bool,
                 normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """NumPy twin of `expand_tf` for a batch (used by the PyDataset path)."""
    x = np.multiply(images, np.float32(1 / 255), dtype=np.float32) if normalize else images  # one pass
    c = spec.num_classes
    if not spec.segmentation:
        labels = np.asarray(targets, np.int64)
        if not one_hot:
            return x, labels
        y = np.zeros((labels.shape[0], c), np.float32)
        ok = (labels >= 0) & (labels < c)
        y[np.nonzero(ok)[0], labels[ok]] = 1.0
        return x, y
    if spec.mask_encoding == "onehot":
        if one_hot:
            return x, targets.astype(np.float32)
        cmap = np.argmax(targets, axis=-1).astype(np.uint8)
        ignore = spec.ignore_index if spec.ignore_index is not None else 255
        cmap[targets.max(axis=-1) == 0] = ignore
        return x, cmap
    if not one_hot:
        return x, targets
    if targets.dtype == np.uint8:
        return x, np.take(_onehot_table(c), targets, axis=0)
    return x, (targets[..., None] == np.arange(c, dtype=targets.dtype)).astype(np.float32)


def expand_tf(images: "tf.Tensor", targets: "tf.Tensor", spec: RecordSpec, *, one_hot: bool,
              normalize: bool) -> tuple["tf.Tensor", "tf.Tensor"]:
    """Cast/normalise images and one-hot encode targets inside a `tf.data` map.

    The ignore index (>= num_classes) becomes an all-zero row, which is what
    `tf.one_hot` does with out-of-range indices.
    """
    import tensorflow as tf

    x = tf.cast(images, tf.float32) * (1.0 / 255.0) if normalize else images
    c = spec.num_classes
    if not spec.segmentation:
        return x, (tf.one_hot(targets, c, dtype=tf.float32) if one_hot else targets)
    if spec.mask_encoding == "onehot":
        if one_hot:
            return x, tf.cast(targets, tf.float32)
        ignore = spec.ignore_index if spec.ignore_index is not None else 255
        cmap = tf.cast(tf.argmax(targets, axis=-1), tf.uint8)
        return x, tf.where(tf.reduce_max(targets, axis=-1) == 0, tf.constant(ignore, tf.uint8), cmap)
    if not one_hot:
        return x, targets
    idx = targets if targets.dtype == tf.uint8 else tf.cast(targets, tf.int32)
    return x, tf.one_hot(idx, c, dtype=tf.float32)


#: Compile the batch expansion with XLA (one fused pass over the output instead of one
#: per op: measured 0.62 instead of 1.12 ms of CPU per 512x512 sample, float32 + one-hot
#: of 5 classes).
EXPAND_JIT = True


def make_expand_tf(spec: RecordSpec, *, one_hot: bool, normalize: bool):
    """`expand_tf` for a whole batch as one function, XLA-compiled when `EXPAND_JIT` and
    there is anything to expand (compact mode passes the batch through untouched)."""
    import tensorflow as tf

    def expand(images: "tf.Tensor", targets: "tf.Tensor") -> tuple["tf.Tensor", "tf.Tensor"]:
        return expand_tf(images, targets, spec, one_hot=one_hot, normalize=normalize)

    if EXPAND_JIT and (one_hot or normalize):
        return tf.function(expand, jit_compile=True, reduce_retracing=True)
    return expand


def y_signature(spec: RecordSpec, *, batched: bool = True) -> tuple[Any, ...]:
    """Shape (with a leading None when batched) and dtype name of the compact target."""
    lead = (None,) if batched else ()
    if not spec.segmentation:
        return lead, "int64"
    return lead + spec.mask_shape, spec.mask_dtype or "uint8"


__all__ = [
    "SHUFFLE_BUFFER_BYTES",
    "FileAdapter",
    "PipelineOptions",
    "RandomAccessShard",
    "Record",
    "RecordSpec",
    "ShardRef",
    "expand_numpy",
    "expand_tf",
    "make_expand_tf",
    "crc_due",
    "mark_verified",
    "naming_shard",
    "tune_allocator",
    "y_signature",
]
