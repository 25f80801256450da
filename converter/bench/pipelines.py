"""The reader pipelines of `imgshard bench`, built once and timed in interleaved rounds.

Every pipeline is a `Row` (with its bytes read and written per sample, for the
bandwidth limit) and a maker of fresh iterators (`converter.bench.rounds`). The record
pipelines all repeat (`.repeat()` for `tf.data.Dataset.load`, `repeat=True` for
imgshard), so a round runs across epoch boundaries the same way for both.

Bytes per sample, read + written, are the least traffic the row's output needs: the
bytes of its stored sample (the files it reads, per sample: PNG pairs for pipelines 1
and 2, record files for the others), read once, and the tensors it delivers, written
once (`Io`). The row's bandwidth limit is 2 x copy bandwidth / (read + written)
(`converter.bench.bandwidth`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from converter.bench import baselines
from converter.bench.augbench import rotate_pipelines
from converter.bench.options import BenchOptions
from converter.bench.result import Row
from converter.bench.rounds import forever, tf_iterator
from converter.bench.sources import Sources, run_convert

Say = Callable[[str], None]
MakeIter = Callable[[], Iterator[Any]]


@dataclass(frozen=True)
class Io:
    """Bytes a pipeline reads (its stored sample) and writes (the tensors it delivers) per sample."""

    read: int
    written: int


@dataclass(frozen=True)
class Shape:
    """The output geometry: (h, w), classes, bytes per stored class-map pixel."""

    h: int
    w: int
    classes: int
    mask_bytes: int = 1

    def written(self, mode: str) -> int:
        """Bytes of one delivered sample: "float32" (+ one-hot), "sparse" (float32 image +
        class map) or "compact" (uint8 image + class map)."""
        px = self.h * self.w
        image = {"float32": 12 * px, "sparse": 12 * px, "compact": 3 * px}[mode]
        target = 4 * px * self.classes if mode == "float32" else self.mask_bytes * px
        return image + target

    def io(self, mode: str, read: int) -> Io:
        return Io(read, self.written(mode))


def stored_bytes_per_sample(paths: Sequence[str], samples: int) -> int:
    """Bytes of `paths` (files, or folders summed recursively) per sample."""
    total = 0
    for path in paths:
        if os.path.isdir(path):
            total += sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        else:
            total += os.path.getsize(path)
    return round(total / max(1, samples))


def _row(key: str, label: str, io: Io, note: str = "") -> Row:
    return Row(key, label, "reader", io.written, bytes_read=io.read, note=note)


Pipelines = list[tuple[Row, MakeIter]]


def png_pipelines(opts: BenchOptions, sources: Sources, shape: Shape) -> Pipelines:
    """Pipelines 1 and 2: decoding the PNG pairs every epoch (float32 + one-hot)."""
    bs = opts.batch_size
    workers = os.cpu_count() or 1
    io = shape.io("float32", round(sources.source_bytes / len(sources.pairs)))
    p1 = baselines.raw_png_tf_dataset(sources.pairs, sources.colors, opts.size, bs, repeat=True)
    p2 = baselines.PyDatasetEpochs(baselines.raw_png_pydataset(sources.pairs, sources.colors, opts.size, bs,
                                                               workers=workers, seed=opts.seed))
    return [
        (_row("p1_tf_png", "1. tf.data over PNG (decode, resize, tf.equal one-hot)", io), tf_iterator(p1)),
        (_row("p2_pydataset_png", f"2. Keras PyDataset over PNG ({workers} workers, multiprocessing)", io,
              note="per CPU-s: parent only, not its workers"), forever(p2.epoch)),
    ]


def saved_pipelines(opts: BenchOptions, ds: Any, split: str, work: str, shape: Shape, say: Say) -> Pipelines:
    """Pipeline 3: `tf.data.Dataset.save` of the stored tensors, `load()`ed the fair way
    (`baselines.saved_tf_dataset`), delivering each of the three outputs."""
    path = os.path.join(work, "saved")
    say("tf.data.Dataset.save (uint8 image + class map)")
    n = baselines.save_tensors(ds.records(split), path, image_shape=ds.image_shape,
                               mask_dtype="uint8" if shape.mask_bytes == 1 else "uint16")
    read = stored_bytes_per_sample([path], n)
    load = "load().repeat().shuffle().batch()"
    out: Pipelines = []
    for mode, label, what in (
            ("float32", "3. Dataset.save/load, float32 + one-hot", ".map(to_float_and_one_hot)"),
            ("sparse", "3. Dataset.save/load, float32 + sparse labels", ".map(to_float)"),
            ("compact", "3. Dataset.save/load, compact (uint8 + class map)", "")):
        pipe = baselines.saved_tf_dataset(path, opts.batch_size, shuffle_buffer=opts.shuffle_buffer,
                                          num_classes=shape.classes, mode=mode)
        out.append((_row(f"p3_saved_{mode}", label, shape.io(mode, read), note=f"{load}{what}.prefetch()"),
                    tf_iterator(pipe)))
    return out


def imgshard_pipelines(opts: BenchOptions, ds: Any, split: str, shape: Shape) -> Pipelines:
    """Pipelines 4 and 5: the TFRecord reader, float32 + one-hot, sparse, compact (and
    compact followed by `readers.device.expand_batch`, on the CPU here)."""
    from readers.device import expand_batch

    bs, buf = opts.batch_size, opts.shuffle_buffer
    read = stored_bytes_per_sample([s.path for s in ds.shards(split)], ds.splits[split])
    floats = ds.tf_dataset(split, bs, shuffle_buffer=buf, repeat=True)
    sparse = ds.tf_dataset(split, bs, shuffle_buffer=buf, repeat=True, one_hot=False)
    compact = ds.tf_dataset(split, bs, shuffle_buffer=buf, repeat=True, one_hot=False, normalize=False)
    c = shape.classes
    return [
        (_row("p4_imgshard_float32", "4. imgshard TFRecord, float32 + one-hot", shape.io("float32", read)),
         tf_iterator(floats)),
        (_row("p4_imgshard_sparse", "4. imgshard TFRecord, float32 + sparse labels (one_hot=False)",
              shape.io("sparse", read), note="for sparse_categorical_crossentropy"), tf_iterator(sparse)),
        (_row("p5_imgshard_compact", "5. imgshard TFRecord, compact (uint8 + class map)", shape.io("compact", read)),
         tf_iterator(compact)),
        (_row("p5_imgshard_compact_expand", "5. compact + expand_batch (device side; on CPU here)",
              shape.io("float32", read), note="expansion runs on the CPU: no accelerator"),
         tf_iterator(compact, lambda x, y: expand_batch(x, y, c))),
    ]


def npz_pipelines(opts: BenchOptions, sources: Sources, split: str, work: str, shape: Shape, say: Say) -> Pipelines:
    """Pipeline 6: the NPZ reader (compressed and stored, compact) against a one-process `np.load` loop."""
    import readers

    out: Pipelines = []
    for comp in ("deflate", "none"):
        path = os.path.join(work, f"npz_{comp}")
        say(f"converting to NPZ ({comp})")
        run_convert(sources.root, path, opts.size, workers=os.cpu_count() or 1, fmt="npz", compression=comp)
        nds = readers.open(path)
        paths = [s.path for s in nds.shards(split)]
        io = shape.io("compact", stored_bytes_per_sample(paths, nds.splits[split]))
        pn = nds.tf_dataset(split, opts.batch_size, shuffle_buffer=opts.shuffle_buffer, one_hot=False,
                            normalize=False, repeat=True)
        name = "compressed" if comp == "deflate" else "stored"
        rng = np.random.default_rng(opts.seed)
        out += [(_row(f"p6_imgshard_npz_{comp}", f"6. imgshard NPZ ({name}), compact", io), tf_iterator(pn)),
                (_row(f"p6_np_load_{comp}", f"6. np.load loop, 1 process ({name})", io),
                 forever(lambda paths=paths, rng=rng: baselines.np_load_batches(paths, opts.batch_size, rng)))]
    return out


#: The augmentation rows' recipe (issue 15); the crop is the bench size, the shards 1.25x it.
AUGMENT_RECIPE = dict(hflip=0.5, scale=(0.75, 1.5), brightness=0.2, contrast=0.2, saturation=0.2, hue=0.02)


def augment_pipelines(opts: BenchOptions, sources: Sources, work: str, shape: Shape, say: Say) -> Pipelines:
    """Pipeline 8: shards converted at 1.25x the training size (640x640 for 512x512), read
    plain and with `Augment(**AUGMENT_RECIPE, crop=size)`, float32 + one-hot and compact;
    pipeline 11 reads the same shards (`_rotate_rows`)."""
    import readers
    from readers.augment import Augment

    h, w = opts.size
    big = (h * 5 // 4, w * 5 // 4)
    out = os.path.join(work, "augment_src")
    say(f"converting at {big[0]}x{big[1]} for the augmentation rows")
    run_convert(sources.root, out, big, workers=os.cpu_count() or 1)
    ds = readers.open(out)
    split = next(iter(ds.splits))
    read = stored_bytes_per_sample([s.path for s in ds.shards(split)], ds.splits[split])
    big_shape = Shape(big[0], big[1], shape.classes, shape.mask_bytes)
    aug = Augment(**AUGMENT_RECIPE, crop=(h, w))
    kw = dict(shuffle_buffer=opts.shuffle_buffer, repeat=True)
    recipe = "hflip, scale 0.75-1.5, crop, colour jitter"
    plain = ds.tf_dataset(split, opts.batch_size, **kw)
    floats = ds.tf_dataset(split, opts.batch_size, seed=opts.seed, augment=aug, **kw)
    compact = ds.tf_dataset(split, opts.batch_size, seed=opts.seed, augment=aug, normalize=False, one_hot=False, **kw)
    device = ds.tf_dataset(split, opts.batch_size, seed=opts.seed, augment=aug, normalize=False, one_hot=False,
                           augment_on="device", **kw)
    b = f"{big[0]}x{big[1]}"
    device_io = Io(read, big_shape.written("compact") + 19 * 4)
    return [
        (_row("p8_plain_big", f"8. imgshard {b} shards, float32 + one-hot, no augmentation",
              big_shape.io("float32", read)), tf_iterator(plain)),
        (_row("p8_augment_float32", f"8. {b} shards augmented to {h}x{w}, float32 + one-hot",
              shape.io("float32", read), note=recipe), tf_iterator(floats)),
        (_row("p8_augment_compact", f"8. {b} shards augmented to {h}x{w}, compact", shape.io("compact", read),
              note=recipe), tf_iterator(compact)),
        (_row("p8_augment_device_feed", f"8. {b} shards, augment_on='device': the host's part", device_io,
              note="uint8 + 19 floats/sample; the GPU augments"), tf_iterator(device, lambda x, y: (x[0], y))),
    ]


def reader_pipelines(opts: BenchOptions, sources: Sources, tfr: str, work: str, say: Say) -> Pipelines:
    """Every reader pipeline (rows 1-6 and 8-11), built once, in table order."""
    import readers

    ds = readers.open(tfr)
    split = sources.split if sources.split in ds.splits else next(iter(ds.splits))
    first = next(iter(ds.records(split)))
    h, w = opts.size
    shape = Shape(h, w, ds.num_classes, first.mask.dtype.itemsize)
    return [*png_pipelines(opts, sources, shape), *saved_pipelines(opts, ds, split, work, shape, say),
            *imgshard_pipelines(opts, ds, split, shape), *npz_pipelines(opts, sources, split, work, shape, say),
            *augment_pipelines(opts, sources, work, shape, say), *band_rows(opts, work, say),
            *_keras_rows(opts, ds, split, shape), *_rotate_rows(opts, work, shape, say)]


def band_rows(opts: BenchOptions, work: str, say: Say) -> Pipelines:
    """Pipeline 9 (`converter.bench.bands`): uint16 4-band rows; none where tifffile is not installed."""
    try:
        import tifffile  # noqa: F401  (the `tiff` extra writes the sources)
    except ImportError:
        say("pipeline 9 (uint16 4-band) skipped: pip install 'imgshard[tiff]'")
        return []
    from converter.bench.bands import band_pipelines

    return band_pipelines(opts, work, say)


def _rotate_rows(opts: BenchOptions, work: str, shape: Shape, say: Say) -> Pipelines:
    """Rows 11 (`converter.bench.augbench`) on pipeline 8's 1.25x shards: rotate=10 against
    albumentations and Keras preprocessing layers."""
    import readers

    ds = readers.open(os.path.join(work, "augment_src"))
    split = next(iter(ds.splits))
    read = stored_bytes_per_sample([s.path for s in ds.shards(split)], ds.splits[split])
    return rotate_pipelines(opts, ds, split, read, shape, say)


def _keras_rows(opts: BenchOptions, ds: Any, split: str, shape: Shape) -> Pipelines:
    """Rows 10 (`converter.bench.kerasfeed`): keras_dataset as Keras feeds a PyDataset."""
    from converter.bench.kerasfeed import keras_pipelines

    read = stored_bytes_per_sample([s.path for s in ds.shards(split)], ds.splits[split])
    return keras_pipelines(opts, ds, split, shape,
                           lambda key, label, mode, note="": _row(key, label, shape.io(mode, read), note))


__all__ = ["AUGMENT_RECIPE", "Io", "Shape", "reader_pipelines", "stored_bytes_per_sample"]
