"""The (x, y) expansion of compact batches, defined once: uint8 images -> float32/255,
class maps / labels -> one-hot float32 (an ignored or out-of-range index becomes an
all-zero row), stored one-hot planes -> float32 or back to a class map.

`expand` is the one definition; it runs on three array backends, each a handful of
primitives: NumPy (`expand_numpy`, the PyDataset path), `tf` inside a `tf.data` map
(`expand_tf`, `make_expand_tf`), and `keras.ops` on the accelerator
(`readers.device.expand_batch`). NumPy only at import time; TensorFlow and Keras are
imported by their backends when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from readers.formats.spec import RecordSpec

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


class _NumpyOps:
    @staticmethod
    def normalize(x: np.ndarray) -> np.ndarray:
        return np.multiply(x, np.float32(1 / 255), dtype=np.float32)  # one pass

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

        return tf.cast(x, tf.float32) * (1.0 / 255.0)

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

        return ops.multiply(ops.cast(x, "float32"), 1.0 / 255.0)

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


__all__ = ["EXPAND_JIT", "KERAS", "NUMPY", "TF", "expand", "expand_numpy", "expand_tf", "make_expand_tf"]
