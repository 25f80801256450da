"""Tiny but realistic converted datasets for the reader tests (and benchmarks).

Writes shards the way the converter does -- TFRecord with `tf.io.TFRecordWriter` and
`tf.train.Example` (features image/mask|label/height/width/key), NPZ with `np.savez` /
`np.savez_compressed` -- and a `Manifest` built from the dataclasses. Images are
textured (gradients plus noise) and masks are blocky class regions with some ignored
(255) pixels: never all zeros.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from readers.formats import SUFFIXES, FileFormat
from readers.manifest import (
    MANIFEST_NAME,
    ClassInfo,
    Manifest,
    SampleEntry,
    ShardEntry,
    SourceFingerprint,
    SplitEntry,
)

COLORS = [(0, 0, 0), (128, 0, 0), (0, 128, 0), (128, 128, 0), (0, 0, 128), (128, 0, 128), (0, 128, 128)]
IGNORE = 255


@dataclass
class Sample:
    key: str
    image: np.ndarray
    mask: np.ndarray | None = None
    label: int | None = None


def make_samples(n: int, height: int, width: int, num_classes: int, *, seed: int = 0, prefix: str = "train",
                 task: str = "segmentation", mask_encoding: str = "class_map", mask_dtype: str = "uint8",
                 ignore_fraction: float = 0.05) -> list[Sample]:
    """`n` random textured samples."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    out = []
    for i in range(n):
        base = (xx * rng.uniform(0.2, 2.0) + yy * rng.uniform(0.2, 2.0))[..., None] + rng.uniform(0, 255, 3)
        image = (base + rng.normal(0, 12, (height, width, 3))).astype(np.int64) % 256
        image = image.astype(np.uint8)
        key = f"{prefix}/{i:05d}.png"
        if task == "classification":
            out.append(Sample(key, image, label=int(rng.integers(num_classes))))
            continue
        block = max(1, min(height, width) // 8)
        coarse = rng.integers(0, num_classes, (height // block + 1, width // block + 1))
        cmap = np.kron(coarse, np.ones((block, block), np.int64))[:height, :width]
        cmap[rng.random((height, width)) < ignore_fraction] = IGNORE
        if mask_encoding == "onehot":
            mask = (cmap[..., None] == np.arange(num_classes)).astype(np.uint8)
        else:
            mask = cmap.astype(np.uint16 if mask_dtype == "uint16" else np.uint8)
        out.append(Sample(key, image, mask=mask))
    return out


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_tfrecord_shard(path: str, samples: Sequence[Sample], compression: str = "none") -> None:
    import tensorflow as tf

    options = tf.io.TFRecordOptions(compression_type="GZIP" if compression == "gzip" else "")
    with tf.io.TFRecordWriter(path, options) as writer:
        for s in samples:
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[s.image.tobytes()])),
                "height": tf.train.Feature(int64_list=tf.train.Int64List(value=[s.image.shape[0]])),
                "width": tf.train.Feature(int64_list=tf.train.Int64List(value=[s.image.shape[1]])),
                "key": tf.train.Feature(bytes_list=tf.train.BytesList(value=[s.key.encode("utf-8")])),
            }
            if s.mask is not None:
                mask = s.mask.astype(s.mask.dtype.newbyteorder("<"))
                feature["mask"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[mask.tobytes()]))
            else:
                feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[s.label]))
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString(deterministic=True))


def write_npz_shard(path: str, samples: Sequence[Sample], compression: str = "deflate") -> None:
    arrays = {"images": np.stack([s.image for s in samples]),
              "keys": np.array([s.key for s in samples])}
    if samples[0].mask is not None:
        arrays["masks"] = np.stack([s.mask for s in samples])
    else:
        arrays["labels"] = np.array([s.label for s in samples], np.int64)
    with open(path, "wb") as f:
        (np.savez_compressed if compression == "deflate" else np.savez)(f, **arrays)


def _fingerprint(key: str) -> SourceFingerprint:
    return SourceFingerprint(key, 1, 1, "0" * 64)


def write_dataset(root: str | os.PathLike, fmt: str = "tfrecord", *, splits: dict[str, int] | None = None,
                  records_per_shard: int = 4, compression: str | None = None, height: int = 16, width: int = 12,
                  num_classes: int = 4, task: str = "segmentation", mask_encoding: str = "class_map",
                  mask_dtype: str = "uint8", seed: int = 0) -> tuple[Manifest, dict[str, list[Sample]]]:
    """Write a dataset with shards and manifest into `root`; returns (manifest, samples per split)."""
    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    file_format = FileFormat.parse(fmt)
    if compression is None:
        compression = "none" if file_format is FileFormat.TFRECORD else "deflate"
    splits = splits or {"train": 10}
    all_samples: dict[str, list[Sample]] = {}
    split_entries = {}
    for s_i, (split, n) in enumerate(splits.items()):
        samples = make_samples(n, height, width, num_classes, seed=seed * 100 + s_i, prefix=split, task=task,
                               mask_encoding=mask_encoding, mask_dtype=mask_dtype)
        all_samples[split] = samples
        shards = []
        for k, start in enumerate(range(0, n, records_per_shard)):
            chunk = samples[start:start + records_per_shard]
            name = f"{split}-{k:05d}{SUFFIXES[file_format]}"
            path = os.path.join(root, name)
            if file_format is FileFormat.TFRECORD:
                write_tfrecord_shard(path, chunk, compression)
            else:
                write_npz_shard(path, chunk, compression)
            class_pixels = [0] * num_classes
            ignore = 0
            if task == "segmentation":
                for s in chunk:
                    cmap = s.mask if mask_encoding == "class_map" else np.where(
                        s.mask.max(-1) == 0, IGNORE, s.mask.argmax(-1))
                    counts = np.bincount(cmap.ravel().astype(np.int64), minlength=256)
                    for c in range(num_classes):
                        class_pixels[c] += int(counts[c])
                    ignore += int(counts[IGNORE]) if len(counts) > IGNORE else 0
            shards.append(ShardEntry(
                file=name, records=len(chunk), bytes=os.path.getsize(path), digest="sha256:" + _sha256(path),
                class_pixels=tuple(class_pixels), ignore_pixels=ignore,
                samples=tuple(SampleEntry(s.key, _fingerprint(s.key), _fingerprint(s.key) if s.mask is not None
                                          else None, s.label) for s in chunk),
            ))
        split_entries[split] = SplitEntry(shards=tuple(shards), next_shard_index=len(shards))
    manifest = Manifest(
        tool_version="0.1.0",
        task=task,
        format=file_format.value,
        compression=compression,
        options={},
        image={"height": height, "width": width, "channels": 3, "dtype": "uint8"},
        mask=({"dtype": mask_dtype, "encoding": mask_encoding, "ignore_index": IGNORE}
              if task == "segmentation" else None),
        classes=tuple(ClassInfo(f"class{c}", COLORS[c % len(COLORS)] if task == "segmentation" else None)
                      for c in range(num_classes)),
        splits=split_entries,
    )
    with open(os.path.join(root, MANIFEST_NAME), "w", encoding="utf-8") as f:
        f.write(manifest.dumps())
    return manifest, all_samples


def write_many_class_source(src: str | os.PathLike, *, samples: int, height: int, width: int, seed: int,
                            num_classes: int = 300) -> None:
    """A CamVid-layout source with more than 255 classes (uint16 class maps): textured
    images and blocky colour masks of 8x8-pixel class regions (height, width multiples of 8)."""
    from pathlib import Path

    from PIL import Image

    from converter.testing import synth

    src = Path(src)
    classes = [(f"c{i}", ((i * 7) % 256, (i * 13) % 256, i // 2)) for i in range(num_classes)]
    (src / "train").mkdir(parents=True)
    (src / "train_labels").mkdir()
    (src / "class_dict.csv").write_text("name,r,g,b\n" + "".join(f"{n},{r},{g},{b}\n" for n, (r, g, b) in classes))
    rng = np.random.default_rng(seed)
    colors = np.array([c for _, c in classes], dtype=np.uint8)
    for i in range(samples):
        Image.fromarray(synth.textured_image(height, width, rng)).save(src / "train" / f"f{i}.png")
        cls = np.kron(rng.integers(0, num_classes, (height // 8, width // 8)), np.ones((8, 8), dtype=np.int64))
        Image.fromarray(colors[cls]).save(src / "train_labels" / f"f{i}_L.png")
