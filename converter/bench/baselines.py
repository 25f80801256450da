"""The pipelines people use today, written the way they are usually written.

These are the yardsticks of `imgshard bench`; none of them uses imgshard code, except
where noted (the decode floor and the bare transform use the converter's own stages on
purpose: they bound what the converter can do).

* `raw_png_tf_dataset` (pipeline 1): `tf.data` over PNG file names: `decode_png`,
  `resize`, a per-colour `tf.equal` one-hot, `map(AUTOTUNE)`, `batch`, `prefetch`.
* `RawPngPyDataset` (pipeline 2): a `keras.utils.PyDataset` over PNGs (Pillow decode and
  resize, per-colour NumPy one-hot), run with workers and `use_multiprocessing`.
* `saved_tf_dataset` (pipeline 3): `tf.data.Dataset.save` of the stored uint8 tensors,
  read back as issue 19 describes: `load().repeat().shuffle(64).batch(8)`, then
  `map(to_float_and_one_hot, num_parallel_calls=AUTOTUNE)` after batching (or only the
  float image: sparse labels; or no map: compact), `prefetch(AUTOTUNE)`.
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
                       batch_size: int, *, seed: int | None = None, repeat: bool = False) -> Any:
    """Float32 (x, one-hot y) batches decoded from PNG files every epoch: one epoch, or
    epochs without end (`repeat`: the file list reshuffled every epoch)."""
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
    if repeat:
        ds = ds.repeat()
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

#: What `saved_tf_dataset` delivers: float32 image + float32 one-hot, float32 image + the
#: class map as stored (sparse labels, for `sparse_categorical_crossentropy`), or the
#: stored uint8 image + class map (compact).
SAVED_MODES = ("float32", "sparse", "compact")


def save_tensors(records: Iterator[Any], path: str, *, image_shape: tuple, mask_dtype: str = "uint8") -> int:
    """`tf.data.Dataset.save` the (image, class map) of `records` (imgshard Records) as
    stored: uint8 image (H, W, 3) and uint8/uint16 class map (H, W). Returns the count.

    The compact tensors are what a TF user saves: float32 + one-hot tensors would be
    (3 + C) x 4 / 4 times larger on disk and in the page cache (what the first
    baseline of issue 4 did; issue 19 replaced it). Expanding after batching is the
    job of the map in `saved_tf_dataset`.
    """
    import tensorflow as tf

    h, w, c = image_shape
    signature = (tf.TensorSpec((h, w, c), tf.uint8), tf.TensorSpec((h, w), tf.dtypes.as_dtype(mask_dtype)))
    count = [0]

    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for r in records:
            count[0] += 1
            yield r.image, r.mask

    tf.data.Dataset.from_generator(gen, output_signature=signature).save(path)
    return count[0]


def to_float(x: Any) -> Any:
    """uint8 image batch -> float32 in [0, 1] (`tf.cast` / 255)."""
    import tensorflow as tf

    return tf.cast(x, tf.float32) / 255.0


def to_float_and_one_hot_fn(num_classes: int) -> Any:
    """`to_float_and_one_hot(x, y)` for batches: float32 image in [0, 1] and float32
    one-hot class map (`tf.one_hot` straight from the uint8 class map; the ignore index,
    out of range, becomes an all-zero row, as in imgshard's readers)."""
    import tensorflow as tf

    def to_float_and_one_hot(x: Any, y: Any) -> tuple[Any, Any]:
        if y.dtype not in (tf.uint8, tf.int32, tf.int64):  # tf.one_hot takes no uint16 indices
            y = tf.cast(y, tf.int32)
        return to_float(x), tf.one_hot(y, num_classes, dtype=tf.float32)

    return to_float_and_one_hot


def saved_tf_dataset(path: str, batch_size: int, *, shuffle_buffer: int, num_classes: int, mode: str = "float32",
                     seed: int | None = None) -> Any:
    """The `tf.data.Dataset.save`/`load` pipeline of issue 19, as a TF user writes it:

        load().repeat().shuffle(64).batch(8)
              .map(to_float_and_one_hot, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)

    The one-hot runs after batching (one vectorised op per batch, not per record).
    `mode`: "float32" (as above), "sparse" (`map(to_float)` on the image only: float32
    image + the stored class map), "compact" (no map: uint8 image + class map).
    Infinite (it repeats): iterate it for a number of batches.
    """
    import tensorflow as tf

    if mode not in SAVED_MODES:
        raise ValueError(f"mode must be one of {list(SAVED_MODES)}. Received: mode={mode!r}")
    ds = tf.data.Dataset.load(path).repeat().shuffle(shuffle_buffer, seed=seed).batch(batch_size)
    if mode == "float32":
        ds = ds.map(to_float_and_one_hot_fn(num_classes), num_parallel_calls=tf.data.AUTOTUNE)
    elif mode == "sparse":
        ds = ds.map(lambda x, y: (to_float(x), y), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


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
