"""Fit a source to the output size: stretch, cover, contain, crop-or-pad.

One `Geometry` per source size describes the source box that is sampled, the size it
is resampled to, and where the result is placed in the output canvas. Images are
resampled with Pillow (its antialiased filters are the reference). Masks are sampled
with exactly Pillow's NEAREST rule, but on NumPy arrays: the row and column indices
Pillow would pick are computed once per geometry (Pillow's own arithmetic, repeated in
NumPy; tests compare it with Pillow resizing an index image), then applied with fancy
indexing to any 2-D array (packed colours, palette indices or class maps), so masks
line up with images pixel for pixel.

The antialiased filters (box, bilinear, bicubic, lanczos) run in the `_resample` C
extension when it was built: Pillow's algorithm and fixed-point arithmetic, bit for
bit (tests compare it with Pillow), vectorised, and without converting the array to a
PIL image (RGB -> RGBX) and back. Without the extension, or for NEAREST, Pillow
resizes: same pixels, slower. With the extension, a PNG conversion never imports
Pillow (7.5 ms of every run's start-up).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from converter.options import Fit, ImageFilter

try:
    from converter.transform import _resample
except ImportError:  # no C compiler at install time: Pillow resizes every image
    _resample = None

#: Pillow's numbers for the filters (`PIL.Image.Resampling`; a test checks them), which
#: Pillow's resize and the C extension take.
PIL_FILTERS = {
    ImageFilter.NEAREST: 0,
    ImageFilter.BILINEAR: 2,
    ImageFilter.BICUBIC: 3,
    ImageFilter.LANCZOS: 1,
    ImageFilter.BOX: 4,
}
# Filters the C extension takes; it uses Pillow's filter numbers.
_FAST_FILTERS = frozenset({ImageFilter.BILINEAR, ImageFilter.BICUBIC, ImageFilter.LANCZOS, ImageFilter.BOX})


def fast_resize_available() -> bool:
    """True when the `_resample` C extension was built (else Pillow resizes every image)."""
    return _resample is not None


def resizer() -> str:
    """Which code resizes images here: "C (avx2)", "C (plain)" or "Pillow"."""
    return f"C ({_resample.KERNELS})" if _resample is not None else "Pillow"


@dataclass(frozen=True)
class Geometry:
    """How a (src_h, src_w) source maps onto the (out_h, out_w) output."""

    src_size: tuple[int, int]  # (h, w)
    out_size: tuple[int, int]  # (h, w)
    box: tuple[float, float, float, float]  # (x0, y0, x1, y1) in source pixels
    resample_size: tuple[int, int] | None  # (h, w) the box is resampled to; None: integer crop only
    offset: tuple[int, int]  # (y, x) where the resampled/cropped block lands in the output

    @property
    def placed_size(self) -> tuple[int, int]:
        if self.resample_size is not None:
            return self.resample_size
        x0, y0, x1, y1 = self.box
        return int(y1 - y0), int(x1 - x0)

    @property
    def pads(self) -> bool:
        return self.placed_size != self.out_size


def _center_crop_or_pad(src: int, out: int) -> tuple[int, int, int]:
    """(crop_start, crop_len, pad_offset) along one axis, as tf.image.resize_with_crop_or_pad."""
    if src >= out:
        return (src - out) // 2, out, 0
    return 0, src, (out - src) // 2


@functools.lru_cache(maxsize=256)
def plan_geometry(src_size: tuple[int, int], out_size: tuple[int, int], fit: Fit) -> Geometry:
    sh, sw = src_size
    oh, ow = out_size
    if fit is Fit.STRETCH:
        return Geometry(src_size, out_size, (0.0, 0.0, float(sw), float(sh)), out_size, (0, 0))
    if fit is Fit.COVER:
        scale = max(ow / sw, oh / sh)
        cw, ch = ow / scale, oh / scale
        x0, y0 = max(0.0, (sw - cw) / 2.0), max(0.0, (sh - ch) / 2.0)
        box = (x0, y0, min(float(sw), x0 + cw), min(float(sh), y0 + ch))
        return Geometry(src_size, out_size, box, out_size, (0, 0))
    if fit is Fit.CONTAIN:
        scale = min(ow / sw, oh / sh)
        nw = min(ow, max(1, round(sw * scale)))
        nh = min(oh, max(1, round(sh * scale)))
        # Pillow's ImageOps.pad centres with round() (half to even): 27 rows of padding put 14 above
        return Geometry(src_size, out_size, (0.0, 0.0, float(sw), float(sh)), (nh, nw),
                        (round((oh - nh) / 2), round((ow - nw) / 2)))
    if fit is Fit.CROP_OR_PAD:
        y0, ch, py = _center_crop_or_pad(sh, oh)
        x0, cw, px = _center_crop_or_pad(sw, ow)
        return Geometry(src_size, out_size, (float(x0), float(y0), float(x0 + cw), float(y0 + ch)), None, (py, px))
    raise ValueError(f"fit must be one of {Fit.values()}. Received: {fit!r}")


@functools.lru_cache(maxsize=512)
def _nearest_indices(src_len: int, out_len: int, start: float, stop: float) -> np.ndarray:
    """Source indices Pillow's NEAREST picks along one axis for a box [start, stop).

    Pillow's arithmetic (`_resize` and `ImagingScaleAffine`): the box arrives as C
    floats; the step is their float difference / out_len in double; the position starts
    at start + step / 2 and grows by adding the step once per pixel (a running sum,
    rounding included); each position is truncated to an index, and one outside the
    source leaves the pixel at 0 (index 0 here).
    """
    lo, hi = np.float32(start), np.float32(stop)
    step = float(hi - lo) / out_len
    increments = np.full(out_len, step)
    increments[0] = float(lo) + step * 0.5
    position = np.add.accumulate(increments)  # sequential, as Pillow's `xo += a[0]`
    idx = np.where(position < 0.0, -1, np.trunc(position)).astype(np.intp)
    idx[(idx < 0) | (idx >= src_len)] = 0
    idx.flags.writeable = False
    return idx


def nearest_rows_cols(geom: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices to sample a 2-D source array for `geom` (before padding)."""
    x0, y0, x1, y1 = geom.box
    if geom.resample_size is None:
        return np.arange(int(y0), int(y1)), np.arange(int(x0), int(x1))
    rh, rw = geom.resample_size
    rows = _nearest_indices(geom.src_size[0], rh, y0, y1)
    cols = _nearest_indices(geom.src_size[1], rw, x0, x1)
    return rows, cols


def _place(block: np.ndarray, geom: Geometry, fill: int) -> np.ndarray:
    if not geom.pads:
        return block
    oh, ow = geom.out_size
    out = np.full((oh, ow) + block.shape[2:], fill, dtype=block.dtype)
    py, px = geom.offset
    out[py:py + block.shape[0], px:px + block.shape[1]] = block
    return out


def resample(arr: np.ndarray, size: tuple[int, int], box: tuple[float, float, float, float],
             image_filter: ImageFilter) -> np.ndarray:
    """`arr` ((H, W) or (H, W, 3) uint8) resampled from `box` to `size` (h, w), exactly as Pillow's
    `Image.resize((w, h), filter, box=box, reducing_gap=None)`; through the C extension when it can."""
    rh, rw = size
    fast = (_resample is not None and image_filter in _FAST_FILTERS and arr.dtype == np.uint8
            and (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] == 3)))
    if not fast:
        from PIL import Image

        im = Image.fromarray(arr)
        return np.asarray(im.resize((rw, rh), PIL_FILTERS[image_filter], box=box, reducing_gap=None))
    src = np.ascontiguousarray(arr)
    out = np.empty((rh, rw) + src.shape[2:], np.uint8)
    channels = 1 if src.ndim == 2 else 3
    _resample.resample(src, src.shape[0], src.shape[1], channels, out, rh, rw,
                       int(PIL_FILTERS[image_filter]), box)
    return out


def resize_image(arr: np.ndarray, geom: Geometry, image_filter: ImageFilter) -> np.ndarray:
    """Resample an (H, W) or (H, W, 3) uint8 image; pad with 0. Returns (out_h, out_w, 3)."""
    x0, y0, x1, y1 = geom.box
    if geom.resample_size is None:
        block = arr[int(y0):int(y1), int(x0):int(x1)]
    elif geom.resample_size == geom.src_size and geom.box == (0.0, 0.0, float(arr.shape[1]), float(arr.shape[0])):
        block = arr  # nothing to resample
    else:
        block = resample(arr, geom.resample_size, geom.box, image_filter)
    if block.ndim == 2:  # greyscale: resized on one channel, identical per channel to RGB
        grey, block = block, np.empty(block.shape + (3,), block.dtype)
        block[:, :, 0] = grey  # three strided copies: half the time of np.repeat(..., axis=2)
        block[:, :, 1] = grey
        block[:, :, 2] = grey
    out = _place(block, geom, 0)
    return np.ascontiguousarray(out)


def resize_nearest(arr: np.ndarray, geom: Geometry, fill: int) -> np.ndarray:
    """Sample a 2-D array with Pillow's NEAREST rule; pad with `fill`."""
    rows, cols = nearest_rows_cols(geom)
    block = arr[rows[:, None], cols[None, :]]
    return np.ascontiguousarray(_place(block, geom, fill))
