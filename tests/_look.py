"""Helpers for the scan / inspect / preview / class-statistics tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from converter import __version__
from converter.convert import convert
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.publish.manifest import publish_manifest
from converter.write.base import ShardWriter
from readers.formats.encoder import SampleArrays
from readers.formats.registry import encoder_for
from readers.manifest import ClassInfo, Manifest, SampleEntry, ShardEntry, SourceFingerprint, SplitEntry

SIZE = (32, 48)


def convert_tiny(src: Path | str, out: Path | str, **options) -> Manifest:
    """Convert a CamVid-layout folder at 32x48 with one worker; return the manifest."""
    opts = OutputOptions(size=options.pop("size", SIZE), **options)
    result = convert(SourceSpec(root=str(src)), str(out), opts, RunOptions(workers=1))
    assert result.manifest is not None
    return result.manifest


def add_unused_class(csv_path: Path | str, name: str = "Bicyclist", color=(0, 128, 192)) -> None:
    """Append a class that no mask uses to a class_dict.csv."""
    with open(csv_path, "a", encoding="utf-8") as f:
        f.write(f"\n{name}, {color[0]}, {color[1]}, {color[2]}, 1\n")


def copy_pair(ds, src_split: str, index: int, dst_split: str, new_stem: str) -> tuple[Path, Path]:
    """Copy pair `index` of `src_split` into `dst_split` under a new name (a leak)."""
    image, mask = ds.pairs[src_split][index]
    root = Path(ds.root)
    new_image = root / dst_split / f"{new_stem}{image.suffix}"
    mask_suffix = "_L" if mask.stem.endswith("_L") else ""
    new_mask = root / f"{dst_split}_labels" / f"{new_stem}{mask_suffix}.png"
    shutil.copyfile(image, new_image)
    shutil.copyfile(mask, new_mask)
    return new_image, new_mask


def write_classification(syn, out: Path | str, size: tuple[int, int] = (24, 24)) -> Manifest:
    """Write a classification dataset by hand (TFRecord shards + manifest), one shard per split.

    Stands in for the class-folder converter (another issue): records carry `.label`,
    classes have colour None, class_pixels/class_images count records per label.
    """
    out = str(out)
    os.makedirs(out, exist_ok=True)
    classes = tuple(ClassInfo(name, None) for name in syn.classes)
    splits = {}
    encoder = encoder_for("tfrecord")
    for split, files in sorted(syn.files.items()):
        name = split or "train"
        counts = np.zeros(len(classes), np.int64)
        entries = []
        with ShardWriter(out, f"{name}-00000.tfrecord", encoder, compression="none", capacity=len(files)) as w:
            for path, label in files:
                with Image.open(path) as im:
                    rgb = np.asarray(im.convert("RGB").resize((size[1], size[0]), Image.BILINEAR))
                key = f"{name}/{Path(path).parent.name}/{Path(path).name}"
                w.add(SampleArrays(key, np.ascontiguousarray(rgb), None, int(label)))
                fp = SourceFingerprint(key, os.path.getsize(path), 0, "0" * 64)
                entries.append(SampleEntry(key, fp, None, int(label)))
                counts[label] += 1
        r = w.result
        shard = ShardEntry(r.file, r.records, r.bytes, r.digest, tuple(int(c) for c in counts), 0, tuple(entries),
                           class_images=tuple(int(c) for c in counts))
        splits[name] = SplitEntry((shard,), 1)
    options = OutputOptions(size=size, task="classification").to_json()
    manifest = Manifest(
        tool_version=__version__, task="classification", format="tfrecord", compression="none", options=options,
        image={"height": size[0], "width": size[1], "channels": 3, "dtype": "uint8"}, mask=None,
        classes=classes, splits=splits,
        history=({"time": "2026-11-21T06:00:00Z", "added": sum(s.num_samples for s in splits.values()),
                  "replaced": 0, "pruned": 0, "tool_version": __version__},),
    )
    publish_manifest(out, manifest)
    return manifest
