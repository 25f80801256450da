"""CPU time per sample of the augmentation kernels alone: imgshard's C kernel against
albumentations (OpenCV) on the same recipe, in interleaved rounds in one process.

    python scripts/augment_bench.py [--size 512x512] [--source 640x640] [--rounds 5] [--batches 4]

The recipe is issue 29's: `Augment(hflip=0.5, scale=(0.5, 2.0), crop=size, rotate=10,
brightness=0.2)` against `converter.bench.augbench.albumentations_recipe` (HorizontalFlip,
Affine, PadIfNeeded, RandomCrop, RandomBrightnessContrast on image and mask). Each round
times every contender on the same batches, one after the other (one thread, CPU time of
the process: `time.process_time`); the first round is a warm-up and dropped; medians of
the others. "compact": uint8 image + class map; "float": float32 / 255 + one-hot. Speed
of whole readers lives in `imgshard bench`; this isolates the kernels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from converter.testing.synth import random_mask, textured_image  # noqa: E402


def _size(text: str) -> tuple[int, int]:
    h, _, w = text.lower().partition("x")
    return int(h), int(w)


def _batches(source: tuple[int, int], batch: int, count: int, classes: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        images = np.stack([textured_image(*source, rng)[..., :3] for _ in range(batch)])
        masks = np.stack([np.asarray(random_mask(*source, classes, rng), np.uint8) for _ in range(batch)])
        out.append((images, masks))
    return out


def contenders(size: tuple[int, int], classes: int, rotate: float):
    """name -> function(images, masks, batch_index) running one batch."""
    from converter.bench.augbench import albumentations_batch, albumentations_recipe
    from readers.augment import Augment, draw_params
    from readers.augment_host import warp_batch

    aug = Augment(hflip=0.5, scale=(0.5, 2.0), crop=size, rotate=rotate, brightness=0.2)
    compose = albumentations_recipe(size, rotate=rotate, seed=0)

    def kernel(normalize: bool):
        def run(images, masks, i):
            ids = np.arange(i * len(images), (i + 1) * len(images), dtype=np.uint64)
            params = draw_params(aug, images.shape[1], images.shape[2], 0, 0, ids)
            return warp_batch(aug, images, masks, params, normalize=normalize, mask_fill=255,
                              one_hot_classes=classes if normalize else 0, ignore_index=255)
        return run

    def albu(normalize: bool):
        return lambda images, masks, i: albumentations_batch(compose, images, masks, normalize=normalize,
                                                             classes=classes)

    return {"imgshard compact": kernel(False), "albumentations compact": albu(False),
            "imgshard float": kernel(True), "albumentations float": albu(True)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=_size, default=(512, 512))
    p.add_argument("--source", type=_size, default=(640, 640))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--rotate", type=float, default=10.0)
    p.add_argument("--only", default="", help="comma-separated substrings of contender names")
    args = p.parse_args(argv)
    data = _batches(args.source, args.batch_size, args.batches, args.classes, 0)
    runs = contenders(args.size, args.classes, args.rotate)
    if args.only:
        runs = {k: v for k, v in runs.items() if any(s in k for s in args.only.split(","))}
    ms: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds + 1):
        for name, run in runs.items():
            c0 = time.process_time()
            for i, (images, masks) in enumerate(data):
                run(images, masks, i + r * len(data))
            cpu = time.process_time() - c0
            if r:
                ms[name].append(1000 * cpu / (len(data) * args.batch_size))
    result = {k: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)} for k, v in ms.items()}
    for k, v in result.items():
        print(f"{k:28s} {v['median_ms']:7.2f} CPU-ms/sample ({v['min_ms']:.2f}-{v['max_ms']:.2f})")
    for form in ("compact", "float"):
        a, b = result.get(f"albumentations {form}"), result.get(f"imgshard {form}")
        if a and b:
            print(f"{form}: imgshard {a['median_ms'] / b['median_ms']:.2f}x albumentations")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
