"""The `_resample` C extension (Pillow's antialiased resampling) against Pillow itself.

Every case resizes textured pixels (never flat colour, where a wrong weight could hide)
with `_resample.resample` and with `PIL.Image.resize(size, filter, box=box,
reducing_gap=None)`, and wants the same bytes: each filter, greyscale and RGB, shrinking,
growing and both at once, integer and fractional boxes, through both the vectorised
kernels (`simd=True`, AVX2 where the CPU has it) and the plain C loops (`simd=False`).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from converter.testing import synth
from converter.options import Fit, ImageFilter
from converter.transform import resize
from converter.transform.resize import plan_geometry, resize_image

needs_fast = pytest.mark.skipif(not resize.fast_resize_available(),
                                reason="the _resample extension is not built (no C compiler)")

_R = resize._resample
FILTERS = {
    "box": Image.Resampling.BOX,
    "bilinear": Image.Resampling.BILINEAR,
    "hamming": Image.Resampling.HAMMING,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


def _textured(h: int, w: int, channels: int, seed: int) -> np.ndarray:
    rgb = synth.textured_image(h, w, np.random.default_rng(seed))
    return rgb[:, :, 1].copy() if channels == 1 else rgb


def _pillow(src: np.ndarray, size: tuple[int, int], resample: int, box: tuple[float, ...]) -> np.ndarray:
    """Pillow's result for an (h, w) `size`."""
    return np.asarray(Image.fromarray(src).resize((size[1], size[0]), resample, box=box, reducing_gap=None))


def _ours(src: np.ndarray, size: tuple[int, int], resample: int, box: tuple[float, ...], simd: bool) -> np.ndarray:
    out = np.empty(size + src.shape[2:], np.uint8)
    channels = 1 if src.ndim == 2 else 3
    _R.resample(src, src.shape[0], src.shape[1], channels, out, size[0], size[1], int(resample), box, simd=simd)
    return out


def _assert_same(src: np.ndarray, size: tuple[int, int], resample: int, box: tuple[float, ...]) -> None:
    want = _pillow(src, size, resample, box)
    for simd in (True, False):
        got = _ours(src, size, resample, box, simd)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want, err_msg=f"size={size} filter={resample!r} box={box} simd={simd}")


# (name, source (h, w), output (h, w), box): shrink, grow, and each axis its own way
SHAPES = [
    ("shrink_full", (57, 83), (19, 26), (0.0, 0.0, 83.0, 57.0)),
    ("shrink_int_box", (57, 83), (13, 17), (5.0, 3.0, 70.0, 51.0)),
    ("shrink_frac_box", (57, 83), (16, 21), (4.25, 2.7, 77.6, 55.1)),
    ("grow_full", (13, 17), (41, 53), (0.0, 0.0, 17.0, 13.0)),
    ("grow_frac_box", (13, 17), (35, 47), (1.5, 0.33, 15.75, 12.2)),
    ("shrink_w_grow_h", (23, 91), (49, 30), (0.0, 0.0, 91.0, 23.0)),
    ("grow_w_shrink_h", (91, 23), (30, 49), (2.2, 1.0, 21.9, 88.5)),
    ("tall_shrink_vertical_first", (120, 40), (15, 33), (0.0, 0.0, 40.0, 120.0)),
    ("same_size_frac_shift", (31, 37), (31, 37), (0.5, 0.25, 36.5, 30.25)),
    ("one_row_and_column", (1, 1), (7, 5), (0.0, 0.0, 1.0, 1.0)),
]


@needs_fast
@pytest.mark.parametrize("channels", [1, 3], ids=["grey", "rgb"])
@pytest.mark.parametrize("name", list(FILTERS))
@pytest.mark.parametrize("case", SHAPES, ids=[s[0] for s in SHAPES])
def test_every_filter_equals_pillow_shrinking_growing_and_mixed(case, name: str, channels: int) -> None:
    _, (h, w), size, box = case
    src = _textured(h, w, channels, seed=h * 7 + w)
    _assert_same(src, size, FILTERS[name], box)


@needs_fast
def test_random_sizes_boxes_and_filters_equal_pillow() -> None:
    rng = np.random.default_rng(2026)
    base = synth.textured_image(70, 90, np.random.default_rng(1))
    for _ in range(400):
        h, w = int(rng.integers(1, 71)), int(rng.integers(1, 91))
        src = np.ascontiguousarray(base[:h, :w, 2] if rng.random() < 0.5 else base[:h, :w])
        size = (int(rng.integers(1, 100)), int(rng.integers(1, 100)))
        x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
        kind = rng.integers(0, 3)
        if kind == 0:
            box = (0.0, 0.0, float(w), float(h))
        elif kind == 1:
            ix0, iy0 = int(x0), int(y0)
            box = (float(ix0), float(iy0), float(rng.integers(ix0, w + 1)), float(rng.integers(iy0, h + 1)))
        else:
            box = (x0, y0, rng.uniform(x0, w), rng.uniform(y0, h))
        _assert_same(src, size, FILTERS[str(rng.choice(list(FILTERS)))], box)


@needs_fast
@pytest.mark.parametrize("channels", [1, 3], ids=["grey", "rgb"])
def test_full_hd_to_512_bilinear_stretch_and_cover_equal_pillow(channels: int) -> None:
    src = _textured(1080, 1920, channels, seed=0)
    _assert_same(src, (512, 512), Image.Resampling.BILINEAR, (0.0, 0.0, 1920.0, 1080.0))
    geom = plan_geometry((1080, 1920), (512, 512), Fit.COVER)
    _assert_same(src, (512, 512), Image.Resampling.BILINEAR, geom.box)


@needs_fast
@pytest.mark.parametrize("channels", [1, 3], ids=["grey", "rgb"])
def test_pillow_short_cuts_crop_and_copy_are_kept(channels: int) -> None:
    src = _textured(20, 30, channels, seed=3)
    _assert_same(src, (12, 9), Image.Resampling.BICUBIC, (4.0, 5.0, 13.0, 17.0))  # integer box of the output size
    _assert_same(src, (20, 30), Image.Resampling.LANCZOS, (0.0, 0.0, 30.0, 20.0))  # nothing to do
    _assert_same(src, (20, 30), Image.Resampling.BILINEAR, (0.0, 0.0, 30.0, 19.0))  # vertical pass only
    _assert_same(src, (20, 30), Image.Resampling.BILINEAR, (0.0, 0.0, 29.5, 20.0))  # horizontal pass only


@needs_fast
@pytest.mark.parametrize("name", list(FILTERS))
def test_empty_and_edge_boxes_equal_pillow(name: str) -> None:
    src = _textured(25, 33, 3, seed=4)
    _assert_same(src, (4, 6), FILTERS[name], (10.0, 7.0, 10.0, 7.0))  # zero-size box
    _assert_same(src, (9, 5), FILTERS[name], (32.0, 24.0, 33.0, 25.0))  # the last pixel
    _assert_same(src, (30, 40), FILTERS[name], (32.9, 0.0, 33.0, 25.0))  # a sliver at the right edge
    _assert_same(src, (3, 4), FILTERS[name], (33.0, 25.0, 33.0, 25.0))  # zero-size box on the far corner
    _assert_same(src, (6, 8), FILTERS[name], (0.0, 25.0, 33.0, 25.0))  # zero-height box on the bottom edge


@needs_fast
@pytest.mark.parametrize("fit", list(Fit), ids=lambda f: f.value)
@pytest.mark.parametrize("image_filter", [f for f in ImageFilter], ids=lambda f: f.value)
def test_resize_image_is_unchanged_by_the_extension(fit: Fit, image_filter: ImageFilter,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rgb = _textured(45, 70, 3, seed=5)
    grey = rgb[:, :, 0].copy()
    geom = plan_geometry(rgb.shape[:2], (32, 48), fit)
    fast = [resize_image(a, geom, image_filter) for a in (rgb, grey)]
    monkeypatch.setattr(resize, "_resample", None)
    assert not resize.fast_resize_available()
    slow = [resize_image(a, geom, image_filter) for a in (rgb, grey)]
    for f, s in zip(fast, slow):
        assert f.shape == s.shape == (32, 48, 3) and f.dtype == s.dtype == np.uint8
        np.testing.assert_array_equal(f, s)


def test_without_the_extension_pillow_resizes(monkeypatch: pytest.MonkeyPatch) -> None:
    rgb = _textured(30, 40, 3, seed=6)
    geom = plan_geometry((30, 40), (16, 16), Fit.COVER)
    monkeypatch.setattr(resize, "_resample", None)
    got = resize_image(rgb, geom, ImageFilter.BILINEAR)
    np.testing.assert_array_equal(got, _pillow(rgb, (16, 16), Image.Resampling.BILINEAR, geom.box))


@needs_fast
def test_non_contiguous_input_is_resampled_like_a_copy() -> None:
    rgb = _textured(40, 60, 3, seed=7)
    view = rgb[::2, 5:55]
    got = resize.resample(view, (11, 13), (1.5, 0.0, 48.0, 20.0), ImageFilter.LANCZOS)
    np.testing.assert_array_equal(got, _pillow(np.ascontiguousarray(view), (11, 13), Image.Resampling.LANCZOS,
                                               (1.5, 0.0, 48.0, 20.0)))


@needs_fast
def test_bad_arguments_raise_value_error_naming_them() -> None:
    src = np.zeros((4, 5, 3), np.uint8)
    out = np.empty((2, 3, 3), np.uint8)
    box = (0.0, 0.0, 5.0, 4.0)
    bil = _R.FILTER_BILINEAR
    with pytest.raises(ValueError, match="filter must be .*Received: filter=0"):
        _R.resample(src, 4, 5, 3, out, 2, 3, 0, box)
    with pytest.raises(ValueError, match="channels must be 1 .*Received: channels=4"):
        _R.resample(src, 4, 5, 4, out, 2, 3, bil, box)
    with pytest.raises(ValueError, match="out_height and out_width must be > 0"):
        _R.resample(src, 4, 5, 3, out, 0, 3, bil, box)
    with pytest.raises(ValueError, match="height and width must be > 0"):
        _R.resample(src, -4, 5, 3, out, 2, 3, bil, box)
    with pytest.raises(ValueError, match="src must hold .* = 60 bytes. Received: 48"):
        _R.resample(src[:, :4].copy(), 4, 5, 3, out, 2, 3, bil, box)
    with pytest.raises(ValueError, match="out must hold .* = 18 bytes. Received: 24"):
        _R.resample(src, 4, 5, 3, np.empty((2, 4, 3), np.uint8), 2, 3, bil, box)
    for bad in [(-0.5, 0.0, 5.0, 4.0), (0.0, 0.0, 5.5, 4.0), (0.0, 0.0, 5.0, 4.25), (3.0, 0.0, 2.0, 4.0),
                (0.0, 0.0, float("nan"), 4.0)]:
        with pytest.raises(ValueError, match=r"box must lie inside the 5x4 image .*Received: box=\("):
            _R.resample(src, 4, 5, 3, out, 2, 3, bil, bad)
    with pytest.raises(TypeError):
        _R.resample(src, 4, 5, 3, bytes(18), 2, 3, bil, box)  # read-only output


def test_the_extension_is_built_where_ci_requires_it() -> None:
    """.ci/run sets IMGSHARD_REQUIRE_FAST_PNG=1 (CI has a C compiler): both C extensions must have been built."""
    if os.environ.get("IMGSHARD_REQUIRE_FAST_PNG") != "1":
        pytest.skip("IMGSHARD_REQUIRE_FAST_PNG is not set (only CI requires the compiled extensions)")
    assert resize.fast_resize_available(), "converter.transform._resample did not build: is a C compiler installed?"


# -- NEAREST indices (masks), without Pillow ------------------------------------------------------

def _pillow_nearest(src_len: int, out_len: int, start: float, stop: float) -> np.ndarray:
    """What Pillow's NEAREST resize picks from a one-row index image: the reference."""
    ramp = Image.fromarray(np.arange(src_len, dtype=np.int32).reshape(1, src_len), mode="I")
    picked = ramp.resize((out_len, 1), Image.Resampling.NEAREST, box=(start, 0.0, stop, 1.0))
    return np.asarray(picked, dtype=np.int32).reshape(out_len).astype(np.intp)


def test_nearest_indices_equal_pillow_on_real_and_random_geometries() -> None:
    rng = np.random.default_rng(7)
    cases = [(1080, 512, 0.0, 1080.0), (1920, 512, 0.0, 1920.0), (1920, 512, 240.0, 1680.0),
             (3024, 224, 0.0, 3024.0), (7, 512, 0.0, 7.0), (512, 512, 0.0, 512.0), (100, 37, 12.0, 49.0),
             (1080, 1080, 0.5, 1080.0), (1, 5, 0.0, 1.0), (5000, 1, 0.0, 5000.0)]
    for _ in range(3000):
        src = int(rng.choice([rng.integers(1, 64), rng.integers(1, 5000), 1080, 1920, 4032]))
        out = int(rng.choice([rng.integers(1, 64), rng.integers(1, 3000), 512, 224, src]))
        a, b = sorted(rng.uniform(0, src, 2))
        if rng.random() < 0.3:
            a, b = float(int(a)), float(int(b))
        cases.append((src, out, float(a), float(b)))
    for src, out, start, stop in cases:
        ours = resize._nearest_indices.__wrapped__(src, out, start, stop)
        assert np.array_equal(ours, _pillow_nearest(src, out, start, stop)), (src, out, start, stop)


def test_filter_numbers_are_pillows() -> None:
    for ours, pillow in ((ImageFilter.NEAREST, Image.Resampling.NEAREST), (ImageFilter.BILINEAR, Image.Resampling.BILINEAR),
                         (ImageFilter.BICUBIC, Image.Resampling.BICUBIC), (ImageFilter.LANCZOS, Image.Resampling.LANCZOS),
                         (ImageFilter.BOX, Image.Resampling.BOX)):
        assert resize.PIL_FILTERS[ours] == int(pillow)


def test_a_png_conversion_never_imports_pillow(tmp_path) -> None:
    """Start-up cost (issue 4): Pillow is imported only for files the fast path declines."""
    import subprocess
    import sys

    src = tmp_path / "src"
    synth.make_camvid(src, splits={"train": 3}, size=(96, 128), image_modes=("RGB", "L", "RGBA"),
                      mask_modes=("RGB",), quirks=False, seed=3)
    code = ("import sys\n"
            "from converter.convert import convert\n"
            "from converter.options import OutputOptions, SourceSpec\n"
            f"convert(SourceSpec(root={str(src)!r}), {str(tmp_path / 'out')!r}, OutputOptions(size=(64, 64)))\n"
            "print('PIL' in sys.modules)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == ("False" if resize.fast_resize_available() else "True")
