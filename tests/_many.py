"""A dataset of many tiny samples, built cheaply, for the memory test of a no-op run.

The source tree is `scripts/many_bench.py`'s: 64 textured 8x8 pairs hard-linked N
times. The dataset is what `imgshard convert SRC OUT --size 8x8` writes, made without
decoding N times: each of the 64 variants goes once through the converter's own
`SampleTransformer`; every sample's record and fingerprints are then written with the
converter's shard writer and index writer, and the manifest is published as a run
publishes it. `verify --deep` accepts it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import numpy as np

from converter import __version__
from converter.discover.sources import discover_sources
from converter.discover.layout import SourceSample
from converter.options import OutputOptions, SourceSpec
from converter.publish.manifest import publish_manifest
from converter.transform.sample import SampleTransformer
from converter.write.base import ShardWriter
from readers.formats.encoder import SampleArrays
from converter.write.index import source_bytes, write_index
from readers.formats.registry import encoder_for
from readers.manifest import Manifest, SampleEntry, ShardEntry, SourceFingerprint, SplitEntry

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from many_bench import VARIANTS, grow_tree, make_variants  # noqa: E402

RECORDS_PER_SHARD = 50_000


def make_many(root: Path, n: int) -> tuple[Path, Path]:
    """(source tree, dataset folder) with n samples in split train."""
    src, out = root / "src", root / "out"
    variants = make_variants(root / "variants")
    grow_tree(src, variants, 0, n)
    # the options and classes a run resolves for this tree (mask semantics included)
    _, classes, options = discover_sources(SourceSpec(root=str(src)), OutputOptions(size="8x8"))
    transform = SampleTransformer(options, classes, str(src), 10**9)
    done = [transform(SourceSample("train", f"train/s{i:08d}.png", str(src / "train" / f"s{i:08d}.png"),
                                   str(src / "train_labels" / f"s{i:08d}_L.png"))) for i in range(VARIANTS)]
    out.mkdir()
    encoder = encoder_for(options.format)
    shards = []
    for k, start in enumerate(range(0, n, RECORDS_PER_SHARD)):
        name, entries = f"train-{k:05d}.tfrecord", []
        pixels, images = np.zeros(len(classes), np.int64), np.zeros(len(classes), np.int64)
        with ShardWriter(str(out), name, encoder, compression="none", capacity=RECORDS_PER_SHARD) as w:
            for i in range(start, min(n, start + RECORDS_PER_SHARD)):
                t = done[i % VARIANTS]
                key = f"train/s{i:08d}.png"
                w.add(SampleArrays(key, t.image, t.mask, None))
                entries.append(SampleEntry(key, _fp(src, key, t.entry.image),
                                           _fp(src, f"train_labels/s{i:08d}_L.png", t.entry.mask)))
                pixels += t.class_pixels
                images += t.class_pixels > 0
        r = w.result
        shards.append(ShardEntry(r.file, r.records, r.bytes, r.digest, tuple(int(c) for c in pixels), 0,
                                 class_images=tuple(int(c) for c in images), index=write_index(str(out), name, entries),
                                 source_bytes=source_bytes(entries)))
    manifest = Manifest(tool_version=__version__, task="segmentation", format="tfrecord", compression="none",
                        options=options.to_json(), image={"height": 8, "width": 8, "channels": 3, "dtype": "uint8"},
                        mask={"dtype": "uint8", "encoding": "class_map", "ignore_index": 255}, classes=classes,
                        splits={"train": SplitEntry(tuple(shards), len(shards))})
    publish_manifest(str(out), manifest)
    return src, out


def _fp(src: Path, rel: str, like: SourceFingerprint) -> SourceFingerprint:
    st = os.stat(src / rel)
    return dataclasses.replace(like, path=rel, size=st.st_size, mtime_ns=st.st_mtime_ns)
