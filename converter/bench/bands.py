"""Pipeline 9 of `imgshard bench`: images beyond 8-bit RGB (issue 28). A 4-band uint16
dataset at the bench size (generated multi-band TIFFs, textured over the full 16-bit
range, index masks) read with `tf_dataset` as float32 + one-hot, plain and augmented
(flips, scale, crop: colour jitter is for RGB), timed in the same interleaved rounds as
the other reader rows."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from converter.bench.options import BenchOptions
from converter.bench.result import Row
from converter.bench.rounds import tf_iterator

BANDS = 4
#: The augmented row's recipe: geometry only (colour jitter needs RGB).
BAND_AUGMENT = dict(hflip=0.5, scale=(0.75, 1.5))


def _write_sources(root: str, n: int, size: tuple[int, int], classes: int, seed: int) -> None:
    """`n` (H, W, 4) uint16 TIFFs in root/images, class-map PNGs in root/masks (cached: kept when complete)."""
    import tifffile
    from PIL import Image

    images, masks = os.path.join(root, "images"), os.path.join(root, "masks")
    if os.path.isdir(masks) and len(os.listdir(masks)) == n:
        return
    os.makedirs(images, exist_ok=True)
    os.makedirs(masks, exist_ok=True)
    rng = np.random.default_rng(seed)
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    for i in range(n):
        bands = [np.sin(xx / (9 + 3 * b) + i) * np.cos(yy / (11 + 2 * b) - i) for b in range(BANDS)]
        stack = np.stack([(0.5 + 0.45 * b) * 60000 for b in bands], -1) + rng.integers(0, 5000, (h, w, BANDS))
        tifffile.imwrite(os.path.join(images, f"tile_{i:04d}.tif"), stack.astype(np.uint16),
                         photometric="minisblack", planarconfig="contig", compression="zlib")
        cmap = (np.digitize(bands[0], np.linspace(-1, 1, classes + 1)[1:-1])).astype(np.uint8)
        Image.fromarray(cmap).save(os.path.join(masks, f"tile_{i:04d}.png"))


def band_pipelines(opts: BenchOptions, work: str, say: Callable[[str], None]) -> list[tuple[Row, Any]]:
    """Rows p9: a uint16 4-band dataset at `opts.size`, float32 + one-hot, plain and augmented."""
    import readers
    from converter.convert import convert
    from converter.options import LabelOptions, OutputOptions, RunOptions, SourceSpec
    from readers.augment import Augment

    h, w = opts.size
    n = max(opts.batch_size * 2, min(opts.samples, 64))
    src = os.path.join(opts.cache, f"bench-bands-{n}-{h}x{w}-{opts.num_classes}c-seed{opts.seed}")
    say(f"writing {n} {BANDS}-band uint16 TIFFs for pipeline 9")
    _write_sources(src, n, (h, w), opts.num_classes, opts.seed)
    out = os.path.join(work, "bands")
    convert(SourceSpec(images=os.path.join(src, "images"), masks=os.path.join(src, "masks")), out,
            OutputOptions(size=(h, w), labels=LabelOptions(num_classes=opts.num_classes)), RunOptions(rebuild=True))
    ds = readers.open(out)
    split = next(iter(ds.splits))
    read = round(sum(os.path.getsize(s.path) for s in ds.shards(split)) / ds.splits[split])
    written = h * w * (4 * BANDS + 4 * opts.num_classes)  # float32 bands + float32 one-hot
    kw = dict(shuffle_buffer=opts.shuffle_buffer, repeat=True)
    plain = ds.tf_dataset(split, opts.batch_size, **kw)
    aug = ds.tf_dataset(split, opts.batch_size, seed=opts.seed, augment=Augment(**BAND_AUGMENT, crop=(h, w)), **kw)
    label = f"9. uint16 {BANDS}-band {h}x{w}"
    return [
        (Row("p9_bands_float32", f"{label}, float32 + one-hot", "reader", written, bytes_read=read),
         tf_iterator(plain)),
        (Row("p9_bands_augment", f"{label} augmented, float32 + one-hot", "reader", written, bytes_read=read,
             note="hflip, scale 0.75-1.5, crop (no colour jitter: RGB only)"), tf_iterator(aug)),
    ]


__all__ = ["BAND_AUGMENT", "band_pipelines"]
