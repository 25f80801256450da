"""Class statistics from the manifest: class weights for imbalanced training.

NumPy only at import time (TensorFlow is imported inside `with_sample_weights`).

Schemes (`SCHEMES`), with n_c the pixels of class c in the split (the ignore index
is never counted) and only classes with n_c > 0 taking part:

* ``"inverse-frequency"``: w_c = N / (K * n_c), N = sum of n_c, K = number of classes
  present. A pixel's average weight is 1, so the loss keeps its scale
  (scikit-learn's ``class_weight="balanced"``).
* ``"median-frequency"`` (SegNet, Badrinarayanan et al. 2017; ENet's baseline):
  w_c = median(f) / f_c with f_c = n_c / (pixels of the images in which c occurs),
  the median taken over the classes present. The images in which a class occurs are
  counted per shard by the converter (``class_images`` in the manifest); every record
  of a dataset has the same H x W, so those pixels are ``class_images[c] * H * W``.
  For a manifest written before ``class_images`` existed, f_c falls back to
  n_c / N (the frequency over the whole split) with a warning. For classification
  (one class per record) f_c = n_c / N.

A class that never occurs in the split gets weight 0 (not inf): it cannot contribute
to the loss anyway, and a 0 keeps the array finite for Keras.

Use with `model.fit` (segmentation: a per-pixel sample weight; classification: Keras'
``class_weight``)::

    w = ds.class_weights("train", scheme="median-frequency")
    train = ds.tf_dataset("train", 8).map(readers.stats.with_sample_weights(w))
    model.fit(train, epochs=10)              # loss is weighted per pixel
    # classification:
    model.fit(ds.tf_dataset("train", 32), class_weight=dict(enumerate(w)))
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import numpy as np

from readers.tasks import task_kind

SCHEMES = ("inverse-frequency", "median-frequency")


def _check_counts(values: Any, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name} must be a 1-D array of counts. Received: shape {arr.shape}, dtype {arr.dtype}")
    if (arr < 0).any():
        raise ValueError(f"{name} must not hold negative counts. Received: {arr.tolist()}")
    return arr.astype(np.float64)


def class_weights(pixels: Sequence[int] | np.ndarray, scheme: str = "median-frequency", *,
                  present_pixels: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Class weights (float32, one per class; 0 for absent classes) from class counts.

    Args:
        pixels: n_c, pixels (or records, for classification) of each class.
        scheme: one of `SCHEMES`.
        present_pixels: for ``"median-frequency"``, the total pixels of the images in
            which each class occurs. None: f_c = n_c / sum(n) (see the module docstring).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {list(SCHEMES)}. Received: scheme={scheme!r}")
    n = _check_counts(pixels, "pixels")
    present = n > 0
    out = np.zeros(n.shape, np.float64)
    if not present.any():
        return out.astype(np.float32)
    total = n.sum()
    if scheme == "inverse-frequency":
        out[present] = total / (present.sum() * n[present])
        return out.astype(np.float32)
    if present_pixels is None:
        freq = n / total
    else:
        denom = _check_counts(present_pixels, "present_pixels")
        if denom.shape != n.shape:
            raise ValueError(f"present_pixels must have one count per class ({n.shape[0]}). "
                             f"Received: shape {denom.shape}")
        if (denom[present] < n[present]).any():
            raise ValueError("present_pixels must be at least the class's own pixels. "
                             f"Received: pixels={n.tolist()}, present_pixels={denom.tolist()}")
        freq = np.zeros_like(n)
        freq[present] = n[present] / denom[present]
    median = float(np.median(freq[present]))
    out[present] = median / freq[present]
    return out.astype(np.float32)


def manifest_class_weights(manifest: Any, split: str, scheme: str = "median-frequency") -> np.ndarray:
    """`class_weights` of one split of a `readers.manifest.Manifest` (no shard is read)."""
    entry = manifest.split(split)
    c = manifest.num_classes
    pixels = np.asarray(entry.class_pixels(c), np.int64)
    present_pixels = None
    if scheme == "median-frequency" and task_kind(manifest.task).dense:
        images = entry.class_images(c)
        if images is None:
            message = (f"split {split!r}: the manifest has no per-class image counts (written by an older "
                       "imgshard); median-frequency uses each class's share of all pixels instead. "
                       "Re-convert with --rebuild for the SegNet definition.")
            warnings.warn(message, stacklevel=3)
        else:
            h, w, _ = manifest.image_shape
            present_pixels = np.asarray(images, np.int64) * (h * w)
    return class_weights(pixels, scheme, present_pixels=present_pixels)


def with_sample_weights(weights: Sequence[float] | np.ndarray) -> Callable[..., Any]:
    """A `tf.data` map function (x, y) -> (x, y, sample_weight) from class weights.

    y may be one-hot (float, classes last: the default of `Dataset.tf_dataset`) or
    class indices (``one_hot=False``). The sample weight has y's shape without the class
    axis: (B, H, W) per pixel for segmentation, (B,) for classification. Ignored pixels
    (an all-zero one-hot row, or an index >= len(weights)) get weight 0. Keras multiplies
    the per-pixel loss by it (``reduction="sum_over_batch_size"`` then divides by the
    number of pixels, not by the sum of the weights).
    """
    import tensorflow as tf

    w = np.asarray(weights, np.float32)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"weights must be a non-empty 1-D array (one per class). Received: shape {w.shape}")
    # Index table for class maps: every index past the classes (the ignore index) weighs 0.
    table = np.zeros(max(65536, w.size), np.float32)
    table[: w.size] = w
    w_tf = tf.constant(w)
    table_tf = tf.constant(table)

    def add(x: Any, y: Any) -> tuple[Any, Any, Any]:
        if y.dtype.is_floating:
            sw = tf.tensordot(tf.cast(y, tf.float32), w_tf, axes=[[-1], [0]])
        else:
            sw = tf.gather(table_tf, tf.cast(y, tf.int32))
        return x, y, sw

    return add


__all__ = ["SCHEMES", "class_weights", "manifest_class_weights", "with_sample_weights"]
