"""Per-band statistics of the stored images, for `normalize="stats"` in the readers.

Each shard carries the sums of its records' stored images (`ShardEntry.band_sums`:
per channel the sum and the sum of squares, then the pixel count), so an incremental
run or a compaction never reads old shards again; the manifest's ``image.stats`` is the
mean and standard deviation over the train split, recomputed from the shards at every
publish. Only kept for images beyond 8-bit RGB (16-bit, grey, multi-band): the 8-bit RGB
path is the fast one and skips the extra pass.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

#: The split whose images give the statistics (the others fall back to the first split there is).
STATS_SPLIT = "train"


def sample_sums(image: np.ndarray) -> np.ndarray:
    """(2C + 1,) float64: per channel the sum and the sum of squares of one stored image, then its pixels."""
    flat = image.reshape(-1, image.shape[-1] if image.ndim == 3 else 1)
    wide = flat.astype(np.float64)
    return np.concatenate([wide.sum(axis=0), np.einsum("ij,ij->j", wide, wide), [float(flat.shape[0])]])


class BandSums:
    """The running band sums of one shard's stored images (`enabled` False: kept for none)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.sums: np.ndarray | None = None

    def add(self, image: object) -> None:
        if self.enabled and isinstance(image, np.ndarray):
            part = sample_sums(image)
            self.sums = part if self.sums is None else self.sums + part

    def total(self) -> tuple[float, ...]:
        return () if self.sums is None else tuple(float(v) for v in self.sums)


def stats_of(sums: Iterable[Sequence[float]]) -> dict | None:
    """{"mean": [...], "std": [...], "pixels": n} from shards' band sums; None when a shard has none."""
    total = None
    for s in sums:
        if not s:
            return None
        total = np.asarray(s, np.float64) if total is None else total + np.asarray(s, np.float64)
    if total is None or total[-1] <= 0:
        return None
    c = (len(total) - 1) // 2
    n = total[-1]
    mean = total[:c] / n
    var = np.maximum(total[c:2 * c] / n - mean * mean, 0.0)
    return {"mean": [float(m) for m in mean], "std": [float(math.sqrt(v)) for v in var], "pixels": int(n)}


def split_stats(splits: dict) -> dict | None:
    """The manifest's ``image.stats`` from {split: [ShardEntry]}: over the train split (else the first)."""
    name = STATS_SPLIT if STATS_SPLIT in splits else (sorted(splits)[0] if splits else None)
    if name is None:
        return None
    stats = stats_of(s.band_sums for s in splits[name])
    return None if stats is None else {"split": name, **stats}


__all__ = ["STATS_SPLIT", "BandSums", "sample_sums", "split_stats", "stats_of"]
