"""The pipelines people use today, written the way they are usually written.

These are the yardsticks of `imgshard bench`; none of them uses imgshard code, except
where noted (the decode floor and the bare transform use the converter's own stages on
purpose: they bound what the converter can do).

* `raw_png_tf_dataset` (pipeline 1): `tf.data` over PNG file names: `decode_png`,
  `resize`, a per-colour `tf.equal` one-hot, `map(AUTOTUNE)`, `batch`, `prefetch`.
* `RawPngPyDataset` (pipeline 2): a `keras.utils.PyDataset` over PNGs (Pillow decode and
  resize, per-colour NumPy one-hot), run with workers and `use_multiprocessing`.
* `saved_tf_dataset` (pipeline 3): `tf.data.Dataset.save` of preconverted tensors, read
  back with `tf.data.Dataset.load`, shuffled and batched.
* `np_load_batches` (pipeline 6 baseline): a single-process `np.load` loop over NPZ shards.
* `naive_convert` (pipeline 7 baseline): a single-process Pillow loop writing a TFRecord
  with `tf.io.TFRecordWriter`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterator, Sequence

import numpy as np

from readers._lazy import LazyClass

Pair = tuple[str, str]


# -- pipeline 1 -------------------------------------------------------------------------------------

def raw_png_tf_dataset(pairs: Sequence[Pair], colors: Sequence[tuple[int, int, int]], size: tuple[int, int],
                       batch_size: int, *, seed: int | None = None) -> Any:
    """One epoch of float32 (x, one-hot y) batches decoded from PNG files every epoch."""
    import tensorflow as tf

    palette = tf.constant(np.asarray(colors, np.uint8).reshape(-1, 1, 1, 3))
    images = tf.constant([p[0] for p in pairs])
    masks = tf.constant([p[1] for p in pairs])

    def load(image_path: Any, mask_path: Any) -> tuple[Any, Any]:
        image = tf.io.decode_png(tf.io.read_file(image_path), channels=3)
        image = tf.image.resize(image, size) / 255.0  # bilinear, float32
        mask = tf.io.decode_png(tf.io.read_file(mask_path), channels=3)
        mask = tf.image.resize(mask, size, method="nearest")
        one_hot = tf.reduce_all(tf.equal(mask[None], palette), axis=-1)  # (C, H, W), one pass per colour
        return image, tf.cast(tf.transpose(one_hot, (1, 2, 0)), tf.float32)

    ds = tf.data.Dataset.from_tensor_slices((images, masks))
    ds = ds.shuffle(len(pairs), seed=seed, reshuffle_each_iteration=True)
    ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


# -- pipeline 2 -------------------------------------------------------------------------------------



def raw_png_pydataset(pairs: Sequence[Pair], colors: Sequence[tuple[int, int, int]], size: tuple[int, int],
                      batch_size: int, *, workers: int, seed: int = 0) -> Any:
    """A `keras.utils.PyDataset` of float32 (x, one-hot y) batches decoded with Pillow."""
    return _LAZY.get()(list(pairs), [tuple(c) for c in colors], tuple(size), batch_size, seed,
                            workers=workers, use_multiprocessing=True, max_queue_size=10)


def _build_pydataset_class() -> type:
    import keras
    from PIL import Image

    class RawPngPyDataset(keras.utils.PyDataset):
        def __init__(self, pairs, colors, size, batch_size, seed, **kwargs):
            super().__init__(**kwargs)
            self.pairs, self.colors, self.size, self.batch_size = pairs, colors, size, batch_size
            self.rng = np.random.default_rng(seed)
            self.order = self.rng.permutation(len(pairs))

        def __len__(self) -> int:
            return math.ceil(len(self.pairs) / self.batch_size)

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            h, w = self.size
            xs, ys = [], []
            for i in self.order[index * self.batch_size:(index + 1) * self.batch_size]:
                image_path, mask_path = self.pairs[i]
                with Image.open(image_path) as im:
                    image = im.convert("RGB").resize((w, h), Image.Resampling.BILINEAR)
                xs.append(np.asarray(image, np.float32) / 255.0)
                with Image.open(mask_path) as im:
                    mask = np.asarray(im.convert("RGB").resize((w, h), Image.Resampling.NEAREST))
                ys.append(np.stack([np.all(np.equal(mask, c), axis=-1) for c in self.colors], -1).astype(np.float32))
            return np.stack(xs), np.stack(ys)

        def on_epoch_end(self) -> None:
            self.order = self.rng.permutation(len(self.pairs))

    return RawPngPyDataset


_LAZY = LazyClass(__name__, "RawPngPyDataset", _build_pydataset_class)
__getattr__ = _LAZY.module_getattr()


class PyDatasetEpochs:
    """Iterate a PyDataset epoch by epoch the way `model.fit` feeds it with
    ``use_multiprocessing=True``: `workers` processes call `__getitem__`, batches come back
    in order with at most `max_queue_size` in flight, `on_epoch_end` runs after each epoch.
    Public API only (Keras' own enqueuer is private, `keras.src`)."""

    def __init__(self, py_dataset: Any):
        self.py_dataset = py_dataset

    def epoch(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        import multiprocessing

        ds = self.py_dataset
        ds.on_epoch_begin()
        workers = max(1, int(getattr(ds, "workers", 1) or 1))
        ahead = max(1, int(getattr(ds, "max_queue_size", 10) or 10))
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        with multiprocessing.get_context(method).Pool(workers, _set_pydataset, (ds,)) as pool:
            pending = []
            for index in range(len(ds)):
                pending.append(pool.apply_async(_pydataset_item, (index,)))
                if len(pending) >= ahead:
                    yield pending.pop(0).get()
            for job in pending:
                yield job.get()
        ds.on_epoch_end()


_WORKER_PYDATASET: Any = None


def _set_pydataset(ds: Any) -> None:
    global _WORKER_PYDATASET
    _WORKER_PYDATASET = ds


def _pydataset_item(index: int) -> tuple[np.ndarray, np.ndarray]:
    return _WORKER_PYDATASET[index]


# -- pipeline 3 -------------------------------------------------------------------------------------

def save_tensors(records: Iterator[Any], path: str, *, num_classes: int, float32: bool, image_shape: tuple,
                 mask_dtype: str = "uint8") -> None:
    """`tf.data.Dataset.save` the (image, target) tensors of `records` (imgshard Records).

    float32: image as float32 / 255 and the class map as a float32 one-hot (what
    pipelines 1 and 2 produce); else uint8 image and uint8 class map (compact).
    """
    import tensorflow as tf

    h, w, c = image_shape
    if float32:
        signature = (tf.TensorSpec((h, w, c), tf.float32), tf.TensorSpec((h, w, num_classes), tf.float32))
    else:
        signature = (tf.TensorSpec((h, w, c), tf.uint8), tf.TensorSpec((h, w), tf.dtypes.as_dtype(mask_dtype)))
    table = np.eye(256, num_classes, dtype=np.float32)  # ignore index -> all-zero row

    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for r in records:
            if float32:
                yield r.image.astype(np.float32) / 255.0, table[r.mask]
            else:
                yield r.image, r.mask

    ds = tf.data.Dataset.from_generator(gen, output_signature=signature)
    ds.save(path)


def saved_tf_dataset(path: str, batch_size: int, *, shuffle_buffer: int, seed: int | None = None) -> Any:
    """One epoch of batches from `tf.data.Dataset.load`, shuffled through a record buffer."""
    import tensorflow as tf

    ds = tf.data.Dataset.load(path)
    ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


# -- pipeline 6 baseline ----------------------------------------------------------------------------

def np_load_batches(paths: Sequence[str], batch_size: int, rng: np.random.Generator,
                    target: str = "masks") -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of uint8 (images, masks) batches: shard order shuffled, records
    permuted within each shard, one process, `np.load` per file."""
    for i in rng.permutation(len(paths)):
        with np.load(paths[i]) as z:
            images, targets = z["images"], z[target]
        perm = rng.permutation(len(images))
        for start in range(0, len(perm), batch_size):
            idx = perm[start:start + batch_size]
            yield images[idx], targets[idx]


# -- pipeline 7 baseline ----------------------------------------------------------------------------

def naive_convert(pairs: Sequence[Pair], colors: Sequence[tuple[int, int, int]], size: tuple[int, int],
                  out_path: str) -> int:
    """Pillow decode + convert + resize + colour lookup table, written with
    `tf.io.TFRecordWriter`, one sample after another. Returns the samples written."""
    import tensorflow as tf
    from PIL import Image

    lut = np.full(1 << 24, 255, np.uint8)
    for i, (r, g, b) in enumerate(colors):
        lut[(r << 16) | (g << 8) | b] = i
    h, w = size
    n = 0
    with tf.io.TFRecordWriter(out_path) as writer:
        for image_path, mask_path in pairs:
            with Image.open(image_path) as im:
                image = np.asarray(im.convert("RGB").resize((w, h), Image.Resampling.BILINEAR))
            with Image.open(mask_path) as im:
                rgb = np.asarray(im.convert("RGB").resize((w, h), Image.Resampling.NEAREST)).astype(np.uint32)
            mask = lut[(rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]]
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                "mask": tf.train.Feature(bytes_list=tf.train.BytesList(value=[mask.tobytes()])),
                "height": tf.train.Feature(int64_list=tf.train.Int64List(value=[h])),
                "width": tf.train.Feature(int64_list=tf.train.Int64List(value=[w])),
                "key": tf.train.Feature(bytes_list=tf.train.BytesList(value=[os.path.basename(image_path).encode()])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            n += 1
    return n
