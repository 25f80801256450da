"""Images beyond 8-bit RGB made viewable for `preview`: a choice of bands (``--display-bands
3,2,1``: 1-based, as remote-sensing tools count them) and a contrast stretch of 16-bit
values to 8 bits (the 2nd to 98th percentile of each band, so a 12-bit CT slice or a dark
satellite tile is not drawn black). 8-bit RGB passes through unchanged."""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: Percentiles mapped to 0 and 255 when 16-bit bands are drawn.
STRETCH = (2.0, 98.0)


def parse_bands(text: str | None) -> tuple[int, ...] | None:
    """``"3,2,1"`` -> (3, 2, 1); one band (grey) or three (RGB), each >= 1."""
    if text is None:
        return None
    try:
        bands = tuple(int(b) for b in text.split(","))
    except ValueError:
        bands = ()
    if len(bands) not in (1, 3) or min(bands) < 1:
        raise ValueError(f"--display-bands must be one or three 1-based band numbers, e.g. 3,2,1. Received: {text!r}")
    return bands


def _stretch(band: np.ndarray) -> np.ndarray:
    lo, hi = np.percentile(band, STRETCH) if band.size else (0.0, 1.0)
    if hi <= lo:
        hi = lo + 1.0
    return np.clip(np.rint((band.astype(np.float64) - lo) * (255.0 / (hi - lo))), 0, 255).astype(np.uint8)


def to_display(image: np.ndarray, bands: Sequence[int] | None = None) -> np.ndarray:
    """(H, W, 3) or (H, W) uint8 to draw, from a stored (H, W[, C]) uint8/uint16 image."""
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[:, :, None]
    c = image.shape[2]
    if bands is None:
        bands = (1, 2, 3) if c >= 3 else (1,)
    if max(bands) > c:
        raise ValueError(f"--display-bands names band {max(bands)}; these images have {c} band(s). "
                         f"Received: {','.join(map(str, bands))}")
    picked = image[:, :, [b - 1 for b in bands]]
    if picked.dtype != np.uint8:
        picked = np.stack([_stretch(picked[:, :, k]) for k in range(picked.shape[2])], -1)
    return picked[:, :, 0] if picked.shape[2] == 1 else np.ascontiguousarray(picked)


__all__ = ["STRETCH", "parse_bands", "to_display"]
