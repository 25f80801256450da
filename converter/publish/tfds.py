"""TensorFlow Datasets metadata, so that a TFRecord output folder is also a TFDS dataset.

`tfds.builder_from_directory(OUT)` needs, next to the shards:

* ``dataset_info.json``: the name, version, file format, and per split its shard
  lengths, byte count and ``filepathTemplate`` (TFDS >= 4.9);
* ``features.json``: the `FeaturesDict` (how to parse an Example);
* ``label.labels.txt``: the class names of a ``ClassLabel`` feature (classification).

The JSON is written by hand, here, from the manifest alone, so conversion never imports
TensorFlow Datasets; tests load every kind of output through the real TFDS.

Shard names. Our shards are ``{split}-{index:05d}.tfrecord`` and are never renamed;
indices only grow, and a rewritten shard gets a new index, so a split's indices can
have gaps and need not start at 0. A TFDS split reads the files
``template.format(SPLIT=split, SHARD_INDEX=f"{i:05d}")`` for i in
``range(len(shardLengths))``, and skips -- without opening it -- every file whose shard
length is 0 (`shard_utils.get_file_instructions`: "Empty shard"). So the template
``{SPLIT}-{SHARD_INDEX}.tfrecord`` names our files exactly, and every index without a
file of ours gets shard length 0: the gaps cost one number each in
``dataset_info.json`` and nothing else.

Features, matching the records that `readers.formats.tfrecord.writer` writes (extra features
such as ``height`` and ``width`` are ignored by TFDS's parser):

* ``image``: ``Tensor(shape=(H, W, C), dtype=uint8|uint16, encoding=bytes)``, the raw bytes (16-bit and
  multi-band images included: the manifest's dtype and channels);
* ``mask`` (segmentation): ``Tensor(shape=(H, W), dtype=uint8|uint16, encoding=bytes)``
  (``(H, W, C)`` uint8 one-hot planes with ``--mask-encoding onehot``); TFDS decodes
  raw bytes little-endian, as we store them;
* encoded storage (``--image-encoding png|jpeg|webp``): ``image`` is an ``Image``
  feature (``encodingFormat`` png/jpeg) and ``mask`` an ``Image`` of shape (H, W, 1),
  uint8 or uint16 PNG: the class map, also for one-hot masks (TFDS cannot expand it).
  WebP is not written: TFDS's ``Image`` decodes WebP as a one-frame animation and fails;
* ``label`` (classification): ``ClassLabel`` (int64) with the class names;
* ``key``: ``Text``.

Not written (and removed if present) for NPZ output, for gzip TFRecords (TFDS reads
uncompressed TFRecord files only), for WebP images (see above), and when a shard index passes 99998 (TFDS then pads
indices to 6 digits, ours stay at 5).
"""

from __future__ import annotations

import json
import logging
import os
import re

from converter.fsutil import fsync_dir, write_atomic
from readers.manifest import Manifest
from readers.tasks import task_kind

log = logging.getLogger(__name__)

DATASET_INFO_NAME = "dataset_info.json"
FEATURES_NAME = "features.json"
LABEL_FEATURE = "label"
LABELS_FILE_NAME = f"{LABEL_FEATURE}.labels.txt"
#: Every file this module may write; removed when the output cannot be read by TFDS.
TFDS_FILES = (DATASET_INFO_NAME, FEATURES_NAME, LABELS_FILE_NAME)

TFDS_DATASET_NAME = "imgshard"
TFDS_VERSION = "1.0.0"
FILEPATH_TEMPLATE = "{SPLIT}-{SHARD_INDEX}.tfrecord"
#: TFDS pads SHARD_INDEX to max(5, digits of the shard count); ours are 5 digits.
MAX_SHARD_INDEX = 99998

_TENSOR = "tensorflow_datasets.core.features.tensor_feature.Tensor"
_TEXT = "tensorflow_datasets.core.features.text_feature.Text"
_IMAGE = "tensorflow_datasets.core.features.image_feature.Image"
_CLASS_LABEL = "tensorflow_datasets.core.features.class_label_feature.ClassLabel"
_FEATURES_DICT = "tensorflow_datasets.core.features.features_dict.FeaturesDict"


def unsupported_reason(manifest: Manifest) -> str | None:
    """Why this dataset cannot be a TFDS folder, or None when it can."""
    if manifest.format != "tfrecord":
        return f"format {manifest.format!r}: TFDS metadata is written for TFRecord output only"
    if manifest.compression != "none":
        return f"compression {manifest.compression!r}: TFDS reads uncompressed TFRecord files only"
    if manifest.image.get("codec") == "webp":
        return ("image encoding 'webp': TFDS's Image feature decodes WebP as a one-frame animation "
                "(1, H, W, 3) and fails on the shape")
    for split, shard in manifest.iter_shards():
        index = shard_index(split, shard.file)
        if index is None:
            return f"shard {shard.file!r} is not named {split}-NNNNN.tfrecord"
        if index > MAX_SHARD_INDEX:
            return f"shard {shard.file!r} has an index over {MAX_SHARD_INDEX}, which TFDS names with 6 digits"
    return None


def shard_index(split: str, file: str) -> int | None:
    m = re.fullmatch(re.escape(split) + r"-(\d{5})\.tfrecord", file)
    return int(m.group(1)) if m else None


def shard_lengths(manifest: Manifest, split: str) -> list[int]:
    """Records per shard index 0..max, 0 where the split has no file of that index."""
    shards = manifest.shards(split)
    indices = {shard_index(split, s.file): s.records for s in shards}
    if not indices:
        return []
    lengths = [0] * (max(i for i in indices if i is not None) + 1)
    for i, n in indices.items():
        lengths[i] = n  # type: ignore[index]
    return lengths


def _tensor(shape: tuple[int, ...], dtype: str) -> dict:
    return {"pythonClassName": _TENSOR,
            "tensor": {"dtype": dtype, "encoding": "bytes", "shape": {"dimensions": [str(d) for d in shape]}}}


def _label_names_ok(names: list[str]) -> bool:
    """TFDS reads the names file line by line, stripped, skipping blank lines."""
    return all(n and n == n.strip() and "\n" not in n and "\r" not in n for n in names)


def _image(shape: tuple[int, ...], dtype: str, codec: str) -> dict:
    """A TFDS `Image` feature of PNG or JPEG bytes (TFDS knows no other encoding format)."""
    image: dict = {"dtype": dtype, "encodingFormat": codec, "shape": {"dimensions": [str(d) for d in shape]}}
    return {"pythonClassName": _IMAGE, "image": image}


def features_json(manifest: Manifest) -> dict:
    h, w, c = manifest.image_shape
    image_codec = str(manifest.image.get("codec", "raw"))
    dtype = str(manifest.image.get("dtype", "uint8"))  # uint16 and 1..16 bands: raw bytes TFDS decodes as they are
    image = _tensor((h, w, c), dtype) if image_codec == "raw" else _image((h, w, c), "uint8", image_codec)
    features: dict[str, dict] = {"image": image, "key": {"pythonClassName": _TEXT, "text": {}}}
    if task_kind(manifest.task).dense:
        mask = manifest.mask or {}
        if mask.get("codec", "raw") != "raw":  # a PNG class map, also for one-hot masks (see FORMATS.md)
            wide = mask.get("dtype") == "uint16" or int(mask.get("ignore_index") or 0) > 255
            features["mask"] = _image((h, w, 1), "uint16" if wide else "uint8", "png")
        elif mask.get("encoding") == "onehot":
            features["mask"] = _tensor((h, w, manifest.num_classes), "uint8")
        else:
            features["mask"] = _tensor((h, w), str(mask.get("dtype", "uint8")))
    else:
        features[LABEL_FEATURE] = {"pythonClassName": _CLASS_LABEL,
                                   "classLabel": {"numClasses": str(manifest.num_classes)}}
    return {"featuresDict": {"features": features}, "pythonClassName": _FEATURES_DICT}


def _description(manifest: Manifest) -> str:
    h, w, _ = manifest.image_shape
    names = [c.name if c.color is None else f"{c.name} {tuple(c.color)}" for c in manifest.classes]
    target = "mask (class map, ignore index {})".format((manifest.mask or {}).get("ignore_index")) \
        if task_kind(manifest.task).dense else "label (class index)"
    return (f"{manifest.task.capitalize()} dataset converted by imgshard {manifest.tool_version}: "
            f"{h}x{w} RGB images with a {target} and the source key. "
            f"Classes: {', '.join(f'{i}: {n}' for i, n in enumerate(names))}. "
            f"The imgshard manifest (imgshard.json) is the source of truth; this file is derived from it.")


def dataset_info_json(manifest: Manifest) -> dict:
    target = task_kind(manifest.task).target
    splits = []
    for split in sorted(manifest.splits):
        entry = manifest.split(split)
        splits.append({
            "filepathTemplate": FILEPATH_TEMPLATE,
            "name": split,
            "numBytes": str(sum(s.bytes for s in entry.shards)),
            "shardLengths": [str(n) for n in shard_lengths(manifest, split)],
        })
    return {
        "description": _description(manifest),
        "fileFormat": "tfrecord",
        "name": TFDS_DATASET_NAME,
        "splits": splits,
        "supervisedKeys": {"tuple": {"items": [{"featureKey": "image"}, {"featureKey": target}]}},
        "version": TFDS_VERSION,
    }


def _dumps(doc: dict) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def tfds_files(manifest: Manifest) -> dict[str, bytes]:
    """File name -> bytes of the TFDS metadata of `manifest` ({} when unsupported).

    Ordered so that ``dataset_info.json`` comes last (TFDS starts reading from it).
    """
    if unsupported_reason(manifest) is not None:
        return {}
    files: dict[str, bytes] = {}
    if not task_kind(manifest.task).dense:
        names = [c.name for c in manifest.classes]
        if _label_names_ok(names):
            files[LABELS_FILE_NAME] = ("\n".join(names) + "\n").encode("utf-8")
        else:
            log.warning("class names with surrounding spaces or line breaks cannot be listed in %s; TFDS will "
                        "show class numbers only", LABELS_FILE_NAME)
    files[FEATURES_NAME] = _dumps(features_json(manifest))
    files[DATASET_INFO_NAME] = _dumps(dataset_info_json(manifest))
    return files


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def sync_tfds_metadata(out_dir: str, manifest: Manifest) -> list[str]:
    """Bring the TFDS files of `out_dir` in step with `manifest`; return the names written or removed.

    Each file is replaced atomically, and only when its bytes differ, so a run with
    nothing new changes nothing. Call it before publishing the manifest: every shard it
    names is already on disk, and the manifest stays the last thing published.
    """
    files = tfds_files(manifest)
    changed: list[str] = []
    if not files:
        reason = unsupported_reason(manifest)
        for name in TFDS_FILES:  # dataset_info.json first: TFDS no longer sees a dataset
            path = os.path.join(out_dir, name)
            if os.path.exists(path):
                os.unlink(path)
                changed.append(name)
        if changed:
            fsync_dir(out_dir)
            log.info("removed the TFDS metadata (%s)", reason)
        return changed
    fsync_dir(out_dir)  # the shards the metadata names are durable first
    stale = [n for n in TFDS_FILES if n not in files and os.path.exists(os.path.join(out_dir, n))]
    for name in stale:
        os.unlink(os.path.join(out_dir, name))
        changed.append(name)
    for name, data in files.items():
        path = os.path.join(out_dir, name)
        if _read(path) != data:
            write_atomic(path, data)
            changed.append(name)
    return changed


__all__ = [
    "DATASET_INFO_NAME",
    "FEATURES_NAME",
    "FILEPATH_TEMPLATE",
    "LABELS_FILE_NAME",
    "TFDS_FILES",
    "dataset_info_json",
    "features_json",
    "shard_lengths",
    "sync_tfds_metadata",
    "tfds_files",
    "unsupported_reason",
]
