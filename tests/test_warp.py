"""The `_warp` C extension (`readers.augment_host`, the host augmentation) against an
independent NumPy implementation of the documented conventions, and the TensorFlow
implementation (the fallback and the accelerator path) against the C one.

Conventions (docs/AUGMENT.md): output pixel (x, y) samples source position
(a00 x + a01 y + t0, a10 x + a11 y + t1), pixel centres at integers; inside when
-0.5 < s < size - 0.5 on both axes; image bilinear with the taps clamped to the edge;
mask nearest floor(s + 0.5); colour clip(c M x + M (delta + (1 - c) mean), 0, 255)
with the mean over inside pixels; outside: fill / ignore index.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from readers import augment_host
from readers.augment import PARAMS, Augment, draw_params

needs_kernel = pytest.mark.skipif(augment_host._warp is None,
                                reason="the _warp extension is not built (no C compiler)")


def _textured(rng, b, h, w):
    base = rng.integers(0, 256, (b, h, w, 3)).astype(np.float64)
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = 127 + 100 * np.sin(xx[None, :, :, None] / 3.0 + yy[None, :, :, None] / 5.0 + np.arange(3))
    return np.clip(0.5 * base + 0.5 * smooth, 0, 255).astype(np.uint8)


def _sample(image, mask, p, out_size, mask_fill):
    """One sample under the parameter row `p` (float64), before any colour step: the bilinear
    image (taps clamped to the edge), which output pixels fall inside the source, and the mask
    by the nearest rule with `mask_fill` outside (None without a mask)."""
    h, w = image.shape[:2]
    yy, xx = np.mgrid[0:out_size[0], 0:out_size[1]].astype(np.float64)
    sx, sy = p[0] * xx + (p[1] * yy + p[2]), p[3] * xx + (p[4] * yy + p[5])
    inside = (sx > -0.5) & (sx < w - 0.5) & (sy > -0.5) & (sy < h - 0.5)
    x0, y0 = np.floor(sx), np.floor(sy)
    fx, fy = (sx - x0)[..., None], (sy - y0)[..., None]
    xa, xb = np.clip(x0, 0, w - 1).astype(int), np.clip(x0 + 1, 0, w - 1).astype(int)
    ya, yb = np.clip(y0, 0, h - 1).astype(int), np.clip(y0 + 1, 0, h - 1).astype(int)
    img = image.astype(np.float64)
    left = img[ya, xa] + (img[yb, xa] - img[ya, xa]) * fy
    right = img[ya, xb] + (img[yb, xb] - img[ya, xb]) * fy
    v = left + (right - left) * fx
    if mask is None:
        return v, inside, None
    nx = np.clip(np.floor(sx + 0.5), 0, w - 1).astype(int)
    ny = np.clip(np.floor(sy + 0.5), 0, h - 1).astype(int)
    mk = mask[ny, nx].copy()
    mk[~inside] = mask_fill
    return v, inside, mk


def _reference(augment, images, masks, params, *, mask_fill, normalize):
    """NumPy float64 implementation of the documented host augmentation (uint8 or float out)."""
    b, h, w = images.shape[:3]
    out_size = augment.output_size(h, w)
    out_x, out_m = [], []
    for n in range(b):
        p = params[n].astype(np.float64)
        v, inside, mk = _sample(images[n], None if masks is None else masks[n], p, out_size, mask_fill)
        if augment.photometric:
            m, c, delta = p[8:17].reshape(3, 3), p[18], p[17]
            mean = v[inside].mean(0) if augment.contrast and inside.any() else np.zeros(3)
            offset = delta + ((1 - c) * mean if augment.contrast else 0.0)
            v = np.clip(v @ (c * m).T + m @ (np.ones(3) * offset), 0, 255)
        v[~inside] = augment.fill_rgb()
        out_x.append(v / 255.0 if normalize else np.clip(np.round(v), 0, 255))
        out_m.append(mk)
    return np.stack(out_x), (np.stack(out_m) if masks is not None else None)


RECIPES = {
    "scale-crop-flip": Augment(hflip=0.5, vflip=0.5, scale=(0.6, 1.8), crop=(23, 29)),
    "zoom-out-padding": Augment(hflip=0.5, scale=(0.3, 0.7), crop=(31, 26), fill=(255, 0, 255)),
    "photometric": Augment(hflip=0.5, scale=(0.75, 1.5), crop=(20, 24), brightness=0.2, contrast=0.3,
                           saturation=0.3, hue=0.05, fill=7),
    "rotate": Augment(rotate=40.0, scale=(0.5, 2.0), crop=(27, 21), fill=(10, 20, 30)),
    "rot90-flip-colour": Augment(rot90=True, hflip=0.5, vflip=0.5, scale=(0.8, 1.3), contrast=0.2,
                                 saturation=0.5, hue=0.2),
}


@needs_kernel
@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("mask_dtype", [np.uint8, np.uint16])
def test_kernel_matches_numpy_reference(name, mask_dtype):
    aug = RECIPES[name]
    rng = np.random.default_rng(abs(hash((name, mask_dtype.__name__))) % 1000)
    for trial in range(3):
        b, h, w = int(rng.integers(1, 4)), int(rng.integers(9, 40)), int(rng.integers(9, 40))
        images = _textured(rng, b, h, w)
        top = 300 if mask_dtype == np.uint16 else 6
        masks = rng.integers(0, top, (b, h, w)).astype(mask_dtype)
        params = draw_params(aug, h, w, int(rng.integers(0, 1 << 30)), trial, np.arange(b, dtype=np.uint64))
        ref_x, ref_m = _reference(aug, images, masks, params, mask_fill=255, normalize=False)
        x, m = augment_host.warp_batch(aug, images, masks, params, normalize=False, mask_fill=255)
        assert x.dtype == np.uint8 and m.dtype == mask_dtype and x.shape == ref_x.shape
        assert np.array_equal(m, ref_m)  # masks: exact (same coordinates, same rule)
        assert np.abs(x.astype(int) - ref_x).max() <= 1  # float32 vs float64 rounding only
        assert (x.astype(int) != ref_x).mean() < 0.01
        fx, _ = augment_host.warp_batch(aug, images, None, params, normalize=True)
        ref_f, _ = _reference(aug, images, None, params, mask_fill=255, normalize=True)
        assert fx.dtype == np.float32 and np.abs(fx - ref_f).max() < 0.05 / 255


@needs_kernel
def test_padding_covers_the_same_pixels_in_image_and_mask():
    aug = Augment(scale=(0.4, 0.5), crop=(40, 40), fill=(255, 0, 255))
    rng = np.random.default_rng(1)
    images = _textured(rng, 2, 30, 34)
    images[..., 1] |= 1  # never the fill colour
    masks = rng.integers(0, 4, (2, 30, 34)).astype(np.uint8)
    params = draw_params(aug, 30, 34, 0, 0, np.arange(2, dtype=np.uint64))
    x, m = augment_host.warp_batch(aug, images, masks, params, normalize=False, mask_fill=250)
    outside = (x == (255, 0, 255)).all(-1)
    assert outside.mean() > 0.5 and np.array_equal(outside, m == 250)


@needs_kernel
def test_one_hot_output_equals_class_map_one_hot():
    aug = RECIPES["photometric"]
    rng = np.random.default_rng(2)
    images = _textured(rng, 3, 25, 30)
    masks = rng.integers(0, 5, (3, 25, 30)).astype(np.uint8)
    masks[:, ::7] = 255  # ignored pixels
    params = draw_params(aug, 25, 30, 4, 0, np.arange(3, dtype=np.uint64))
    _, cmap = augment_host.warp_batch(aug, images, masks, params, normalize=False, mask_fill=255)
    _, hot = augment_host.warp_batch(aug, images, masks, params, normalize=True, mask_fill=255,
                                     one_hot_classes=5, ignore_index=255)
    expected = np.eye(6, dtype=np.float32)[np.minimum(cmap, 5)][..., :5]
    assert hot.dtype == np.float32 and np.array_equal(hot, expected)
    assert (hot.sum(-1) == 0).any() and (hot.sum(-1) == 1).any()


@needs_kernel
def test_one_hot_planes_are_resampled_with_zero_padding():
    aug = Augment(hflip=1.0, scale=(0.5, 0.6), crop=(20, 20))
    rng = np.random.default_rng(3)
    images = _textured(rng, 2, 16, 18)
    cmap = rng.integers(0, 3, (2, 16, 18))
    planes = np.eye(3, dtype=np.uint8)[cmap]
    params = draw_params(aug, 16, 18, 1, 0, np.arange(2, dtype=np.uint64))
    _, got = augment_host.warp_batch(aug, images, planes, params, normalize=False, mask_fill=0)
    _, ref = _reference(aug, images, cmap.astype(np.uint8), params, mask_fill=3, normalize=False)
    assert np.array_equal(got, np.eye(4, dtype=np.uint8)[ref][..., :3])


@needs_kernel
@pytest.mark.parametrize("name", list(RECIPES))
def test_tensorflow_implementation_agrees_with_the_kernel(name):
    """The fallback / accelerator implementation: masks exact where the source is uniform
    around the sampled position, images within 2 levels."""
    tf = pytest.importorskip("tensorflow")
    from readers.augment import augment_tf

    aug = RECIPES[name]
    rng = np.random.default_rng(7)
    h, w = 30, 36
    cmap = np.kron(rng.integers(0, 5, (3, 6, 6)), np.ones((1, 5, 6), np.int64)).astype(np.uint8)
    images = _textured(rng, 3, h, w)
    params = draw_params(aug, h, w, 11, 0, np.arange(3, dtype=np.uint64))
    x, m = augment_host.warp_batch(aug, images, cmap, params, normalize=False, mask_fill=255)
    tx, tm = augment_tf(aug, tf.constant(images), tf.constant(cmap), tf.constant(params), ignore_index=255,
                        segmentation=True, normalize=False)
    assert np.abs(x.astype(int) - tx.numpy()).max() <= 2
    # Where the 3x3 mask neighbourhood of the C result is uniform, a tie in the coordinate
    # rounding cannot change the class.
    uniform = np.ones(m.shape, bool)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            uniform &= np.roll(np.roll(m, dy, 1), dx, 2) == m
    uniform[:, [0, -1]] = uniform[:, :, [0, -1]] = False
    assert uniform.mean() > 0.3 and np.array_equal(m[uniform], tm.numpy()[uniform])


@needs_kernel
def test_bad_buffers_raise_value_errors_naming_them():
    aug = Augment(crop=(8, 8))
    images = np.zeros((2, 10, 10, 3), np.uint8)
    with pytest.raises(ValueError, match="params"):
        augment_host.warp_batch(aug, images, None, np.zeros((3, PARAMS), np.float32), normalize=False)
    with pytest.raises(ValueError, match="masks"):
        augment_host.warp_batch(aug, images, np.zeros((2, 10, 9), np.uint8), np.zeros((2, PARAMS), np.float32),
                                normalize=False)
    for bad in (np.zeros((2, 10, 10, 17), np.uint8), images.astype(np.float32), images[0, 0]):  # 1-16 channels of uint8/16
        with pytest.raises(ValueError, match="images"):
            augment_host.warp_batch(aug, bad, None, np.zeros((2, PARAMS), np.float32), normalize=False)


@needs_kernel
def test_switch_turns_the_kernel_off(monkeypatch):
    assert augment_host.fast_augment_available()
    monkeypatch.setenv("IMGSHARD_FAST_AUGMENT", "0")
    assert not augment_host.fast_augment_available()


def test_ci_requires_the_compiled_kernel():
    """.ci/run sets IMGSHARD_REQUIRE_FAST_PNG=1 (CI has a C compiler): readers._warp must have been built."""
    if os.environ.get("IMGSHARD_REQUIRE_FAST_PNG") != "1":
        pytest.skip("IMGSHARD_REQUIRE_FAST_PNG is not set (only CI requires the compiled extensions)")
    assert augment_host._warp is not None, "readers._warp did not build: is a C compiler installed?"


@needs_kernel
def test_output_blocks_are_reused_only_once_released():
    """Batches still held (by the caller or a TensorFlow tensor) keep their memory; a
    released block is reused and, for one-hot output, cleared again."""
    tf = pytest.importorskip("tensorflow")
    aug = RECIPES["photometric"]
    rng = np.random.default_rng(9)
    images = _textured(rng, 2, 22, 26)
    masks = rng.integers(0, 4, (2, 22, 26)).astype(np.uint8)
    params = [draw_params(aug, 22, 26, seed, 0, np.arange(2, dtype=np.uint64)) for seed in range(8)]
    run = [augment_host.warp_batch(aug, images, masks, p, normalize=True, one_hot_classes=4, ignore_index=255)
           for p in params]
    held = [(tf.constant(x), tf.constant(y)) for x, y in run]  # numpy-backed tensors may share the memory
    copies = [(x.copy(), y.copy()) for x, y in run]
    del run
    again = [augment_host.warp_batch(aug, images, masks, p, normalize=True, one_hot_classes=4, ignore_index=255)
             for p in params]
    for (tx, ty), (cx, cy), (ax, ay) in zip(held, copies, again):
        assert np.array_equal(tx.numpy(), cx) and np.array_equal(ty.numpy(), cy)
        assert np.array_equal(ax, cx) and np.array_equal(ay, cy)  # reused blocks give the same batches
        assert set(np.unique(ay.sum(-1)).tolist()) <= {0.0, 1.0}


def test_parameter_row_width_agrees_with_readers_augment():
    from readers import augment

    assert augment_host.PARAMS == augment.PARAMS == draw_params(Augment(), 4, 4, 0, 0, np.arange(1)).shape[1]


@needs_kernel
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_streaming_stores_give_the_same_batch(name, monkeypatch):
    """Large batches are written with streaming stores from a staged row (forced here on a
    small one): the same float image and one-hot bits as plain stores, on odd widths."""
    from readers.formats import expand

    aug = RECIPES[name]
    rng = np.random.default_rng(11)
    images = _textured(rng, 3, 27, 37)
    masks = rng.integers(0, 7, (3, 27, 37)).astype(np.uint8)
    masks[:, ::5] = 255
    params = draw_params(aug, 27, 37, 9, 0, np.arange(3, dtype=np.uint64))
    out = {}
    for stream in (False, True):
        monkeypatch.setattr(expand, "STREAM_MIN_BYTES", 0 if stream else 1 << 40)
        x, y = augment_host.warp_batch(aug, images, masks, params, normalize=True, mask_fill=255,
                                       one_hot_classes=5, ignore_index=255)
        out[stream] = (x.copy(), y.copy())
    for a, b in zip(out[False], out[True]):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert out[True][0].std() > 0 and out[True][1].sum() > 0


# -- image kinds: uint8 / uint16, 1 to 16 channels; general maps (rotation, shear, scale) ---------

def _textured_n(rng, b, h, w, channels, dtype):
    """Smooth waves per channel plus noise, over the dtype's full range (16-bit: every bit used)."""
    top = np.iinfo(dtype).max
    yy, xx = np.mgrid[0:h, 0:w]
    phase = rng.uniform(0, 6, (b, 1, 1, channels))
    wave = 0.5 + 0.45 * np.sin(xx[None, :, :, None] / rng.uniform(2, 5) + yy[None, :, :, None] / 3.7 + phase)
    noise = rng.uniform(-0.05, 0.05, (b, h, w, channels))
    return np.clip(np.round((wave + noise) * top), 0, top).astype(dtype)


def _reference_n(images, masks, params, out_size, *, fill, mask_fill, normalize, brightness=False):
    """Float64 reference of the documented kernel for any channel count and dtype (no colour
    jitter except a brightness delta, in 0-255 units scaled to the dtype's range)."""
    top = float(np.iinfo(images.dtype).max)
    xs, ms = [], []
    for n in range(images.shape[0]):
        p = params[n].astype(np.float64)
        v, inside, mk = _sample(images[n], masks[n], p, out_size, mask_fill)
        if brightness:
            v = np.clip(v + p[17] * top / 255.0, 0, top)
        v[~inside] = fill
        xs.append(v / top if normalize else np.clip(np.round(v), 0, top))
        ms.append(mk)
    return np.stack(xs), np.stack(ms)


def _affine_params(rng, b, h, w, out_size, *, rotate=0.0, shear=0.0, scale=(1.0, 1.0)):
    """Parameter rows of random maps output -> source: rotation, shear and scale about the
    centres, plus a random shift (identity colour matrix, contrast factor 1)."""
    params = np.zeros((b, PARAMS), np.float64)
    for n in range(b):
        t = np.deg2rad(rng.uniform(-rotate, rotate))
        k = rng.uniform(-shear, shear)
        s = rng.uniform(*scale)
        a = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]) @ np.array([[1, k], [0, 1]]) / s
        centre_out = (np.array(out_size[::-1]) - 1) / 2
        centre_src = (np.array([w, h]) - 1) / 2 + rng.uniform(-3, 3, 2)
        shift = centre_src - a @ centre_out
        params[n, :6] = a[0, 0], a[0, 1], shift[0], a[1, 0], a[1, 1], shift[1]
    params[:, 8:17] = np.eye(3).ravel()
    params[:, 17] = rng.uniform(-40, 40, b)  # a brightness delta (used only when asked)
    params[:, 18] = 1.0
    return params.astype(np.float32)


MAPS = {"rotate": dict(rotate=35.0, scale=(0.7, 1.4)), "shear": dict(shear=0.4),
        "scale": dict(scale=(0.45, 2.2)), "rotate-shear-scale": dict(rotate=170.0, shear=0.3, scale=(0.5, 1.8))}


@needs_kernel
@pytest.mark.parametrize("channels", [1, 3, 4, 13, 16])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("kind", list(MAPS))
def test_general_maps_match_the_reference_for_every_image_kind(channels, dtype, kind):
    rng = np.random.default_rng(channels * 100 + np.dtype(dtype).itemsize * 10 + list(MAPS).index(kind))
    b, h, w = 3, int(rng.integers(9, 40)) | 1, int(rng.integers(9, 40)) | 1  # odd sizes
    out_size = (int(rng.integers(7, 36)) | 1, int(rng.integers(7, 36)) | 1)
    images = _textured_n(rng, b, h, w, channels, dtype)
    masks = rng.integers(0, 7, (b, h, w)).astype(np.uint8)
    params = _affine_params(rng, b, h, w, out_size, **MAPS[kind])
    aug = Augment(crop=out_size, fill=9)
    top = np.iinfo(dtype).max
    fill = 9 * (257 if dtype == np.uint16 else 1)
    ref_x, ref_m = _reference_n(images, masks, params, out_size, fill=fill, mask_fill=250, normalize=False)
    x, m = augment_host.warp_batch(aug, images, masks, params, normalize=False, mask_fill=250)
    assert x.dtype == dtype and x.shape == (b, *out_size, channels)
    assert np.array_equal(m, ref_m)  # exact: the same coordinates, the same nearest rule
    assert np.abs(x.astype(np.int64) - ref_x).max() <= 1
    assert (m != 250).any() and x.std() > top / 20  # content, not only padding
    fx, _ = augment_host.warp_batch(aug, images, None, params, normalize=True)
    ref_f, _ = _reference_n(images, masks, params, out_size, fill=fill, mask_fill=250, normalize=True)
    assert fx.dtype == np.float32 and np.abs(fx - ref_f).max() < 0.02 / 255


@needs_kernel
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_brightness_is_a_fraction_of_the_dtype_range(dtype):
    rng = np.random.default_rng(21)
    images = _textured_n(rng, 2, 23, 31, 3, dtype)
    masks = rng.integers(0, 4, (2, 23, 31)).astype(np.uint8)
    params = _affine_params(rng, 2, 23, 31, (21, 25), rotate=20.0)
    aug = Augment(crop=(21, 25), brightness=0.2)
    x, m = augment_host.warp_batch(aug, images, masks, params, normalize=False, mask_fill=255)
    ref_x, ref_m = _reference_n(images, masks, params, (21, 25), fill=0, mask_fill=255, normalize=False,
                                brightness=True)
    assert np.array_equal(m, ref_m) and np.abs(x.astype(np.int64) - ref_x).max() <= 1


@needs_kernel
@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("channels,dtype", [(3, np.uint8), (1, np.uint8), (4, np.uint16), (3, np.uint16)])
def test_axis_aligned_maps_give_the_same_bits_on_both_paths(name, channels, dtype):
    """The separable path and the general one (forced) compute the same coordinates and
    blends: identical output, float and compact, image and mask, except the contrast mean
    (summed in another order): within a level there."""
    aug = RECIPES[name]
    if aug.rotates or (aug.photometric and channels != 3):
        aug = Augment(hflip=0.5, vflip=0.5, scale=(0.4, 1.9), crop=(25, 19), fill=3)
    if channels != 3:
        aug = dataclasses.replace(aug, fill=3)
    rng = np.random.default_rng(5)
    images = _textured_n(rng, 4, 27, 33, channels, dtype)
    masks = rng.integers(0, 9, (4, 27, 33)).astype(np.uint16)
    params = draw_params(aug, 27, 33, 3, 1, np.arange(4, dtype=np.uint64))
    assert (params[:, 1] == 0).all() and (params[:, 3] == 0).all()
    for normalize in (False, True):
        a = augment_host.warp_batch(aug, images, masks, params, normalize=normalize, mask_fill=255)
        a = (a[0].copy(), a[1].copy())
        g = augment_host.warp_batch(aug, images, masks, params, normalize=normalize, mask_fill=255, general=True)
        assert np.array_equal(a[1], g[1])
        if aug.contrast:
            assert np.abs(a[0].astype(np.float64) - g[0]).max() <= (1.01 / 255 if normalize else 1)
        else:
            assert np.array_equal(a[0], g[0])


@needs_kernel
def test_the_last_pixel_of_the_batch_is_sampled_without_reading_past_it():
    """The vector gathers read 4 bytes per 3-byte pixel; at the batch's very last pixel they
    read one byte earlier. A sheared map whose last output pixel (inside a vector block of 8)
    lands exactly on the bottom-right pixel of the last sample."""
    rng = np.random.default_rng(8)
    b, h, w, oh, ow = 2, 17, 45, 9, 32
    images = _textured(rng, b, h, w)
    images[-1, -1, -1] = (250, 3, 128)
    masks = rng.integers(0, 5, (b, h, w)).astype(np.uint8)
    masks[-1, -1, -1] = 4
    params = _affine_params(rng, b, h, w, (oh, ow))
    # sx = x + 0.5 y + t0, sy = y + t1: output (oh - 1, ow - 1) -> source (h - 1, w - 1) exactly
    params[:, :6] = 1.0, 0.5, (w - 1) - (ow - 1) - 0.5 * (oh - 1), 0.0, 1.0, (h - 1) - (oh - 1)
    x, m = augment_host.warp_batch(Augment(crop=(oh, ow)), images, masks, params, normalize=False, mask_fill=255)
    ref_x, ref_m = _reference_n(images, masks, params, (oh, ow), fill=0, mask_fill=255, normalize=False)
    assert np.array_equal(m, ref_m) and np.abs(x.astype(int) - ref_x).max() <= 1
    assert tuple(x[-1, -1, -1]) == (250, 3, 128) and m[-1, -1, -1] == 4


@needs_kernel
@pytest.mark.parametrize("bad", [np.nan, 1e30, -1e30])
def test_hostile_parameters_give_padding_not_a_crash(bad):
    rng = np.random.default_rng(4)
    images = _textured(rng, 2, 12, 14)
    masks = rng.integers(0, 3, (2, 12, 14)).astype(np.uint8)
    params = _affine_params(rng, 2, 12, 14, (10, 10), rotate=30.0)
    params[:, [0, 2, 5]] = bad  # a00 too: the step itself
    x, m = augment_host.warp_batch(Augment(crop=(10, 10), fill=(1, 2, 3)), images, masks, params,
                                   normalize=False, mask_fill=254)
    assert (m == 254).all() and (x == (1, 2, 3)).all()


def test_fast_augment_supports_names_the_image_kinds():
    built = augment_host.fast_augment_available()
    for dtype in (np.uint8, np.uint16, "uint8", np.dtype("uint16")):
        assert augment_host.fast_augment_supports(dtype, 1) is built
        assert augment_host.fast_augment_supports(dtype, 16) is built
    for dtype, channels in ((np.float32, 3), (np.int16, 3), (np.uint8, 0), (np.uint8, 17), (np.uint8, True),
                            ("not a dtype", 3), (np.uint32, 3)):
        assert augment_host.fast_augment_supports(dtype, channels) is False


@needs_kernel
def test_colour_jitter_and_rgb_fill_need_three_channels():
    rng = np.random.default_rng(6)
    grey = _textured_n(rng, 2, 10, 12, 1, np.uint8)
    params = _affine_params(rng, 2, 10, 12, (8, 8))
    with pytest.raises(ValueError, match="3-channel.*Received: 1 channels"):
        augment_host.warp_batch(Augment(crop=(8, 8), brightness=0.1), grey, None, params, normalize=False)
    with pytest.raises(ValueError, match="fill.*Received: fill=\\(1, 2, 3\\)"):
        augment_host.warp_batch(Augment(crop=(8, 8), fill=(1, 2, 3)), grey, None, params, normalize=False)


@needs_kernel
@pytest.mark.parametrize("rotate", [0.0, 10.0, 90.0])
@pytest.mark.parametrize("channels,dtype", [(3, np.uint8), (1, np.uint8), (4, np.uint16), (3, np.uint16)])
def test_vector_and_plain_kernels_give_the_same_bits(rotate, channels, dtype):
    """The hand-written AVX2 kernels (where the CPU has them) against the plain C ones."""
    colour = channels == 3
    aug = Augment(hflip=0.5, rotate=rotate, scale=(0.5, 2.0), crop=(29, 37), brightness=0.2 if colour else 0.0,
                  contrast=0.2 if colour else 0.0)
    rng = np.random.default_rng(12)
    images = _textured_n(rng, 3, 31, 43, channels, dtype)
    masks = rng.integers(0, 6, (3, 31, 43)).astype(np.uint8)
    params = draw_params(aug, 31, 43, 2, 0, np.arange(3, dtype=np.uint64))
    out = {}
    for simd in (True, False):
        before = augment_host._warp.use_simd(simd)
        try:
            for normalize in (False, True):
                x, y = augment_host.warp_batch(aug, images, masks, params, normalize=normalize, mask_fill=255,
                                               one_hot_classes=6 if normalize else 0, ignore_index=255)
                out[simd, normalize] = (x.copy(), y.copy())
        finally:
            augment_host._warp.use_simd(before)
    for normalize in (False, True):
        for a, b in zip(out[True, normalize], out[False, normalize]):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


@needs_kernel
def test_grey_batches_without_a_channel_axis_keep_that_shape():
    rng = np.random.default_rng(13)
    grey = _textured_n(rng, 2, 19, 23, 1, np.uint16)
    masks = rng.integers(0, 4, (2, 19, 23)).astype(np.uint8)
    params = _affine_params(rng, 2, 19, 23, (15, 17), rotate=25.0)
    aug = Augment(crop=(15, 17), fill=2)
    x, m = augment_host.warp_batch(aug, grey[..., 0], masks, params, normalize=False, mask_fill=255)
    x4, m4 = augment_host.warp_batch(aug, grey, masks, params, normalize=False, mask_fill=255)
    assert x.shape == (2, 15, 17) and np.array_equal(x, x4[..., 0]) and np.array_equal(m, m4)


@needs_kernel
@pytest.mark.parametrize("rotate", [0.0, 10.0])
def test_streamed_float_rows_on_aligned_widths_give_the_same_bits(rotate, monkeypatch):
    """Rows of a width that keeps them 32-byte aligned are interleaved and streamed by the
    vector store (forced here on a small batch): same bits as plain stores and plain C."""
    from readers.formats import expand

    aug = Augment(hflip=0.5, rotate=rotate, scale=(0.6, 1.7), crop=(21, 40), brightness=0.2)
    rng = np.random.default_rng(14)
    images = _textured(rng, 3, 33, 45)
    masks = rng.integers(0, 6, (3, 33, 45)).astype(np.uint8)
    params = draw_params(aug, 33, 45, 5, 0, np.arange(3, dtype=np.uint64))
    out = {}
    for stream, simd in ((False, True), (True, True), (True, False)):
        monkeypatch.setattr(expand, "STREAM_MIN_BYTES", 0 if stream else 1 << 40)
        before = augment_host._warp.use_simd(simd)
        try:
            x, y = augment_host.warp_batch(aug, images, masks, params, normalize=True, mask_fill=255,
                                           one_hot_classes=6, ignore_index=255)
        finally:
            augment_host._warp.use_simd(before)
        assert x.ctypes.data % 32 == 0  # pooled blocks are 64-byte aligned: 40 x 3 floats per row keeps rows aligned
        out[stream, simd] = (x.copy(), y.copy())
    ref_x, ref_m = _reference(aug, images, masks, params, mask_fill=255, normalize=True)
    assert np.abs(out[False, True][0] - ref_x).max() < 0.05 / 255
    for key in ((True, True), (True, False)):
        for a, b in zip(out[False, True], out[key]):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
