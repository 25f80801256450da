"""Images beyond 8-bit RGB: 12/16-bit grey and 4/8-band TIFFs stored as they are and read
back bit-exact against a reference computed here (Pillow / tifffile read + Pillow's
`I;16` resize per band); every refusal with its message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import readers
from converter.convert import BadInputError, convert
from converter.imagekind import ImageKind
from converter.options import LabelOptions, OutputOptions, RunOptions, SourceSpec
from converter.transform.kinds import ImageKindError

tifffile = pytest.importorskip("tifffile")

ROOT = Path(__file__).resolve().parents[1]
BILINEAR = Image.Resampling.BILINEAR


def _texture(rng: np.random.Generator, h: int, w: int, top: int, phase: float) -> np.ndarray:
    """Smooth waves plus noise over the full range 0..top (never 0..255 only)."""
    yy, xx = np.mgrid[0:h, 0:w]
    wave = 0.5 + 0.25 * np.sin(xx / 3.0 + phase) + 0.25 * np.cos(yy / 4.0 - phase)
    noise = rng.integers(0, top // 8 + 1, (h, w))
    return np.clip(wave * (top - top // 8) + noise, 0, top).astype(np.uint16)


def _masks(folder: Path, names: list[str], images: list[np.ndarray]) -> None:
    folder.mkdir(parents=True)
    for name, img in zip(names, images):
        plane = img if img.ndim == 2 else img[..., 0]
        Image.fromarray((plane > np.median(plane)).astype(np.uint8)).save(folder / f"{name}.png")


def _grey_dataset(root: Path, top: int, n: int = 5, seed: int = 0) -> list[np.ndarray]:
    """`n` 16-bit grey PNGs using 0..top (shuffled names), binary masks beside them."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    names = [f"slice_{i}" for i in rng.permutation(n)]
    images = [_texture(rng, 30 + 2 * i, 41 + i, top, i) for i in range(n)]
    for name, img in zip(names, images):
        Image.fromarray(img).save(root / "images" / f"{name}.png")
    _masks(root / "masks", names, images)
    return images


def _band_tiffs(root: Path, bands: int, **tiff_kw) -> dict[str, np.ndarray]:
    """Multi-band uint16 TIFFs (H, W, bands) written by tifffile with `tiff_kw`; name -> array."""
    rng = np.random.default_rng(bands)
    (root / "images").mkdir(parents=True)
    out = {}
    for i in range(4):
        arr = np.stack([_texture(rng, 48, 64, 65535, i + b) for b in range(bands)], axis=-1)
        name = f"tile_{(i * 7) % 5}"
        planar = tiff_kw.get("planarconfig") == "separate"  # bands first on disk
        tifffile.imwrite(root / "images" / f"{name}.tif", np.moveaxis(arr, -1, 0) if planar else arr, **tiff_kw)
        out[name] = arr
    _masks(root / "masks", list(out), list(out.values()))
    return out


def _convert(src: Path, out: Path, size: tuple[int, int], **kw) -> None:
    spec = SourceSpec(images=str(src / "images"), masks=str(src / "masks"))
    options = OutputOptions(size=size, labels=LabelOptions(num_classes=2), **kw)
    convert(spec, str(out), options, RunOptions(workers=1))


def _resize_band(band: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The documented resize: Pillow's `I;16` resampling of one band, whole source box."""
    h, w = size
    im = Image.fromarray(np.ascontiguousarray(band, np.uint16))  # mode I;16
    return np.asarray(im.resize((w, h), BILINEAR, box=(0, 0, band.shape[1], band.shape[0]), reducing_gap=None))


def _expected(arr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    arr = arr if arr.ndim == 3 else arr[..., None]
    return np.stack([_resize_band(arr[..., c], size) for c in range(arr.shape[2])], axis=-1)


def _by_key(out: Path) -> dict[str, np.ndarray]:
    ds = readers.open(str(out))
    return {Path(r.key).stem: r.image for r in ds.records("train")}


@pytest.mark.parametrize("top", [4095, 65535], ids=["12bit", "16bit"])
@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_grey_16bit_round_trip_is_exact(tmp_path: Path, top: int, fmt: str) -> None:
    images = _grey_dataset(tmp_path / "src", top)
    _convert(tmp_path / "src", tmp_path / "out", (24, 32), format=fmt)
    manifest = json.loads((tmp_path / "out" / "imgshard.json").read_text())
    assert (manifest["image"]["dtype"], manifest["image"]["channels"]) == ("uint16", 1)
    got = _by_key(tmp_path / "out")
    src = {p.stem: np.asarray(Image.open(p)) for p in (tmp_path / "src" / "images").iterdir()}
    assert len(got) == len(images)
    for name, image in got.items():
        assert image.dtype == np.uint16 and image.shape == (24, 32, 1)
        np.testing.assert_array_equal(image, _expected(src[name], (24, 32)))
    assert max(int(i.max()) for i in got.values()) > 255  # the precision is there, not 8 bits of it


def test_grey_12bit_unresized_keeps_every_level(tmp_path: Path) -> None:
    images = _grey_dataset(tmp_path / "src", 4095, n=1)
    h, w = images[0].shape
    _convert(tmp_path / "src", tmp_path / "out", (h, w))
    (image,) = _by_key(tmp_path / "out").values()
    np.testing.assert_array_equal(image[..., 0], images[0])


@pytest.mark.parametrize("bands,tiff_kw", [
    (4, {"tile": (16, 16), "compression": "zlib", "photometric": "minisblack", "planarconfig": "contig"}),
    (8, {"tile": (32, 32), "compression": "lzw", "photometric": "minisblack", "planarconfig": "separate"}),
], ids=["4band-tiled-zlib", "8band-tiled-lzw-planar"])
def test_multiband_tiff_round_trip_is_exact(tmp_path: Path, bands: int, tiff_kw: dict) -> None:
    pytest.importorskip("imagecodecs")
    arrays = _band_tiffs(tmp_path / "src", bands, **{k: v for k, v in tiff_kw.items() if k != "planarconfig"},
                         planarconfig=tiff_kw["planarconfig"])
    _convert(tmp_path / "src", tmp_path / "out", (20, 28), format="npz")
    got = _by_key(tmp_path / "out")
    for name, arr in arrays.items():
        reread = tifffile.imread(tmp_path / "src" / "images" / f"{name}.tif")  # the reference reader
        reread = np.moveaxis(reread, 0, -1) if reread.shape[0] == bands else reread
        np.testing.assert_array_equal(reread, arr)
        assert got[name].shape == (20, 28, bands)
        np.testing.assert_array_equal(got[name], _expected(reread, (20, 28)))


def test_tf_dataset_normalizes_by_the_dtype_range(tmp_path: Path) -> None:
    _grey_dataset(tmp_path / "src", 65535, n=4)
    _convert(tmp_path / "src", tmp_path / "out", (16, 16))
    ds = readers.open(str(tmp_path / "out"))
    stored = np.stack([r.image for r in ds.records("train")])
    xs = np.concatenate([x.numpy() for x, _ in ds.tf_dataset("train", batch_size=2, shuffle=False)])
    raw = np.concatenate([x.numpy() for x, _ in ds.tf_dataset("train", batch_size=2, shuffle=False,
                                                              normalize=False, one_hot=False)])
    assert raw.dtype == np.uint16 and xs.dtype == np.float32
    np.testing.assert_array_equal(np.sort(raw.ravel()), np.sort(stored.ravel()))
    np.testing.assert_allclose(np.sort(xs.ravel()), np.sort(stored.ravel() / 65535.0), atol=1e-6)


def test_model_fit_on_16bit_grey_and_4band(tmp_path: Path) -> None:
    keras = pytest.importorskip("keras")
    _grey_dataset(tmp_path / "grey", 4095, n=4)
    _band_tiffs(tmp_path / "bands", 4, tile=(16, 16), compression="zlib", photometric="minisblack",
                planarconfig="contig")
    for name, channels in (("grey", 1), ("bands", 4)):
        _convert(tmp_path / name, tmp_path / f"out_{name}", (16, 16))
        ds = readers.open(str(tmp_path / f"out_{name}"))
        assert ds.image_shape == (16, 16, channels)
        model = keras.Sequential([keras.Input((16, 16, channels)), keras.layers.Conv2D(2, 3, padding="same"),
                                  keras.layers.Softmax()])
        model.compile("sgd", "categorical_crossentropy")
        history = model.fit(ds.tf_dataset("train", batch_size=2), epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])


# -- refusals ---------------------------------------------------------------------------------------


def test_rgb_mode_on_16bit_is_refused_then_recorded_when_accepted(tmp_path: Path) -> None:
    images = _grey_dataset(tmp_path / "src", 4095, n=2)
    with pytest.raises(ImageKindError, match=r"16-bit -> 8-bit.*--accept-reduction"):
        _convert(tmp_path / "src", tmp_path / "out", (8, 8), image_kind=ImageKind(mode="rgb"))
    h, w = images[0].shape
    # the same size as the first image: its values are the top 8 bits, replicated to RGB
    _convert(tmp_path / "src", tmp_path / "out", (h, w), image_kind=ImageKind(mode="rgb", accept_reduction=True))
    manifest = json.loads((tmp_path / "out" / "imgshard.json").read_text())
    assert manifest["image"]["dtype"] == "uint8" and manifest["image"]["channels"] == 3
    assert manifest["image"]["reductions"] == ["16-bit -> 8-bit (the top 8 bits of each sample)"]
    src = {p.stem: np.asarray(Image.open(p)) for p in (tmp_path / "src" / "images").iterdir()}
    for name, image in _by_key(tmp_path / "out").items():
        if image.shape[:2] == src[name].shape:
            np.testing.assert_array_equal(image, np.repeat((src[name] >> 8).astype(np.uint8)[..., None], 3, 2))


def test_grey_mode_on_multiband_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("imagecodecs")
    _band_tiffs(tmp_path / "src", 4, compression="zlib", photometric="minisblack", planarconfig="contig")
    with pytest.raises(ImageKindError, match=r"4 channels -> 1.*--accept-reduction"):
        _convert(tmp_path / "src", tmp_path / "out", (8, 8), image_kind=ImageKind(mode="grey"))


@pytest.mark.parametrize("encoding", ["jpeg", "webp"])
def test_lossy_storage_is_refused_for_uint16(tmp_path: Path, encoding: str) -> None:
    _grey_dataset(tmp_path / "src", 65535, n=2)
    with pytest.raises(ImageKindError, match=rf"--image-encoding {encoding}.*uint16.*--image-encoding raw"):
        _convert(tmp_path / "src", tmp_path / "out", (8, 8), image_encoding=encoding)


def test_png_storage_is_refused_for_multiband(tmp_path: Path) -> None:
    _band_tiffs(tmp_path / "src", 4, compression="zlib", photometric="minisblack", planarconfig="contig")
    with pytest.raises(ImageKindError, match=r"--image-encoding png stores 8-bit RGB.*4 channel"):
        _convert(tmp_path / "src", tmp_path / "out", (8, 8), image_encoding="png")


@pytest.mark.parametrize("fmt,compression", [("tfrecord", None), ("tfrecord", "gzip"), ("npz", None)])
def test_png16_storage_of_16bit_grey_is_exact(tmp_path: Path, fmt: str, compression: str | None) -> None:
    """(gzip TFRecord without a seed: TensorFlow's reader and `tf.io.decode_png` decode it.)"""
    _grey_dataset(tmp_path / "src", 65535, n=4)
    _convert(tmp_path / "src", tmp_path / "raw", (16, 20), format=fmt)
    _convert(tmp_path / "src", tmp_path / "png", (16, 20), format=fmt, image_encoding="png", compression=compression)
    raw, png = _by_key(tmp_path / "raw"), _by_key(tmp_path / "png")
    assert sorted(raw) == sorted(png)
    for key in raw:
        assert png[key].dtype == np.uint16 and png[key].shape == (16, 20, 1)
        np.testing.assert_array_equal(png[key], raw[key])
    ds = readers.open(str(tmp_path / "png"))
    x = np.concatenate([b.numpy() for b, _ in ds.tf_dataset("train", 2, shuffle=False, normalize=False,
                                                            one_hot=False)])
    assert x.dtype == np.uint16
    np.testing.assert_array_equal(np.sort(x.ravel()), np.sort(np.concatenate([v.ravel() for v in raw.values()])))


def test_float_images_are_refused(tmp_path: Path) -> None:
    (tmp_path / "src" / "images").mkdir(parents=True)
    img = np.random.default_rng(0).random((12, 14)).astype(np.float32)
    tifffile.imwrite(tmp_path / "src" / "images" / "a.tif", img)
    _masks(tmp_path / "src" / "masks", ["a"], [img])
    with pytest.raises(ImageKindError, match=r"a\.tif: a float image.*16-bit integers"):
        _convert(tmp_path / "src", tmp_path / "out", (8, 8))


def test_mixed_8_and_16_bit_is_refused(tmp_path: Path) -> None:
    images = _grey_dataset(tmp_path / "src", 4095, n=2)
    Image.fromarray((images[0] >> 4).astype(np.uint8)).save(tmp_path / "src" / "images" / "slice_0.png")
    with pytest.raises(ImageKindError, match=r"mix 8-bit .*and 16-bit"):
        _convert(tmp_path / "src", tmp_path / "out", (8, 8))


def test_16bit_file_in_an_8bit_dataset_is_refused_not_reduced(tmp_path: Path) -> None:
    """A 16-bit file the probe did not look at (one of 40) is refused by name in the worker."""
    rng = np.random.default_rng(3)
    (tmp_path / "src" / "images").mkdir(parents=True)
    images, names = [], []
    for i in range(40):
        wide = i == 1  # sorted second: not among the files the probe spreads over
        img = _texture(rng, 10, 12, 4095 if wide else 255, i)
        img = img if wide else img.astype(np.uint8)
        Image.fromarray(img).save(tmp_path / "src" / "images" / f"s{i:02d}.png")
        images.append(img)
        names.append(f"s{i:02d}")
    _masks(tmp_path / "src" / "masks", names, images)
    with pytest.raises(BadInputError) as err:
        _convert(tmp_path / "src", tmp_path / "out", (8, 8))
    assert any(b.kind == "image_reduction" and b.path.endswith("s01.png") for b in err.value.bad)
    assert "--accept-reduction" in str(err.value)


def test_cli_refusal_is_one_named_line(tmp_path: Path) -> None:
    _grey_dataset(tmp_path / "src", 4095, n=2)
    proc = subprocess.run(
        [sys.executable, "-m", "converter.cli", "convert", "--images", str(tmp_path / "src" / "images"),
         "--masks", str(tmp_path / "src" / "masks"), "--num-classes", "2", str(tmp_path / "out"), "--size", "8x8",
         "--image-mode", "rgb", "-q"],
        capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120)
    assert proc.returncode == 65, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "16-bit -> 8-bit" in proc.stderr and "--accept-reduction" in proc.stderr


# -- augmentation of N-band and 16-bit images (the TensorFlow functions; the C kernel where it takes them) --


def _separable_reference(images: np.ndarray, params: np.ndarray, size: tuple[int, int], fill: float) -> np.ndarray:
    """NumPy reference of the crop/scale/flip resampling (no rotation): bilinear from the
    parameter rows' axis maps, taps clamped at the edge, outside -> fill, rounded."""
    b, h, w, c = images.shape
    out = np.empty((b, *size, c))
    for i in range(b):
        ys = params[i, 5] + params[i, 4] * np.arange(size[0], dtype=np.float64)
        xs = params[i, 2] + params[i, 0] * np.arange(size[1], dtype=np.float64)
        y0, x0 = np.floor(ys), np.floor(xs)
        wy, wx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
        ya, yb = np.clip(y0, 0, h - 1).astype(int), np.clip(y0 + 1, 0, h - 1).astype(int)
        xa, xb = np.clip(x0, 0, w - 1).astype(int), np.clip(x0 + 1, 0, w - 1).astype(int)
        img = images[i].astype(np.float64)
        rows = img[ya] + (img[yb] - img[ya]) * wy
        val = rows[:, xa] + (rows[:, xb] - rows[:, xa]) * wx
        inside = ((ys > -0.5) & (ys < h - 0.5))[:, None] & ((xs > -0.5) & (xs < w - 0.5))[None, :]
        out[i] = np.where(inside[..., None], val, fill)
    return np.clip(np.round(out), 0, 65535)


@pytest.mark.parametrize("channels", [1, 4, 13])
def test_tf_augmentation_of_uint16_bands_matches_numpy(channels: int) -> None:
    import tensorflow as tf

    from readers.augment import Augment, augment_tf, draw_params

    rng = np.random.default_rng(channels)
    images = np.stack([np.stack([_texture(rng, 20, 24, 65535, b + 3 * i) for b in range(channels)], -1)
                       for i in range(3)])
    aug = Augment(hflip=0.5, vflip=0.5, scale=(0.6, 1.8), crop=(18, 22), fill=3)
    params = draw_params(aug, 20, 24, seed=5, epoch=1, ids=np.arange(3, dtype=np.uint64))
    x, _ = augment_tf(aug, tf.constant(images), tf.zeros((3,), tf.int64), tf.constant(params), ignore_index=255,
                      segmentation=False, normalize=False)
    assert x.dtype == tf.uint16 and x.shape == (3, 18, 22, channels)
    expected = _separable_reference(images, params, (18, 22), 3 * 257)
    np.testing.assert_allclose(x.numpy().astype(np.float64), expected, atol=1)  # float32 vs float64 rounding
    assert (x.numpy() > 255).mean() > 0.9  # 16-bit values went through, not 8-bit ones


def _class_bands(root: Path, bands: int) -> None:
    """uint16 TIFFs whose every band holds a level per class (class k, band b: 5000 k + 900 b + 7),
    blocky classes, and the class map as the mask: a pixel's class is readable from any band."""
    rng = np.random.default_rng(11)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir(parents=True)
    for i in range(6):
        classes = np.kron(rng.integers(0, 4, (6, 7)), np.ones((5, 5), np.int64))[:28, :32]
        image = np.stack([5000 * classes + 900 * b + 7 for b in range(bands)], -1).astype(np.uint16)
        tifffile.imwrite(root / "images" / f"t{i}.tif", image, photometric="minisblack", planarconfig="contig",
                         compression="zlib")
        Image.fromarray(classes.astype(np.uint8)).save(root / "masks" / f"t{i}.png")


@pytest.mark.parametrize("rotating", [False, True], ids=["crop-resize", "affine"])
def test_n_band_augmentation_keeps_image_and_mask_aligned(tmp_path: Path, rotating: bool) -> None:
    pytest.importorskip("imagecodecs")
    from readers.augment import Augment

    _class_bands(tmp_path / "src", 5)
    spec = SourceSpec(images=str(tmp_path / "src" / "images"), masks=str(tmp_path / "src" / "masks"))
    convert(spec, str(tmp_path / "out"), OutputOptions(size=(28, 32), image_filter="nearest",
                                                      labels=LabelOptions(num_classes=4)), RunOptions(workers=1))
    ds = readers.open(str(tmp_path / "out"))
    aug = Augment(hflip=0.5, vflip=0.5, scale=(0.5, 2.0), crop=(30, 34), fill=9,
                  rotate=25.0 if rotating else 0.0, rot90=rotating)
    checked = 0
    for x, y in ds.tf_dataset("train", 3, seed=2, augment=aug, normalize=False, one_hot=False):
        x, y = x.numpy(), y.numpy()
        assert x.dtype == np.uint16 and x.shape[1:] == (30, 34, 5)
        band0 = x[..., 0].astype(np.int64)
        same = np.ones(band0.shape, bool)  # interior pixels whose 3x3 neighbourhood is one value
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                same &= np.roll(np.roll(band0, dy, 1), dx, 2) == band0
        same[:, [0, -1]] = same[:, :, [0, -1]] = False
        for k in range(4):
            where = same & (band0 == 5000 * k + 7)
            assert (y[where] == k).all()
            checked += int(where.sum())
        assert (y[same & (band0 == 9 * 257)] == 255).all()  # padding: fill x 257 in the image, ignore in the mask
    assert checked > 1000


def test_colour_jitter_on_bands_is_refused_by_name(tmp_path: Path) -> None:
    from readers.augment import Augment

    _grey_dataset(tmp_path / "src", 4095, n=2)
    _convert(tmp_path / "src", tmp_path / "out", (16, 16))
    ds = readers.open(str(tmp_path / "out"))
    with pytest.raises(ValueError, match=r"colour jitter .* RGB images; these images have 1 channel\(s\) \(uint16\)"):
        ds.tf_dataset("train", 2, augment=Augment(brightness=0.2))
    with pytest.raises(ValueError, match=r"fill must be one int for 1-channel images"):
        ds.tf_dataset("train", 2, augment=Augment(hflip=0.5, fill=(1, 2, 3)))


def test_model_fit_augmented_on_16bit_grey_and_4band(tmp_path: Path) -> None:
    keras = pytest.importorskip("keras")
    from readers.augment import Augment

    _grey_dataset(tmp_path / "grey", 4095, n=4)
    _band_tiffs(tmp_path / "bands", 4, tile=(16, 16), compression="zlib", photometric="minisblack",
                planarconfig="contig")
    aug = Augment(hflip=0.5, rotate=10.0, scale=(0.8, 1.25), crop=(12, 12))
    for name, channels in (("grey", 1), ("bands", 4)):
        _convert(tmp_path / name, tmp_path / f"out_{name}", (16, 16))
        ds = readers.open(str(tmp_path / f"out_{name}"))
        model = keras.Sequential([keras.Input((12, 12, channels)), keras.layers.Conv2D(2, 3, padding="same"),
                                  keras.layers.Softmax()])
        model.compile("sgd", "categorical_crossentropy")
        history = model.fit(ds.tf_dataset("train", batch_size=2, augment=aug, seed=0), epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])


# -- band folders ------------------------------------------------------------------------------------

BANDS = ("red", "green", "blue", "nir")


def _band_folders(root: Path, n: int = 5, seed: int = 4) -> dict[str, np.ndarray]:
    """38-Cloud style: train_<band>/<band>_patch_<i>.TIF (uint16, full range) and train_gt/gt_patch_<i>.TIF;
    names written in a shuffled order; returns base -> (H, W, 4) stack."""
    rng = np.random.default_rng(seed)
    for band in BANDS + ("gt",):
        (root / f"train_{band}").mkdir(parents=True)
    stacks = {}
    for i in rng.permutation(n):
        base = f"patch_{i * 3 + 1}"
        stack = np.stack([_texture(rng, 26, 30, 65535, i + b) for b in range(len(BANDS))], -1)
        for b, band in reversed(list(enumerate(BANDS))):
            tifffile.imwrite(root / f"train_{band}" / f"{band}_{base}.TIF", stack[..., b])
        tifffile.imwrite(root / "train_gt" / f"gt_{base}.TIF", (stack[..., 3] > 32768).astype(np.uint8))
        stacks[base] = stack
    return stacks


def test_band_folders_with_prefix_tokens_convert_bit_exact(tmp_path: Path) -> None:
    stacks = _band_folders(tmp_path / "src")
    # a decoy: a red band with no nir file is a bad input naming the missing band file
    tifffile.imwrite(tmp_path / "src" / "train_red" / "red_patch_99.TIF", np.ones((26, 30), np.uint16))
    tifffile.imwrite(tmp_path / "src" / "train_gt" / "gt_patch_99.TIF", np.ones((26, 30), np.uint8))
    args = [sys.executable, "-m", "converter.cli", "convert", str(tmp_path / "src"), str(tmp_path / "out"),
            "--bands", ",".join(f"train_{b}" for b in BANDS), "--masks", "train_gt", "--num-classes", "2",
            "--size", "20x24", "-q"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 65 and "Traceback" not in proc.stderr
    assert "band file missing" in proc.stderr and "patch_99" in proc.stderr and "train_green" in proc.stderr
    proc = subprocess.run(args + ["--max-bad", "1"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "out" / "imgshard.json").read_text())
    assert manifest["image"]["bands"] == [f"train_{b}" for b in BANDS]
    assert (manifest["image"]["dtype"], manifest["image"]["channels"]) == ("uint16", 4)
    got = _by_key(tmp_path / "out")
    assert sorted(got) == sorted(f"red_{b}" for b in stacks)
    for base, stack in stacks.items():
        reread = np.stack([tifffile.imread(tmp_path / "src" / f"train_{b}" / f"{b}_{base}.TIF") for b in BANDS], -1)
        np.testing.assert_array_equal(reread, stack)
        np.testing.assert_array_equal(got[f"red_{base}"], _expected(reread, (20, 24)))


def test_band_folders_from_a_spec_file(tmp_path: Path) -> None:
    from converter.discover.spec_file import load_spec

    stacks = _band_folders(tmp_path / "src", n=3)
    spec_path = tmp_path / "src" / "spec.json"
    spec_path.write_text(json.dumps({"imgshard_source_spec": 1, "root": ".", "splits": {"train": [
        {"bands": [f"train_{b}" for b in BANDS], "masks": "train_gt"}]}}))
    spec = load_spec(str(spec_path)).source
    convert(spec, str(tmp_path / "out"), OutputOptions(size=(26, 30), labels=LabelOptions(num_classes=2)),
            RunOptions(workers=2))
    got = _by_key(tmp_path / "out")
    for base, stack in stacks.items():
        np.testing.assert_array_equal(got[f"red_{base}"], stack)  # same size: every band exactly as stored


def test_band_files_of_other_sizes_are_refused_by_name(tmp_path: Path) -> None:
    _band_folders(tmp_path / "src", n=2)
    bad = tmp_path / "src" / "train_nir" / "nir_patch_1.TIF"
    tifffile.imwrite(bad, np.ones((20, 30), np.uint16))
    spec = SourceSpec(root=str(tmp_path / "src"), sources=(
        __import__("converter.options", fromlist=["SplitSource"]).SplitSource(
            "train", str(tmp_path / "src" / "train_red"), str(tmp_path / "src" / "train_gt"),
            bands=tuple(str(tmp_path / "src" / f"train_{b}") for b in BANDS)),))
    with pytest.raises(BadInputError) as err:
        convert(spec, str(tmp_path / "out"), OutputOptions(size=(8, 8), labels=LabelOptions(num_classes=2)),
                RunOptions(workers=1))
    assert any(b.path == str(bad) and "band file is 30x20" in b.reason for b in err.value.bad)


def _band_spec(src: Path) -> SourceSpec:
    from converter.options import SplitSource

    return SourceSpec(root=str(src), sources=(SplitSource(
        "train", str(src / "train_red"), str(src / "train_gt"), bands=tuple(str(src / f"train_{b}") for b in BANDS)),))


def test_a_change_to_one_band_file_alone_is_seen_by_an_incremental_run(tmp_path: Path) -> None:
    import os

    stacks = _band_folders(tmp_path / "src", n=4)
    out, options = str(tmp_path / "out"), OutputOptions(size=(26, 30), labels=LabelOptions(num_classes=2))
    convert(_band_spec(tmp_path / "src"), out, options, RunOptions(workers=1))
    again = convert(_band_spec(tmp_path / "src"), out, options, RunOptions(workers=1))
    assert again.plan.unchanged == 4 and not again.plan.changed_kept  # nothing changed: nothing seen
    nir = tmp_path / "src" / "train_nir" / "nir_patch_4.TIF"  # sample i=1: only its NIR file is rewritten
    new_nir = 65535 - stacks["patch_4"][..., 3]
    tifffile.imwrite(nir, new_nir)
    os.utime(nir, ns=(os.stat(nir).st_atime_ns, os.stat(nir).st_mtime_ns - 5_000_000_000))  # older, same size too

    kept = convert(_band_spec(tmp_path / "src"), out, options, RunOptions(workers=1))  # default --on-change keep
    assert kept.plan.changed_kept == ["train/red_patch_4.TIF"] and kept.plan.unchanged == 3
    np.testing.assert_array_equal(_by_key(tmp_path / "out")["red_patch_4"], stacks["patch_4"])  # kept as it was

    replaced = convert(_band_spec(tmp_path / "src"), out, options, RunOptions(workers=1, on_change="replace"))
    assert replaced.plan.replaced == 1 and replaced.plan.unchanged == 3
    got = _by_key(tmp_path / "out")
    want = stacks["patch_4"].copy()
    want[..., 3] = tifffile.imread(nir)
    np.testing.assert_array_equal(want[..., 3], new_nir)
    np.testing.assert_array_equal(got["red_patch_4"], want)
    for base in ("patch_1", "patch_7", "patch_10"):
        np.testing.assert_array_equal(got[f"red_{base}"], stacks[base])
    final = convert(_band_spec(tmp_path / "src"), out, options, RunOptions(workers=1))
    assert final.plan.unchanged == 4 and not final.plan.changed_kept and final.plan.nothing_to_do


def test_a_band_file_rewritten_while_it_is_read_is_a_named_bad_input_then_converted(tmp_path: Path) -> None:
    """Every band file is read stably: one kept moving (rewritten in place, the same bytes, every 20 ms)
    makes its sample a bad input of kind changed_during_read naming that file; nothing of it is published,
    and the next run converts it."""
    import threading

    stacks = _band_folders(tmp_path / "src", n=3)
    nir = tmp_path / "src" / "train_nir" / "nir_patch_1.TIF"  # the first sample's: the probe reads it too
    data, stop = nir.read_bytes(), threading.Event()

    def rewrite() -> None:
        while not stop.is_set():
            with open(nir, "r+b") as f:
                f.write(data)
            stop.wait(0.02)

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    out, options = str(tmp_path / "out"), OutputOptions(size=(26, 30), labels=LabelOptions(num_classes=2))
    try:
        first = convert(_band_spec(tmp_path / "src"), out, options, RunOptions(workers=1, max_bad=1))
    finally:
        stop.set()
        writer.join(5)
    assert [(b.kind, b.path) for b in first.bad] == [("changed_during_read", str(nir))]
    assert sorted(_by_key(tmp_path / "out")) == ["red_patch_4", "red_patch_7"]
    second = convert(_band_spec(tmp_path / "src"), out, options, RunOptions(workers=1))
    assert second.plan.new == 1 and second.plan.unchanged == 2 and not second.bad
    got = _by_key(tmp_path / "out")
    for base, stack in stacks.items():
        np.testing.assert_array_equal(got[f"red_{base}"], stack)


def test_shards_of_uint16_bands_are_planned_at_their_stored_size(tmp_path: Path) -> None:
    """The plan sizes shards by the stored kind: 4 uint16 bands are 8 bytes a pixel, not RGB's 3."""
    _band_folders(tmp_path / "src", n=5)
    shard_size = 3 * (26 * 30 * 8 + 26 * 30)  # three samples' image and mask bytes
    result = convert(_band_spec(tmp_path / "src"), str(tmp_path / "out"),
                     OutputOptions(size=(26, 30), labels=LabelOptions(num_classes=2)),
                     RunOptions(workers=1, shard_size_bytes=shard_size))
    counts = sorted(s.records for s in result.manifest.splits["train"].shards)
    assert counts == [2, 3]  # ceil(5 * 7020 / 21060) = 2 shards (with 3 bytes a pixel: 1)


def test_a_band_file_touched_without_a_change_is_not_a_change(tmp_path: Path) -> None:
    import os

    _band_folders(tmp_path / "src", n=2)
    out, options = str(tmp_path / "out"), OutputOptions(size=(26, 30), labels=LabelOptions(num_classes=2))
    convert(_band_spec(tmp_path / "src"), out, options, RunOptions(workers=1))
    os.utime(tmp_path / "src" / "train_blue" / "blue_patch_1.TIF", ns=(1, 1_000_000_000))  # same bytes, new mtime
    again = convert(_band_spec(tmp_path / "src"), out, options, RunOptions(workers=1, on_change="fail"))
    assert again.plan.unchanged == 2 and not again.plan.changed_kept and again.plan.refreshed


def _oriented_16bit(path: Path, arr: np.ndarray, orientation: int) -> None:
    """A 16-bit grey file with an EXIF orientation tag: PNG (eXIf chunk) or TIFF (tag 274), by Pillow."""
    im = Image.fromarray(arr)  # I;16
    if path.suffix == ".png":
        exif = Image.Exif()
        exif[0x0112] = orientation
        im.save(path, exif=exif.tobytes())
    else:
        im.save(path, tiffinfo={274: orientation})


def _shown(path: Path) -> np.ndarray:
    from PIL import ImageOps

    """Pillow's `exif_transpose` of the stored pixels under the file's orientation tag (a TIFF's pixels and tag
    read by tifffile: Pillow 13 reports a TIFF's size already turned before it loads it, then drops the tag)."""
    if path.suffix == ".tif":
        with tifffile.TiffFile(path) as tif:
            pixels, orientation = tif.asarray(), int(tif.pages[0].tags["Orientation"].value)
    else:
        im = Image.open(path)
        pixels, orientation = np.asarray(im), im.getexif()[0x0112]
    im = Image.fromarray(pixels.astype(np.uint16))
    im.getexif()[0x0112] = orientation
    return np.asarray(ImageOps.exif_transpose(im)).astype(np.uint16)


@pytest.mark.parametrize("ext", [".png", ".tif"])
def test_exif_orientation_of_16bit_images_follows_the_exif_rules(tmp_path: Path, ext: str) -> None:
    rng = np.random.default_rng(11)
    arr = _texture(rng, 20, 30, 65535, 0)  # stored 30 wide, 20 high; orientation 6 shows it 20 wide, 30 high
    for name, mask_hw in (("shown", (30, 20)), ("stored", (20, 30))):
        src = tmp_path / name
        (src / "images").mkdir(parents=True)
        (src / "masks").mkdir()
        _oriented_16bit(src / "images" / f"a{ext}", arr, 6)
        Image.fromarray((rng.integers(0, 2, mask_hw)).astype(np.uint8)).save(src / "masks" / "a.png")
    shown = _shown(tmp_path / "shown" / "images" / f"a{ext}")
    assert shown.shape == (30, 20) and shown.max() > 60000
    _convert(tmp_path / "shown", tmp_path / "auto", (30, 20))  # auto: the mask fits the shown image
    _convert(tmp_path / "shown", tmp_path / "apply", (30, 20), exif="apply")
    _convert(tmp_path / "stored", tmp_path / "ignore", (20, 30), exif="ignore")
    _convert(tmp_path / "stored", tmp_path / "auto_stored", (20, 30))  # auto: the mask fits the stored pixels
    np.testing.assert_array_equal(_by_key(tmp_path / "auto")["a"], shown[..., None])
    np.testing.assert_array_equal(_by_key(tmp_path / "apply")["a"], shown[..., None])
    np.testing.assert_array_equal(_by_key(tmp_path / "ignore")["a"], arr[..., None])
    np.testing.assert_array_equal(_by_key(tmp_path / "auto_stored")["a"], arr[..., None])
    with pytest.raises(BadInputError) as err:  # --exif apply on a mask drawn on the stored pixels
        _convert(tmp_path / "stored", tmp_path / "refused", (20, 30), exif="apply")
    assert any(b.kind == "size_mismatch" and "EXIF orientation is 6" in b.reason for b in err.value.bad)


def test_exif_orientation_of_16bit_photos_is_applied_in_classification(tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    shown = {}
    for i, label in enumerate(("cells", "empty")):
        (tmp_path / "src" / "train" / label).mkdir(parents=True)
        path = tmp_path / "src" / "train" / label / f"p{i}.png"
        _oriented_16bit(path, _texture(rng, 20, 30, 65535, i), (6, 3)[i])
        shown[f"p{i}"] = _shown(path)
    convert(SourceSpec(root=str(tmp_path / "src")), str(tmp_path / "out"),
            OutputOptions(size=(30, 20), task="classification"), RunOptions(workers=1))
    got = _by_key(tmp_path / "out")
    assert shown["p0"].shape == (30, 20)
    np.testing.assert_array_equal(got["p0"], shown["p0"][..., None])
    assert shown["p1"].shape == (20, 30)  # turned 180 degrees: then resized (padded) to 30x20 like any photo
    assert not np.array_equal(shown["p1"], np.asarray(Image.open(tmp_path / "src/train/empty/p1.png")))


# -- scan: kinds, bits used, band folders, and its one command ----------------------------------------


def _scan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "converter.cli", "scan", *args, "--workers", "1"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          timeout=180)


def _run_command(line: str, out: Path) -> None:
    import shlex

    argv = shlex.split(line)
    assert argv[:2] == ["imgshard", "convert"]
    argv = [str(out) if a == "OUT" else a for a in argv[2:]]
    proc = subprocess.run([sys.executable, "-m", "converter.cli", "convert", *argv, "-q", "--workers", "1"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=180)
    assert proc.returncode == 0, proc.stderr


def test_scan_reports_12_of_16_bits_and_its_command_converts_bit_exact(tmp_path: Path) -> None:
    _grey_dataset(tmp_path / "src", 4095, n=4)
    for name in list((tmp_path / "src" / "images").iterdir()):  # one size: scan's --size keeps it
        img = np.asarray(Image.open(name))[:30, :41]
        Image.fromarray(img).save(name)
    for name in list((tmp_path / "src" / "masks").iterdir()):
        Image.fromarray(np.asarray(Image.open(name))[:30, :41]).save(name)
    proc = _scan("--images", str(tmp_path / "src" / "images"), "--masks", str(tmp_path / "src" / "masks"), "--json")
    report = json.loads(proc.stdout)
    kinds = report["images"]["kinds"]
    assert kinds["kinds"] == {"16-bit grey": 4} and kinds["bits_used"] == 12 and kinds["bit_depth"] == 16
    assert kinds["stored"] == {"dtype": "uint16", "channels": 1}
    _run_command(report["verdict"]["command"], tmp_path / "out")
    src = {p.stem: np.asarray(Image.open(p)) for p in (tmp_path / "src" / "images").iterdir()}
    for name, image in _by_key(tmp_path / "out").items():
        np.testing.assert_array_equal(image[..., 0], src[name])


def test_scan_warns_of_a_reduction_and_names_the_flag(tmp_path: Path) -> None:
    _grey_dataset(tmp_path / "src", 4095, n=2)
    proc = _scan("--images", str(tmp_path / "src" / "images"), "--masks", str(tmp_path / "src" / "masks"),
                 "--image-mode", "rgb")
    assert proc.returncode == 65 and "Traceback" not in proc.stderr  # 65: convert needs flags
    assert "would lose 16-bit -> 8-bit" in proc.stdout and "--accept-reduction" in proc.stdout
    assert "Stored as: uint8, 3 channel(s); reductions: 16-bit -> 8-bit" in proc.stdout


def test_scan_finds_band_folders_and_its_command_converts_bit_exact(tmp_path: Path) -> None:
    stacks = _band_folders(tmp_path / "src")
    proc = _scan(str(tmp_path / "src"), "--json")
    assert proc.returncode in (0, 65) and "Traceback" not in proc.stderr  # 65: the masks need a flag
    report = json.loads(proc.stdout)
    assert report["images"]["kinds"]["band_files"] == 4
    command = report["verdict"]["command"]
    assert "--bands train_red,train_green,train_blue,train_nir --masks train_gt" in command  # spectral order
    assert report["images"]["kinds"]["band_order"] == {
        "bands": [f"train_{b}" for b in BANDS], "order": "spectral order (colour names: red, green, blue, then by "
        "wavelength)"}
    text = _scan(str(tmp_path / "src")).stdout
    assert "Bands: train_red, train_green, train_blue, train_nir, in spectral order" in text
    _run_command(command, tmp_path / "out")
    got = _by_key(tmp_path / "out")
    for base, stack in stacks.items():
        np.testing.assert_array_equal(got[f"red_{base}"], stack)  # red, green, blue, nir; same size: no resize


@pytest.mark.parametrize("names, expected, how", [
    (("B08", "B03", "B02", "B8A", "B04"), ("B02", "B03", "B04", "B08", "B8A"), "spectral order (band numbers)"),
    (("band_10", "band_2", "band_1"), ("band_1", "band_2", "band_10"), "spectral order (band numbers)"),
    (("s2_nir", "s2_swir1", "s2_blue", "s2_red"), ("s2_red", "s2_blue", "s2_nir", "s2_swir1"), "spectral order"),
    (("view_b", "view_a"), ("view_a", "view_b"), "folder-name order"),
    (("red", "red_2"), ("red", "red_2"), "folder-name order"),  # two folders say red: no spectral order
])
def test_band_folders_are_proposed_in_the_spectral_order_their_names_say(names, expected, how) -> None:
    from converter.discover.bands import spectral_order

    ordered, said = spectral_order([f"/data/{n}" for n in names])
    assert ordered == tuple(f"/data/{n}" for n in expected) and said.startswith(how)


def test_scan_says_band_folders_without_spectral_names_go_in_folder_name_order(tmp_path: Path) -> None:
    stacks = _band_folders(tmp_path / "src", n=3)
    for b, new in zip(BANDS, ("d", "c", "b", "a")):  # train_red -> train_d, ...: names without a spectral order
        (tmp_path / "src" / f"train_{b}").rename(tmp_path / "src" / f"train_{new}")
    report = json.loads(_scan(str(tmp_path / "src"), "--json").stdout)
    assert "--bands train_a,train_b,train_c,train_d --masks train_gt" in report["verdict"]["command"]
    assert report["images"]["kinds"]["band_order"]["order"].startswith("folder-name order")
    _run_command(report["verdict"]["command"], tmp_path / "out")
    got = _by_key(tmp_path / "out")
    for base, stack in stacks.items():
        np.testing.assert_array_equal(got[f"nir_{base}"], stack[..., ::-1])  # a = nir, ..., d = red


# -- per-band statistics (normalize="stats") ---------------------------------------------------------


def _split_dataset(root: Path, n_train: int, n_val: int) -> None:
    """4-band uint16 TIFFs in train/ and val/ (different value ranges), masks beside them."""
    rng = np.random.default_rng(21)
    for split, n, top in (("train", n_train, 40000), ("val", n_val, 65535)):
        (root / split / "images").mkdir(parents=True, exist_ok=True)
        (root / split / "masks").mkdir(parents=True, exist_ok=True)
        for i in range(n):
            name = f"{split}_{i:02d}_{rng.integers(1000)}"
            arr = np.stack([_texture(rng, 18, 22, top // (b + 1), i + b) for b in range(4)], -1)
            tifffile.imwrite(root / split / "images" / f"{name}.tif", arr, photometric="minisblack",
                             planarconfig="contig")
            Image.fromarray((arr[..., 0] > top // 3).astype(np.uint8)).save(root / split / "masks" / f"{name}.png")


def _convert_splits(root: Path, out: Path) -> None:
    from converter.options import SplitSource

    spec = SourceSpec(root=str(root), sources=tuple(
        SplitSource(s, str(root / s / "images"), str(root / s / "masks")) for s in ("train", "val")))
    convert(spec, str(out), OutputOptions(size=(18, 22), labels=LabelOptions(num_classes=2)),
            RunOptions(workers=2, shard_size_bytes=4096))


def test_band_stats_are_the_train_splits_and_survive_an_incremental_run(tmp_path: Path) -> None:
    _split_dataset(tmp_path / "src", 5, 3)
    _convert_splits(tmp_path / "src", tmp_path / "out")
    _split_dataset(tmp_path / "src", 0, 0)  # nothing new
    rng = np.random.default_rng(5)  # one more train image, added incrementally
    extra = np.stack([_texture(rng, 18, 22, 30000, b) for b in range(4)], -1)
    tifffile.imwrite(tmp_path / "src" / "train" / "images" / "zz.tif", extra, photometric="minisblack",
                     planarconfig="contig")
    Image.fromarray((extra[..., 0] > 9000).astype(np.uint8)).save(tmp_path / "src" / "train" / "masks" / "zz.png")
    _convert_splits(tmp_path / "src", tmp_path / "out")
    train = np.stack([tifffile.imread(p) for p in sorted((tmp_path / "src" / "train" / "images").iterdir())])
    assert len(train) == 6
    stats = json.loads((tmp_path / "out" / "imgshard.json").read_text())["image"]["stats"]
    assert stats["split"] == "train" and stats["pixels"] == 6 * 18 * 22
    flat = train.reshape(-1, 4).astype(np.float64)
    np.testing.assert_allclose(stats["mean"], flat.mean(0), rtol=1e-9)
    np.testing.assert_allclose(stats["std"], flat.std(0), rtol=1e-6)

    ds = readers.open(str(tmp_path / "out"))
    x = np.concatenate([b.numpy() for b, _ in ds.tf_dataset("val", 2, shuffle=False, normalize="stats")])
    val = np.stack([r.image for r in ds.records("val")]).astype(np.float64)
    np.testing.assert_allclose(x, (val - flat.mean(0)) / flat.std(0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("augmented", [False, True], ids=["plain", "augmented"])
def test_keras_dataset_normalize_stats_gives_the_numbers_of_tf_dataset(tmp_path: Path, augmented: bool) -> None:
    from readers.augment import Augment

    _split_dataset(tmp_path / "src", 5, 3)
    _convert_splits(tmp_path / "src", tmp_path / "out")
    ds = readers.open(str(tmp_path / "out"))
    aug = Augment(hflip=0.5, vflip=0.5, scale=(0.7, 1.4), crop=(14, 18), fill=3) if augmented else None
    kw = dict(shuffle=False, seed=5, augment=aug, one_hot=False)
    tf_batches = [(x.numpy(), y.numpy()) for x, y in ds.tf_dataset("train", 2, normalize="stats", **kw)]
    seq = ds.keras_dataset("train", 2, normalize="stats", **kw)
    assert len(seq) == len(tf_batches) == 3
    stats = json.loads((tmp_path / "out" / "imgshard.json").read_text())["image"]["stats"]
    for i, (tx, ty) in enumerate(tf_batches):
        kx, ky = seq[i]
        assert kx.dtype == np.float32 and kx.shape == tx.shape
        np.testing.assert_array_equal(kx, tx)
        np.testing.assert_array_equal(ky, ty)
        raw, _ = ds.keras_dataset("train", 2, normalize=False, **kw)[i]  # the stored units, standardised here
        want = ((raw.astype(np.float64) - stats["mean"]) / stats["std"]).astype(np.float32)
        np.testing.assert_allclose(kx, want, rtol=1e-5, atol=1e-5)


def test_normalize_stats_is_refused_by_name_where_there_are_none(tmp_path: Path) -> None:
    from converter.testing import synth

    synth.make_camvid(tmp_path / "camvid", size=[(24, 32)], seed=0)
    convert(SourceSpec(root=str(tmp_path / "camvid")), str(tmp_path / "out"), OutputOptions(size=(16, 16)))
    ds = readers.open(str(tmp_path / "out"))
    with pytest.raises(ValueError, match=r"normalize='stats' needs per-band statistics .*normalize=True"):
        ds.tf_dataset("train", 2, normalize="stats")
    with pytest.raises(ValueError, match=r"normalize='stats' needs per-band statistics .*normalize=True"):
        ds.keras_dataset("train", 2, normalize="stats")
    with pytest.raises(ValueError, match=r"normalize must be True, False or 'stats'. Received: normalize='z'"):
        ds.tf_dataset("train", 2, normalize="z")
    with pytest.raises(ValueError, match=r"normalize must be True, False or 'stats'. Received: normalize='z'"):
        ds.keras_dataset("train", 2, normalize="z")


def test_uint16_band_datasets_load_in_tfds_equal_to_records(tmp_path: Path) -> None:
    tfds = pytest.importorskip("tensorflow_datasets")
    _band_tiffs(tmp_path / "src", 4, compression="zlib", photometric="minisblack", planarconfig="contig")
    _convert(tmp_path / "src", tmp_path / "out", (20, 28))
    builder = tfds.builder_from_directory(str(tmp_path / "out"))
    examples = {e["key"].decode(): e for e in tfds.as_numpy(builder.as_dataset(split="train"))}
    records = list(readers.open(str(tmp_path / "out")).records("train"))
    assert sorted(examples) == sorted(r.key for r in records)
    for r in records:
        image = examples[r.key]["image"]
        assert image.dtype == np.uint16 and image.shape == (20, 28, 4)
        np.testing.assert_array_equal(image, r.image)


def test_keras_dataset_and_device_expansion_carry_uint16(tmp_path: Path) -> None:
    from readers.device import expand_batch

    _grey_dataset(tmp_path / "src", 65535, n=3)
    _convert(tmp_path / "src", tmp_path / "out", (12, 12))
    ds = readers.open(str(tmp_path / "out"))
    stored = {r.key: r.image for r in ds.records("train")}
    seq = ds.keras_dataset("train", 3, shuffle=False, normalize=False, one_hot=False)
    x, _ = seq[0]
    assert x.dtype == np.uint16
    np.testing.assert_array_equal(np.sort(x.ravel()), np.sort(np.concatenate([v.ravel() for v in stored.values()])))
    xf, _ = ds.keras_dataset("train", 3, shuffle=False)[0]
    np.testing.assert_allclose(xf, x / 65535.0, atol=1e-6)
    on_device, _ = expand_batch(x, None)  # compact mode: uint16 crosses to the device, scaled there
    np.testing.assert_allclose(np.asarray(on_device), x / 65535.0, atol=1e-6)


def test_preview_draws_chosen_bands_stretched_and_refuses_a_missing_band(tmp_path: Path) -> None:
    from converter.inspect.display import to_display
    from converter.inspect.preview import PreviewOptions, dataset_samples

    _band_tiffs(tmp_path / "src", 4, compression="zlib", photometric="minisblack", planarconfig="contig")
    _convert(tmp_path / "src", tmp_path / "out", (20, 28))
    stored = {r.key: r.image for r in readers.open(str(tmp_path / "out")).records("train")}
    _, _, samples = dataset_samples(str(tmp_path / "out"), PreviewOptions(n=2, display_bands=(3, 2, 1)))
    for s in samples:
        bands = stored[s.key][..., [2, 1, 0]].astype(np.float64)
        lo, hi = np.percentile(bands, 2, axis=(0, 1)), np.percentile(bands, 98, axis=(0, 1))
        expected = np.clip(np.rint((bands - lo) * (255.0 / (hi - lo))), 0, 255).astype(np.uint8)
        np.testing.assert_array_equal(s.image, expected)
    assert to_display(np.zeros((2, 2, 3), np.uint8) + 7).tolist() == (np.zeros((2, 2, 3), np.uint8) + 7).tolist()
    proc = subprocess.run([sys.executable, "-m", "converter.cli", "preview", str(tmp_path / "out"), "-o",
                           str(tmp_path / "p.png"), "--display-bands", "5"], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--display-bands names band 5; these images have 4 band(s)" in proc.stderr


# -- 8-bit grey and alpha: --image-mode keep / grey, --alpha keep ---------------------------------------


def _rgba_and_grey(root: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(9)
    (root / "images").mkdir(parents=True)
    out = {}
    for i in range(3):
        rgba = np.stack([_texture(rng, 16, 20, 255, i + c).astype(np.uint8) for c in range(4)], -1)
        Image.fromarray(rgba, "RGBA").save(root / "images" / f"a{i}.png")
        out[f"a{i}"] = rgba
    _masks(root / "masks", list(out), [v[..., 0] for v in out.values()])
    return out


def test_alpha_is_dropped_by_default_and_kept_with_the_flag(tmp_path: Path) -> None:
    images = _rgba_and_grey(tmp_path / "src")
    _convert(tmp_path / "src", tmp_path / "drop", (16, 20))
    _convert(tmp_path / "src", tmp_path / "keep", (16, 20), image_kind=ImageKind(alpha="keep"))
    dropped, kept = _by_key(tmp_path / "drop"), _by_key(tmp_path / "keep")
    for name, rgba in images.items():
        np.testing.assert_array_equal(dropped[name], rgba[..., :3])
        np.testing.assert_array_equal(kept[name], rgba)
    manifest = json.loads((tmp_path / "keep" / "imgshard.json").read_text())
    assert (manifest["image"]["dtype"], manifest["image"]["channels"]) == ("uint8", 4)
    proc = _scan("--images", str(tmp_path / "src" / "images"), "--masks", str(tmp_path / "src" / "masks"))
    assert "3 image(s) have an alpha channel: dropped (--alpha keep keeps it)" in proc.stdout


def _grey8(root: Path, names: list[str], seed: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    greys = {name: _texture(rng, 14, 18, 255, i).astype(np.uint8) for i, name in enumerate(names)}
    (root / "masks").mkdir(exist_ok=True)
    for name, g in greys.items():
        Image.fromarray(g).save(root / "images" / f"{name}.png")
        Image.fromarray((g > np.median(g)).astype(np.uint8)).save(root / "masks" / f"{name}.png")
    return greys


def test_8bit_grey_stays_one_channel_in_a_new_dataset(tmp_path: Path) -> None:
    greys = _grey8(tmp_path / "src", ["g0", "g1", "g2"])
    _convert(tmp_path / "src", tmp_path / "auto", (10, 12))  # auto: grey stays grey
    _convert(tmp_path / "src", tmp_path / "keep", (14, 18), image_kind=ImageKind(mode="keep"))
    _convert(tmp_path / "src", tmp_path / "rgb", (14, 18), image_kind=ImageKind(mode="rgb"))
    auto, keep, rgb = _by_key(tmp_path / "auto"), _by_key(tmp_path / "keep"), _by_key(tmp_path / "rgb")
    manifest = json.loads((tmp_path / "auto" / "imgshard.json").read_text())
    assert (manifest["image"]["dtype"], manifest["image"]["channels"]) == ("uint8", 1)
    for name, g in greys.items():
        im = Image.fromarray(g)  # mode L: Pillow's resize of the grey plane
        want = np.asarray(im.resize((12, 10), BILINEAR, box=(0, 0, 18, 14), reducing_gap=None))
        np.testing.assert_array_equal(auto[name], want[..., None])
        np.testing.assert_array_equal(keep[name], g[..., None])
        np.testing.assert_array_equal(rgb[name], np.repeat(g[..., None], 3, 2))
    ds = readers.open(str(tmp_path / "auto"))
    x, _ = next(iter(ds.tf_dataset("train", 3, shuffle=False)))
    assert x.shape == (3, 10, 12, 1)
    np.testing.assert_allclose(np.sort(x.numpy().ravel()),
                               np.sort(np.concatenate([v.ravel() for v in auto.values()]) / 255.0), atol=1e-6)


def test_an_earlier_grey_as_rgb_dataset_stays_rgb_on_incremental_runs(tmp_path: Path) -> None:
    """A dataset written before grey stayed one channel (its options name no image kind) adds new grey
    samples as RGB, as it was converted, without an "other options" refusal; --rebuild stores grey."""
    greys = _grey8(tmp_path / "src", ["g0", "g1"])
    out = tmp_path / "out"
    _convert(tmp_path / "src", out, (14, 18), image_kind=ImageKind(mode="rgb"))
    path = out / "imgshard.json"
    doc = json.loads(path.read_text())
    del doc["options"]["image_kind"]  # what every earlier version wrote for these sources
    path.write_text(json.dumps(doc))
    greys.update(_grey8(tmp_path / "src", ["g2"], seed=7))
    _convert(tmp_path / "src", out, (14, 18))  # auto, incremental: no refusal
    got = _by_key(out)
    assert sorted(got) == ["g0", "g1", "g2"]
    for name, g in greys.items():
        np.testing.assert_array_equal(got[name], np.repeat(g[..., None], 3, 2))
    assert "image_kind" not in json.loads(path.read_text())["options"]
    convert(SourceSpec(images=str(tmp_path / "src" / "images"), masks=str(tmp_path / "src" / "masks")), str(out),
            OutputOptions(size=(14, 18), labels=LabelOptions(num_classes=2)), RunOptions(workers=1, rebuild=True))
    for name, g in _by_key(out).items():
        np.testing.assert_array_equal(g, greys[name][..., None])


# -- bucket sources and output carry the kinds ---------------------------------------------------------


def test_band_folders_in_a_bucket_convert_to_a_bucket_as_locally(tmp_path: Path, s3_bucket: str, s3_server: str) -> None:
    from readers.storage import open_store

    from converter.options import SplitSource

    _band_folders(tmp_path / "src", n=3)
    url = f"{s3_bucket}/sat"
    store = open_store(url)
    for path in sorted((tmp_path / "src").rglob("*")):
        if path.is_file():
            store.put(path.relative_to(tmp_path / "src").as_posix(), path.read_bytes())
    creds = {"endpoint_url": s3_server, "key": "imgshard-test", "secret": "imgshard-test"}

    def spec(root: str, **kw) -> SourceSpec:
        return SourceSpec(root=root, sources=(SplitSource(
            "train", f"{root}/train_red", f"{root}/train_gt", bands=tuple(f"{root}/train_{b}" for b in BANDS)),), **kw)

    options = OutputOptions(size=(20, 24), labels=LabelOptions(num_classes=2))
    convert(spec(str(tmp_path / "src")), str(tmp_path / "local"), options, RunOptions(workers=1))
    convert(spec(url, storage_options=creds), f"{s3_bucket}/out", options,
            RunOptions(workers=2, storage_options=tuple(creds.items())))
    local = {r.key: r.image for r in readers.open(str(tmp_path / "local")).records("train")}
    remote = {r.key: r.image for r in readers.open(f"{s3_bucket}/out", storage_options=creds).records("train")}
    assert sorted(local) == sorted(remote) and len(local) == 3
    for key, image in local.items():
        assert image.dtype == np.uint16 and image.shape == (20, 24, 4)
        np.testing.assert_array_equal(remote[key], image)


def test_dask_workers_write_band_folders_as_a_local_run(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    from converter.options import SplitSource

    _band_folders(tmp_path / "src", n=4)
    root = str(tmp_path / "src")
    spec = SourceSpec(root=root, sources=(SplitSource(
        "train", f"{root}/train_red", f"{root}/train_gt", bands=tuple(f"{root}/train_{b}" for b in BANDS)),))
    options = OutputOptions(size=(20, 24), labels=LabelOptions(num_classes=2))
    convert(spec, str(tmp_path / "local"), options, RunOptions(workers=1, shard_size_bytes=8192))
    convert(spec, str(tmp_path / "dask"), options, RunOptions(workers=2, backend="dask", shard_size_bytes=8192))
    for name in sorted(p.name for p in (tmp_path / "local").iterdir() if p.name.startswith("train-")):
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "dask" / name).read_bytes(), name
    local = json.loads((tmp_path / "local" / "imgshard.json").read_text())
    dask = json.loads((tmp_path / "dask" / "imgshard.json").read_text())
    assert dask["image"] == local["image"] and local["image"]["channels"] == 4
