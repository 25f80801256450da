"""The (x, y) expansion of compact batches, defined once: uint8 images -> float32/255
(uint16 images: /65535),
class maps / labels -> one-hot float32 (an ignored or out-of-range index becomes an
all-zero row; the readers refuse out-of-range values before they get here:
`readers.formats.classrange`), stored one-hot planes -> float32 or back to a class map.

`expand` is the one definition; it runs on three array backends, each a handful of
primitives: NumPy (`expand_numpy`, the PyDataset path), `tf` inside a `tf.data` map
(`expand_tf`, `make_expand_tf`), and `keras.ops` on the accelerator
(`readers.device.expand_batch`). NumPy only at import time; TensorFlow and Keras are
imported by their backends when used.

`RecordExpander` is the same expansion written record by record straight into a batch's
output arrays, in one pass per output (the `readers._warp` C loops `to_float` / `one_hot`
when built, else NumPy ufuncs with `out=`; the same bits either way): the generator
pipeline (`readers.formats.batching`) uses it to go from the stored records to the
float32 batch without a compact batch, a cast, a scale and a one-hot pass in between.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from readers.formats.spec import RecordSpec

try:  # the C loops of `RecordExpander` (built with the augmentation kernel)
    from readers import _warp
except ImportError:  # pragma: no cover - built without a C compiler: NumPy, same bits
    _warp = None

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

#: Compile the batch expansion with XLA (one fused pass over the output instead of one
#: per op: measured 0.62 instead of 1.12 ms of CPU per 512x512 sample, float32 + one-hot
#: of 5 classes).
EXPAND_JIT = True


def expand(images: Any, targets: Any, ops: Any, *, num_classes: int, stored_onehot: bool,
           ignore_index: int | None, one_hot: bool, normalize: bool) -> tuple[Any, Any]:
    """The expansion of one batch on the backend `ops` (`NUMPY`, `TF` or `KERAS`).

    `targets`: labels (B,), class maps (B, H, W), or with `stored_onehot` uint8 planes
    (B, H, W, C); None leaves y out. Planes stay planes as float32 when `one_hot`, else
    become a class map with `ignore_index` where no plane is set.
    """
    x = ops.normalize(images) if normalize else images
    if targets is None:
        return x, None
    if stored_onehot:
        if one_hot:
            return x, ops.to_float(targets)
        return x, ops.class_map(targets, 255 if ignore_index is None else ignore_index)
    if not one_hot:
        return x, targets
    return x, ops.one_hot(targets, num_classes, ignore_index)


def _is_wide(x: Any) -> bool:
    """Whether `x` holds 16-bit images (scaled by 1/65535 instead of 1/255)."""
    return "uint16" in str(getattr(x, "dtype", ""))


class _NumpyOps:
    @staticmethod
    def normalize(x: np.ndarray) -> np.ndarray:
        return np.multiply(x, WIDE_SCALE if _is_wide(x) else SCALE, dtype=np.float32)  # one pass

    @staticmethod
    def to_float(t: np.ndarray) -> np.ndarray:
        return t.astype(np.float32)

    @staticmethod
    def class_map(planes: np.ndarray, ignore: int) -> np.ndarray:
        cmap = np.argmax(planes, axis=-1).astype(np.uint8)
        cmap[planes.max(axis=-1) == 0] = ignore
        return cmap

    @staticmethod
    def one_hot(idx: np.ndarray, depth: int, ignore: int | None) -> np.ndarray:
        if idx.dtype == np.uint8:  # a table lookup: one pass, no (..., depth) comparison
            table = np.zeros((256, depth), np.float32)
            table[np.arange(depth), np.arange(depth)] = 1.0
            if ignore is not None and 0 <= ignore < min(depth, 256):
                table[ignore] = 0.0
            return np.take(table, idx, axis=0)
        hot = idx[..., None] == np.arange(depth, dtype=idx.dtype)
        if ignore is not None and 0 <= ignore < depth:
            hot &= (idx != ignore)[..., None]
        return hot.astype(np.float32)


class _TfOps:
    @staticmethod
    def normalize(x: "tf.Tensor") -> "tf.Tensor":
        import tensorflow as tf

        return tf.cast(x, tf.float32) * (1.0 / 65535.0 if _is_wide(x) else 1.0 / 255.0)

    @staticmethod
    def to_float(t: "tf.Tensor") -> "tf.Tensor":
        import tensorflow as tf

        return tf.cast(t, tf.float32)

    @staticmethod
    def class_map(planes: "tf.Tensor", ignore: int) -> "tf.Tensor":
        import tensorflow as tf

        cmap = tf.cast(tf.argmax(planes, axis=-1), tf.uint8)
        return tf.where(tf.reduce_max(planes, axis=-1) == 0, tf.constant(ignore, tf.uint8), cmap)

    @staticmethod
    def one_hot(idx: "tf.Tensor", depth: int, ignore: int | None) -> "tf.Tensor":
        import tensorflow as tf

        if idx.dtype not in (tf.uint8, tf.int32, tf.int64):
            idx = tf.cast(idx, tf.int32)
        if ignore is not None and 0 <= ignore < depth:
            idx = tf.where(tf.equal(idx, tf.cast(ignore, idx.dtype)), tf.cast(depth, idx.dtype), idx)
        return tf.one_hot(idx, depth, dtype=tf.float32)  # out-of-range index: all-zero row


class _KerasOps:
    @staticmethod
    def normalize(x: Any) -> Any:
        from keras import ops

        return ops.multiply(ops.cast(x, "float32"), 1.0 / 65535.0 if _is_wide(x) else 1.0 / 255.0)

    @staticmethod
    def to_float(t: Any) -> Any:
        from keras import ops

        return ops.cast(t, "float32")

    @staticmethod
    def class_map(planes: Any, ignore: int) -> Any:
        from keras import ops

        cmap = ops.cast(ops.argmax(planes, axis=-1), "uint8")
        return ops.where(ops.equal(ops.max(planes, axis=-1), 0), ops.cast(ignore, "uint8"), cmap)

    @staticmethod
    def one_hot(idx: Any, depth: int, ignore: int | None) -> Any:
        from keras import ops

        labels = ops.expand_dims(ops.cast(idx, "int32"), -1)
        hot = ops.equal(labels, ops.arange(depth, dtype="int32"))
        if ignore is not None and 0 <= ignore < depth:
            hot = ops.logical_and(hot, ops.not_equal(labels, ignore))
        return ops.cast(hot, "float32")


NUMPY, TF, KERAS = _NumpyOps(), _TfOps(), _KerasOps()


def _spec_args(spec: RecordSpec) -> dict[str, Any]:
    return {"num_classes": spec.num_classes, "stored_onehot": spec.mask_encoding == "onehot",
            "ignore_index": spec.ignore_index}


def expand_numpy(images: np.ndarray, targets: np.ndarray, spec: RecordSpec, *, one_hot: bool,
                 normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """`expand` for a NumPy batch (used by the PyDataset path); labels come back int64."""
    if not spec.segmentation:
        targets = np.asarray(targets, np.int64)
    return expand(images, targets, NUMPY, one_hot=one_hot, normalize=normalize, **_spec_args(spec))


def expand_tf(images: "tf.Tensor", targets: "tf.Tensor", spec: RecordSpec, *, one_hot: bool,
              normalize: bool) -> tuple["tf.Tensor", "tf.Tensor"]:
    """`expand` inside a `tf.data` map."""
    return expand(images, targets, TF, one_hot=one_hot, normalize=normalize, **_spec_args(spec))


def make_expand_tf(spec: RecordSpec, *, one_hot: bool, normalize: bool):
    """`expand_tf` for a whole batch as one function, XLA-compiled when `EXPAND_JIT` and
    there is anything to expand (compact mode passes the batch through untouched)."""
    import tensorflow as tf

    def expand_batch(images: "tf.Tensor", targets: "tf.Tensor") -> tuple["tf.Tensor", "tf.Tensor"]:
        return expand_tf(images, targets, spec, one_hot=one_hot, normalize=normalize)

    if EXPAND_JIT and (one_hot or normalize):
        return tf.function(expand_batch, jit_compile=True, reduce_retracing=True)
    return expand_batch


#: Batches of at least this many output bytes are written with non-temporal (streaming)
#: stores by the C loops: a batch larger than the caches is read back from memory anyway,
#: and plain stores first read every output line into the cache (the write-allocate),
#: doubling the memory traffic. Measured in the reader (2 cores, 5 classes, batches of 8,
#: medians of 6 interleaved rounds): 512x512 float32 + one-hot (67 MB batches) 1,458 ->
#: 3,025 samples/s, CPU per sample 1.28 -> 0.58 ms; sparse labels (27 MB) 2,980 -> 4,137;
#: 256x256 float32 + one-hot (17 MB) 4,510 -> 6,383. Smaller batches keep plain stores:
#: they can stay in the cache for the consumer, and the kernels' streaming stores were
#: 1.2-1.4x slower there (`scripts/one_hot_bench.py`, in cache).
STREAM_MIN_BYTES = 8 << 20
#: float32(1 / 255): the image scale of every backend (`_NumpyOps.normalize`).
SCALE = np.float32(1 / 255)
#: float32(1 / 65535): the scale of uint16 images (`normalize=True` maps the dtype's range to [0, 1]).
WIDE_SCALE = np.float32(1 / 65535)


def fast_expand_available() -> bool:
    """Whether `RecordExpander` runs the C loops: `readers._warp` was built and
    ``IMGSHARD_FAST_EXPAND`` is not set to 0 (the switch the tests use for the NumPy path)."""
    flag = os.environ.get("IMGSHARD_FAST_EXPAND", "1").strip().lower()
    return _warp is not None and flag not in ("0", "false", "no", "off")


class RecordExpander:
    """`expand` for one pipeline's options, written record by record into batch arrays.

    `layout(n)` gives the (shape, dtype) of a batch's x and y; `fill(x, y, j, image,
    target)` writes record j (a stored uint8 image, and its class map / one-hot planes /
    label) into row j of both. Every output value is written once, straight from the
    record: float32 images (x / 255), one-hot float32 rows from the class map (an
    ignored or out-of-range index: an all-zero row), stored planes as float32. Rows can
    be filled from several threads at once (the C loops release the GIL).
    """

    def __init__(self, spec: RecordSpec, *, one_hot: bool, normalize: bool, use_c: bool | None = None):
        self.spec = spec
        self.one_hot = one_hot
        self.normalize = normalize
        self.use_c = fast_expand_available() if use_c is None else bool(use_c and _warp is not None)
        self.planes = spec.mask_encoding == "onehot"
        ignore = spec.ignore_index
        self.ignore = ignore if ignore is not None and 0 <= ignore < spec.num_classes else -1
        table = np.zeros((256, spec.num_classes), np.float32)  # uint8 index -> one-hot row
        table[np.arange(min(spec.num_classes, 256)), np.arange(min(spec.num_classes, 256))] = 1.0
        if self.ignore >= 0 and self.ignore < 256:
            table[self.ignore] = 0.0
        self.table = table

    def layout(self, n: int) -> tuple[tuple[tuple[int, ...], np.dtype], tuple[tuple[int, ...], np.dtype]]:
        """((x shape, x dtype), (y shape, y dtype)) of a batch of `n` records."""
        spec = self.spec
        x = ((n, *spec.image_shape), np.dtype(np.float32) if self.normalize else spec.image_np_dtype.newbyteorder("="))
        if not spec.segmentation:
            return x, ((n, spec.num_classes), np.dtype(np.float32)) if self.one_hot else ((n,), np.dtype(np.int64))
        if self.one_hot:
            return x, ((n, spec.height, spec.width, spec.num_classes), np.dtype(np.float32))
        if self.planes:
            return x, ((n, spec.height, spec.width), np.dtype(np.uint8))
        return x, ((n, *spec.mask_shape), np.dtype(spec.mask_np_dtype).newbyteorder("="))

    def fill(self, x: np.ndarray, y: np.ndarray, j: int, image: Any, target: Any) -> None:
        """Write record j's expanded image and target into x[j] and y[j] (with streaming
        stores when the batch is `STREAM_MIN_BYTES` or more)."""
        stream = x.nbytes + y.nbytes >= STREAM_MIN_BYTES
        self._fill_image(x[j], image, stream)
        if not self.spec.segmentation:
            self._fill_label(y, j, int(target))
        elif self.planes:
            self._fill_planes(y[j], np.asarray(target), stream)
        elif self.one_hot:
            self._fill_one_hot(y[j], np.asarray(target), stream)
        else:
            y[j] = target

    def _fill_image(self, out: np.ndarray, image: Any, stream: bool) -> None:
        if not self.normalize:
            out[...] = image
        elif self.spec.image_dtype != "uint8":  # the C loop reads uint8
            np.multiply(image, WIDE_SCALE, out=out, dtype=np.float32)
        elif self.use_c:
            _warp.to_float(_contiguous(image), out, SCALE, stream)
        else:
            np.multiply(image, SCALE, out=out, dtype=np.float32)

    def _fill_label(self, y: np.ndarray, j: int, label: int) -> None:
        if not self.one_hot:
            y[j] = label
            return
        y[j] = 0.0
        if 0 <= label < self.spec.num_classes and label != self.ignore:
            y[j, label] = 1.0

    def _fill_planes(self, out: np.ndarray, planes: np.ndarray, stream: bool) -> None:
        if not self.one_hot:
            out[...] = NUMPY.class_map(planes, 255 if self.spec.ignore_index is None else self.spec.ignore_index)
        elif self.use_c and planes.dtype == np.uint8:
            _warp.to_float(_contiguous(planes), out, np.float32(1), stream)
        else:
            out[...] = planes  # uint8 -> float32: exact

    def _fill_one_hot(self, out: np.ndarray, cmap: np.ndarray, stream: bool) -> None:
        native = cmap.dtype.isnative and cmap.dtype.itemsize in (1, 2)
        if self.use_c and native and cmap.ctypes.data % cmap.dtype.itemsize == 0:
            _warp.one_hot(_contiguous(cmap), out, self.spec.num_classes, self.ignore, cmap.dtype.itemsize, "auto",
                          stream)
        elif cmap.dtype == np.uint8:
            np.take(self.table, cmap, axis=0, out=out)
        else:
            out[...] = NUMPY.one_hot(cmap, self.spec.num_classes, self.spec.ignore_index)


def _contiguous(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a)


__all__ = ["EXPAND_JIT", "KERAS", "NUMPY", "SCALE", "STREAM_MIN_BYTES", "TF", "WIDE_SCALE", "RecordExpander", "expand", "expand_numpy", "expand_tf",
           "fast_expand_available", "make_expand_tf"]
