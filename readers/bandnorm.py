"""`normalize="stats"`: per-band standardisation with the mean and standard deviation that
`convert` computed over the train split and stored in the manifest (``image.stats``,
`converter.publish.band_stats`). Remote-sensing and medical models normalise per band;
this saves a pass over the data. x becomes float32 ``(x - mean) / std`` per channel, in
the stored units (not scaled to [0, 1] first). NumPy only at import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np


@dataclass(frozen=True)
class BandStats:
    mean: tuple[float, ...]
    std: tuple[float, ...]
    split: str = "train"

    @classmethod
    def from_manifest(cls, image: Mapping[str, Any], where: str) -> "BandStats":
        stats = image.get("stats")
        if not isinstance(stats, Mapping) or "mean" not in stats or "std" not in stats:
            raise ValueError(f"normalize='stats' needs per-band statistics in the manifest; {where} has none "
                             "(`convert` stores them for images beyond 8-bit RGB: 16-bit, grey, multi-band). "
                             "Use normalize=True (scaled by the dtype's range). Received: normalize='stats'")
        std = tuple(float(s) if float(s) > 0 else 1.0 for s in stats["std"])  # a constant band: left centred
        return cls(tuple(float(m) for m in stats["mean"]), std, str(stats.get("split", "train")))

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return ((np.asarray(x, np.float32) - np.float32(self.mean)) / np.float32(self.std)).astype(np.float32)

    def tf_map(self) -> Any:
        """A `tf.data` map (x, y) -> (standardised x, y)."""
        import tensorflow as tf

        mean, std = tf.constant(self.mean, tf.float32), tf.constant(self.std, tf.float32)

        def standardize(x: Any, y: Any) -> tuple[Any, Any]:
            return (tf.cast(x, tf.float32) - mean) / std, y

        return standardize


def normalize_mode(normalize: Any) -> tuple[bool, bool]:
    """(the pipeline's bool normalize, whether to standardise with the stored stats)."""
    if isinstance(normalize, str):
        if normalize != "stats":
            raise ValueError(f"normalize must be True, False or 'stats'. Received: normalize={normalize!r}")
        return False, True
    return bool(normalize), False


__all__ = ["BandStats", "normalize_mode"]
