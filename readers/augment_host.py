"""The host implementation of `readers.augment`: one C pass per sample (`readers/_warp.c`).

`augment_expand` takes a compact NumPy batch (uint8 or uint16 images of 1-16 channels, class maps / one-hot planes /
labels) and its parameter rows (`readers.augment.draw_params`) and writes the final
training tensors straight into new 64-byte aligned arrays: the image resampled
bilinearly, colour-jittered, padded with `fill` and stored as float32 / 255 (uint16:
/ 65535) or rounded in its dtype; the mask resampled with nearest neighbour from the same source coordinates,
padded with the ignore index, and (class maps with `one_hot`) one-hot encoded in the
same pass. No TensorFlow op runs per sample; the GIL is released while pixels are
written, so `tf.data`'s parallel map (`make_host_map`) runs batches on all cores.

This is THE host implementation: `tf_dataset(..., augment=aug)`, `keras_dataset` and
`augment_sample` use it when the extension is built. The TensorFlow implementation
(`readers.augment.augment_tf`) stays for the accelerator (`readers.device.augment_batch`)
and as the fallback without a C compiler (or with ``IMGSHARD_FAST_AUGMENT=0``); it gives
the same mask classes (same coordinate rule) and images within a level or two (float
rounding order; tested in tests/test_warp.py).
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from readers.formats.blocks import reusable_block as _block
from readers.formats.expand import STREAM_MIN_BYTES

#: Parameter columns per sample: `readers.augment.PARAMS` (not imported here: `readers.augment`
#: imports this module; tests/test_warp.py checks that the two agree).
PARAMS = 19

try:
    from readers import _warp
except ImportError:  # built without a C compiler: the TensorFlow implementation runs
    _warp = None
if _warp is not None and not hasattr(_warp, "use_simd"):  # a build older than this module's calls
    warnings.warn("readers._warp was built from an older readers/_warp.c (before image kinds); augmentation runs "
                  "as TensorFlow ops until it is rebuilt: python setup.py build_ext --inplace", RuntimeWarning,
                  stacklevel=2)
    _warp = None

if TYPE_CHECKING:  # pragma: no cover
    from readers.formats.spec import RecordSpec


def fast_augment_available() -> bool:
    """Whether the C implementation runs: the `_warp` extension was built and
    ``IMGSHARD_FAST_AUGMENT`` is not set to 0 (the switch the tests use for the fallback)."""
    flag = os.environ.get("IMGSHARD_FAST_AUGMENT", "1").strip().lower()
    return _warp is not None and flag not in ("0", "false", "no", "off")


#: The image kinds the C kernel takes: dtypes and channel counts (1..MAX_CHANNELS).
FAST_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16))
MAX_CHANNELS = 16


def fast_augment_supports(dtype: Any, channels: int) -> bool:
    """Whether the C kernel augments images of `dtype` with `channels` channels (uint8 or
    uint16, 1 to 16 channels), and runs here (`fast_augment_available`). The colour jitter
    needs 3 channels: `warp_batch` refuses a photometric recipe on other counts."""
    try:
        kind = np.dtype(dtype)
    except TypeError:
        return False
    return (fast_augment_available() and kind in FAST_DTYPES and isinstance(channels, (int, np.integer))
            and not isinstance(channels, bool) and 1 <= channels <= MAX_CHANNELS)


def _fill_values(augment: Any, dtype: np.dtype, channels: int) -> np.ndarray:
    """The padding value per channel in the images' scale: `augment.fill` (0-255) times
    65535 / 255 for uint16; an (r, g, b) fill needs 3 channels."""
    fill = augment.fill
    if isinstance(fill, tuple) and channels != 3:
        raise ValueError(f"Augment.fill must be one int for images of {channels} channels (an (r, g, b) triple "
                         f"needs 3). Received: fill={fill!r}")
    values = np.broadcast_to(np.asarray(fill, np.float32), (channels,))
    return np.ascontiguousarray(values * np.float32(257 if dtype == np.uint16 else 1), np.float32)


def _check_images(augment: Any, images: np.ndarray) -> np.ndarray:
    images = np.asarray(images)
    if images.ndim != 4 or images.dtype not in FAST_DTYPES or not 1 <= images.shape[-1] <= MAX_CHANNELS:
        raise ValueError("images must be a (batch, height, width, channels) uint8 or uint16 array with 1 to "
                         f"{MAX_CHANNELS} channels. Received: {images.dtype} {images.shape}")
    if augment.photometric and images.shape[-1] != 3:
        raise ValueError(f"Augment's colour jitter (brightness, contrast, saturation, hue) needs 3-channel images. "
                         f"Received: {images.shape[-1]} channels; drop the colour fields from the recipe.")
    return np.ascontiguousarray(images.astype(images.dtype.newbyteorder("="), copy=False))


def warp_batch(augment: Any, images: np.ndarray, targets: np.ndarray | None, params: np.ndarray, *,
               normalize: bool, mask_fill: int = 255, one_hot_classes: int = 0,
               ignore_index: int | None = None, general: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """The C kernel on one batch: images (B, H, W, C) or (B, H, W) uint8 or uint16, C in 1..16 (the
    colour jitter needs C = 3); targets None or masks (B, H, W) / (B, H, W, K) uint8/uint16;
    params (B, PARAMS) float32. Returns (float32 images / 255 or / 65535, or images in
    their dtype; masks in their dtype or float32 one-hot planes). `general`: every sample
    through the general affine path (the tests compare it with the separable one)."""
    if _warp is None:
        raise RuntimeError("readers._warp is not built (no C compiler at install time); "
                           "use readers.augment.augment_tf, or reinstall with a C compiler.")
    grey = np.ndim(images) == 3  # (B, H, W): one channel, returned without the channel axis
    images = _check_images(augment, images[..., None] if grey else images)
    b, h, w, channels = images.shape
    params = np.ascontiguousarray(params, np.float32)
    if params.shape != (b, PARAMS):
        raise ValueError(f"params must be ({b}, {PARAMS}) float32 rows from draw_params. Received: {params.shape}")
    oh, ow = augment.output_size(h, w)
    x, _ = _block((b, oh, ow, channels), np.float32 if normalize else images.dtype)
    y = masks = None
    itemsize = planes = 1
    zeroed = False
    if targets is not None:
        masks = np.ascontiguousarray(targets)
        if masks.dtype not in (np.uint8, np.uint16) or masks.shape[:3] != (b, h, w) or masks.ndim not in (3, 4):
            raise ValueError(f"masks must be ({b}, {h}, {w}[, planes]) uint8/uint16 arrays. "
                             f"Received: {masks.dtype} {masks.shape}")
        masks = masks.astype(masks.dtype.newbyteorder("="), copy=False)
        itemsize, planes = masks.dtype.itemsize, (masks.shape[3] if masks.ndim == 4 else 1)
        if one_hot_classes:
            y, zeroed = _block((b, oh, ow, one_hot_classes), np.float32)
        else:
            y, _ = _block((b, oh, ow, *masks.shape[3:]), masks.dtype)
    fill = _fill_values(augment, images.dtype, channels)
    stream = x.nbytes + (0 if y is None else y.nbytes) >= STREAM_MIN_BYTES  # large batches: streaming stores
    _warp.warp(images, params, x, b, h, w, oh, ow, fill, normalize, augment.photometric, augment.contrast > 0,
               masks, y, itemsize, planes, int(mask_fill), int(one_hot_classes),
               -1 if ignore_index is None else int(ignore_index), zeroed, stream, channels, images.dtype.itemsize,
               bool(general))
    return (x[..., 0] if grey else x), y


def augment_expand(augment: Any, spec: "RecordSpec", images: np.ndarray, targets: np.ndarray, params: np.ndarray,
                   *, normalize: bool, one_hot: bool) -> tuple[np.ndarray, np.ndarray]:
    """A compact batch augmented and expanded as `tf_dataset` gives it (see module doc)."""
    from readers.formats.expand import expand_numpy

    if not spec.segmentation:
        x, _ = warp_batch(augment, images, None, params, normalize=normalize)
        return expand_numpy(x, targets, spec, one_hot=one_hot, normalize=False)
    planes = spec.mask_encoding == "onehot"
    fill = 0 if planes else (255 if spec.ignore_index is None else spec.ignore_index)
    direct = one_hot and not planes
    x, y = warp_batch(augment, images, targets, params, normalize=normalize, mask_fill=fill,
                      one_hot_classes=spec.num_classes if direct else 0, ignore_index=spec.ignore_index)
    if direct:
        return x, y
    return expand_numpy(x, y, spec, one_hot=one_hot, normalize=False)


def make_host_map(spec: "RecordSpec", augment: Any, *, normalize: bool, one_hot: bool, y_dtype: Any) -> Any:
    """A `tf.data` map function (images, targets, params) -> (x, y) running `augment_expand`
    in one `tf.numpy_function` per batch (`y_dtype`: the compact targets' dtype)."""
    import tensorflow as tf

    h, w = augment.output_size(spec.height, spec.width)
    x_dtype = tf.float32 if normalize else None  # else the images' dtype (uint8 / uint16)
    if not spec.segmentation:
        y_out, y_tail = (tf.float32, (spec.num_classes,)) if one_hot else (tf.int64, ())
    elif one_hot:
        y_out, y_tail = tf.float32, (h, w, spec.num_classes)
    else:
        y_out, y_tail = (tf.uint8 if spec.mask_encoding == "onehot" else tf.dtypes.as_dtype(y_dtype)), (h, w)

    def host(images: np.ndarray, targets: np.ndarray, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x, y = augment_expand(augment, spec, images, targets, params, normalize=normalize, one_hot=one_hot)
        return x, np.asarray(y, y_out.as_numpy_dtype)

    def run(images: Any, targets: Any, params: Any) -> tuple[Any, Any]:
        x, y = tf.numpy_function(host, [images, targets, params], (x_dtype or images.dtype, y_out), stateful=False)
        lead = images.shape[0]
        x.set_shape((lead, h, w, images.shape[-1]))
        y.set_shape((lead, *y_tail))
        return x, y

    return run


__all__ = ["FAST_DTYPES", "MAX_CHANNELS", "augment_expand", "fast_augment_available", "fast_augment_supports",
           "make_host_map", "warp_batch"]
