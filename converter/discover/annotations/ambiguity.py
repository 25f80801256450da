"""An annotation file and mask images beside it: two readings of one dataset.

When a folder has both an annotation file (COCO JSON, RLE CSV, CVAT XML, ...) and mask-image
folders that pair with the same images, neither wins silently. Both readings are compared on
a sample of the images they share (`SAMPLE_IMAGES`, spread over the listing): the annotation
rasterized exactly as convert does, the mask decoded as convert decodes it and read by the
documented rule (two levels ``{0, v}``: binary, ``v`` -> 1; else the value is the class, with
255 ignored as Pascal VOC's border; ignore pixels of either side are not compared). They agree
when at most `AGREE_FRACTION` of the compared pixels differ; then the mask images are read (they
are the files the dataset ships as ground truth) and the evidence says so. Otherwise
`ReadingsDisagree` names both readings and the flag that picks each (exit 65).

An RLE CSV is compared down the columns and along the rows (its `--rle-order`): Carvana's
``train_masks.csv`` runs along the rows and re-encodes ``train_masks/``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable

import numpy as np

from converter.discover.annotations.registry import rasterize
from converter.discover.layout import SourceSample

#: Images both readings have, compared pixel by pixel.
SAMPLE_IMAGES = 8
#: At most this fraction of the compared pixels may differ for the readings to agree (polygon edges).
AGREE_FRACTION = 0.001


class ReadingsDisagree(ValueError):
    """An annotation file and mask images beside it pair with the same images and disagree (exit 65)."""

    exit_code = 65


@dataclasses.dataclass(frozen=True)
class Comparison:
    images: int  # images compared
    pixels: int  # pixels compared
    differ: int  # pixels whose classes differ
    size_mismatch: int = 0  # images whose mask and annotation sizes differ
    rle_order: str | None = None  # the RLE CSV run order that agreed

    @property
    def agree(self) -> bool:
        return self.images > 0 and not self.size_mismatch and self.differ <= AGREE_FRACTION * self.pixels

    def evidence(self) -> str:
        share = f"{self.differ:,} of {self.pixels:,} pixels differ" if self.pixels else "no pixel compared"
        sizes = f", {self.size_mismatch} of a different size" if self.size_mismatch else ""
        return f"{self.images} shared images compared: {share}{sizes}"


def mask_classes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(classes, compared) of raw mask values by the documented rule: two levels {0, v} -> 0/1; else the value,
    255 (VOC's border) not compared."""
    levels = np.unique(values)
    if len(levels) <= 2 and levels[0] == 0:
        return (values > 0).astype(np.int64), np.ones(values.shape, bool)
    return values.astype(np.int64), values != 255


def _mask_values(path: str) -> np.ndarray | None:
    from converter.discover.evidence import peek_mask

    mask = peek_mask(path)
    if mask is None:
        return None
    return mask.indices if mask.indices is not None else mask.colors()


def _with_order(annotation, order: str | None):
    if order is None:
        return annotation
    doc = json.loads(annotation.payload)
    doc["order"] = order
    from converter.discover.annotations.base import canonical

    return annotation._replace(payload=canonical(doc))


def compare(pairs: Iterable[tuple[SourceSample, SourceSample]], order: str | None = None) -> Comparison:
    """Both readings of the same images: (annotation sample, mask sample) pairs."""
    images = pixels = differ = sizes = 0
    for ann, masked in pairs:
        values = _mask_values(masked.mask) if masked.mask else None
        if values is None:
            continue
        h, w = values.shape
        doc = json.loads(ann.annotation.payload)
        size = doc.get("size")
        if size is not None and (int(size[0]), int(size[1])) != (h, w):
            images, sizes = images + 1, sizes + 1
            continue
        drawn = rasterize(_with_order(ann.annotation, order), h, w).astype(np.int64)
        classes, compared = mask_classes(values)
        compared &= drawn != int(doc.get("ignore", 255))
        images += 1
        pixels += int(np.count_nonzero(compared))
        differ += int(np.count_nonzero(compared & (drawn != classes)))
    return Comparison(images, pixels, differ, sizes, order)


def shared(annotated: Iterable[SourceSample], masked: Iterable[SourceSample], n: int = SAMPLE_IMAGES
           ) -> tuple[list[tuple[SourceSample, SourceSample]], int]:
    """Up to `n` (annotation, mask) sample pairs of the same image, spread over the listing; and how many share."""
    by_image = {s.image: s for s in masked if s.mask}
    both = [(a, by_image[a.image]) for a in annotated if a.image in by_image]
    if len(both) <= n:
        return both, len(both)
    step = len(both) / n
    return [both[int(i * step)] for i in range(n)], len(both)


def compare_readings(fmt: str, annotated: list[SourceSample], masked: list[SourceSample]
                     ) -> tuple[Comparison, int] | None:
    """(the comparison, images shared) of both readings; None when they share no image (no ambiguity)."""
    pairs, count = shared(annotated, masked)
    if not pairs:
        return None
    result = compare(pairs)
    if not result.agree and fmt == "rlecsv":
        other = compare(pairs, "rows" if json.loads(pairs[0][0].annotation.payload).get("order") != "rows"
                        else "columns")
        if other.agree:
            result = other
    return result, count


__all__ = ["AGREE_FRACTION", "Comparison", "ReadingsDisagree", "SAMPLE_IMAGES", "compare", "compare_readings",
           "mask_classes", "shared"]
