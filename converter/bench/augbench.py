"""The augmentation yardsticks of `imgshard bench` (issue 29): the same recipe as imgshard's
augmented rows, written the way users write it with albumentations and with Keras 3
preprocessing layers.

* `albumentations_recipe`: a `Compose` of HorizontalFlip, Affine (scale, rotation;
  bilinear image, nearest mask), PadIfNeeded + RandomCrop to the training size and
  RandomBrightnessContrast (brightness only), applied to image and mask together.
  OpenCV's own threads are turned off (`cv2.setNumThreads(0)`), as albumentations
  advises inside a multi-worker loader.
* `albumentations_loader`: compact batches from the imgshard reader (the same shards and
  reading as imgshard's augmented rows), augmented per sample on a pool of
  `threads` threads (OpenCV releases the GIL), a few batches in flight.
* `keras_layers_dataset`: `tf.data` + Keras 3 preprocessing layers (RandomFlip,
  RandomZoom, RandomRotation, RandomCrop, RandomBrightness) on image and mask stacked,
  so both get the same draw (the mask resampled bilinearly and rounded: Keras layers
  take one interpolation for the whole tensor).

Optional: the `augbench` extra (albumentations, opencv-python-headless); without it the
albumentations rows are skipped, and the bench says so.
"""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np


def albumentations_available() -> bool:
    try:
        import albumentations  # noqa: F401
        import cv2  # noqa: F401
    except ImportError:
        return False
    return True


def albumentations_recipe(size: tuple[int, int], *, rotate: float = 10.0, scale: tuple[float, float] = (0.5, 2.0),
                          brightness: float = 0.2, seed: int | None = 0) -> Any:
    """`Augment(hflip=0.5, scale=scale, crop=size, rotate=rotate, brightness=brightness)` in albumentations."""
    import albumentations as A
    import cv2

    cv2.setNumThreads(0)
    h, w = size
    return A.Compose([
        A.HorizontalFlip(p=0.5),
        A.Affine(scale=scale, rotate=(-rotate, rotate), interpolation=cv2.INTER_LINEAR,
                 mask_interpolation=cv2.INTER_NEAREST, fill=0, fill_mask=255, p=1.0),
        A.PadIfNeeded(min_height=h, min_width=w, fill=0, fill_mask=255),
        A.RandomCrop(height=h, width=w),
        A.RandomBrightnessContrast(brightness_limit=brightness, contrast_limit=0.0, p=1.0),
    ], seed=seed)


def albumentations_batch(compose: Any, images: np.ndarray, masks: np.ndarray, *, normalize: bool,
                         classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch through `compose`, sample by sample; `normalize`: float32 / 255 image and
    float32 one-hot mask (classes >= `classes`, the ignore index among them, all zero)."""
    xs, ys = [], []
    for image, mask in zip(images, masks):
        out = compose(image=image, mask=mask)
        xs.append(out["image"])
        ys.append(out["mask"])
    x, y = np.stack(xs), np.stack(ys)
    if not normalize:
        return x, y
    hot = (y[..., None] == np.arange(classes, dtype=y.dtype)).astype(np.float32)
    return x.astype(np.float32) * np.float32(1 / 255), hot


def albumentations_loader(batches: Any, compose: Any, *, normalize: bool, classes: int, threads: int = 2,
                          ahead: int = 4) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Augmented batches of an iterable of compact (images, masks) batches (NumPy or tf
    tensors), `threads` batches at once, up to `ahead` in flight, in order."""
    pending: collections.deque = collections.deque()
    with ThreadPoolExecutor(threads) as pool:
        try:
            for images, masks in batches:
                pending.append(pool.submit(albumentations_batch, compose, np.asarray(images), np.asarray(masks),
                                           normalize=normalize, classes=classes))
                if len(pending) >= ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for job in pending:
                job.cancel()


def keras_layers_dataset(compact: Any, size: tuple[int, int], *, rotate: float = 10.0,
                         scale: tuple[float, float] = (0.5, 2.0), brightness: float = 0.2,
                         classes: int, normalize: bool, seed: int = 0) -> Any:
    """The recipe as Keras 3 preprocessing layers in a `tf.data` map over compact batches."""
    import keras
    import tensorflow as tf

    h, w = size
    zoom = (-1 + 1 / scale[0], -1 + 1 / scale[1])  # Keras: positive = zoom out; sorted below
    geometry = [keras.layers.RandomFlip("horizontal", seed=seed),
                keras.layers.RandomZoom(height_factor=(min(zoom), max(zoom)), fill_mode="constant", seed=seed),
                keras.layers.RandomRotation(rotate / 360.0, fill_mode="constant", seed=seed),
                keras.layers.RandomCrop(h, w, seed=seed)]
    bright = keras.layers.RandomBrightness(brightness, value_range=(0, 255), seed=seed)

    def run(images: Any, masks: Any) -> tuple[Any, Any]:
        both = tf.concat([tf.cast(images, tf.float32), tf.cast(masks[..., None], tf.float32)], -1)
        for layer in geometry:
            both = layer(both, training=True)
        x, y = bright(both[..., :3], training=True), tf.cast(tf.round(both[..., 3]), tf.uint8)
        if normalize:
            return x / 255.0, tf.one_hot(y, classes, dtype=tf.float32)
        return tf.cast(tf.clip_by_value(tf.round(x), 0, 255), tf.uint8), y

    return compact.map(run, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)




# -- the bench rows (pipeline 11) ----------------------------------------------------------------

#: Issue 29's recipe: `Augment(**ROTATE_RECIPE, crop=size)`, and the same in albumentations / Keras.
ROTATE_RECIPE = dict(hflip=0.5, scale=(0.5, 2.0), rotate=10.0, brightness=0.2)


def rotate_pipelines(opts: Any, ds: Any, split: str, read: int, shape: Any, say: Any) -> list:
    """Pipeline 11 on the 1.25x shards of pipeline 8: the rotate=10 recipe by imgshard (float32 +
    one-hot, compact), by albumentations on 2 threads fed by imgshard's compact reader (both
    forms; skipped without the `augbench` extra), and by Keras 3 preprocessing layers."""
    from converter.bench.result import Row
    from converter.bench.rounds import forever, tf_iterator
    from readers.augment import Augment

    h, w = opts.size
    bs, kw = opts.batch_size, dict(shuffle_buffer=opts.shuffle_buffer, repeat=True)
    aug = Augment(**ROTATE_RECIPE, crop=(h, w))
    note = "hflip, scale 0.5-2, rotate 10, crop, brightness"

    def row(key: str, label: str, mode: str, extra: str = "") -> Row:
        return Row(key, f"11. {label}", "reader", shape.written(mode), bytes_read=read,
                   note=note + (f"; {extra}" if extra else ""))

    floats = ds.tf_dataset(split, bs, seed=opts.seed, augment=aug, **kw)
    compact = ds.tf_dataset(split, bs, seed=opts.seed, augment=aug, normalize=False, one_hot=False, **kw)
    out = [(row("p11_rotate_float32", "imgshard Augment(rotate=10), float32 + one-hot", "float32"), tf_iterator(floats)),
           (row("p11_rotate_compact", "imgshard Augment(rotate=10), compact", "compact"), tf_iterator(compact))]
    plain = ds.tf_dataset(split, bs, normalize=False, one_hot=False, **kw)
    if albumentations_available():
        compose = albumentations_recipe((h, w), rotate=ROTATE_RECIPE["rotate"], scale=ROTATE_RECIPE["scale"],
                                        brightness=ROTATE_RECIPE["brightness"], seed=opts.seed)
        for mode, normalize in (("float32", True), ("compact", False)):
            def epoch(normalize: bool = normalize) -> Any:
                return albumentations_loader(plain, compose, normalize=normalize, classes=shape.classes, threads=2)
            label = "albumentations chain, 2 threads, " + ("float32 + one-hot" if normalize else "compact")
            out.append((row(f"p11_albumentations_{mode}", label, mode, "fed by imgshard's compact reader"),
                        forever(epoch)))
    else:
        say("albumentations rows skipped: install the augbench extra (albumentations, opencv-python-headless)")
    keras_ds = keras_layers_dataset(plain, (h, w), rotate=ROTATE_RECIPE["rotate"], scale=ROTATE_RECIPE["scale"],
                                    brightness=ROTATE_RECIPE["brightness"], classes=shape.classes, normalize=True,
                                    seed=opts.seed)
    out.append((row("p11_keras_layers_float32", "Keras 3 preprocessing layers on tf.data, float32 + one-hot",
                    "float32", "mask resampled bilinearly with the image, rounded"), tf_iterator(keras_ds)))
    return out


__all__ = ["ROTATE_RECIPE", "albumentations_available", "albumentations_batch", "albumentations_loader",
           "albumentations_recipe", "keras_layers_dataset", "rotate_pipelines"]
