"""Shared fixtures: tiny but realistic datasets generated in `tmp_path` by `converter.testing.synth`.

Every fixture writes into its own sub-folder of the test's `tmp_path`, so a test can
use several of them at once. Datasets hold about ten samples of at most 64x96 pixels,
so generating one takes a few tens of milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from converter.testing import synth

# Real S3 (moto server) and GCS (emulator) servers on 127.0.0.1, started once per session.
from _objstore import gcs_bucket, gcs_server, s3_bucket, s3_server  # noqa: F401  (fixtures)

# (height, width) of the samples in the tiny datasets; the second size varies the
# shape across pairs (each pair keeps one size for its image and its mask).
TINY_SIZE: tuple[int, int] = (64, 96)
TINY_SIZE_ALT: tuple[int, int] = (48, 64)
TINY_SIZES: list[tuple[int, int]] = [TINY_SIZE, TINY_SIZE_ALT]


@pytest.fixture
def tiny_size() -> tuple[int, int]:
    """The (height, width) of the first sample of every tiny dataset."""
    return TINY_SIZE


@pytest.fixture
def camvid_src(tmp_path: Path) -> synth.SynthDataset:
    """Default CamVid layout: train 6 / val 2 / test 2, RGB PNG images, RGB ``_L`` masks.

    Five CamVid classes, a quirky class_dict.csv, sizes alternating between
    `TINY_SIZE` and `TINY_SIZE_ALT`.
    """
    return synth.make_camvid(tmp_path / "camvid", size=TINY_SIZES, seed=0)


@pytest.fixture
def camvid_all_modes(tmp_path: Path) -> synth.SynthDataset:
    """Every image mode (RGB, RGBA, P, L PNGs) and every colour mask mode (RGB, RGBA, P).

    12 samples (train 8 / val 2 / test 2): image modes cycle with period 4 and mask
    modes with period 3, so all 12 combinations occur once. Colour class table (see
    `camvid_grey_masks` for L masks).
    """
    return synth.make_camvid(
        tmp_path / "camvid_all_modes",
        splits={"train": 8, "val": 2, "test": 2},
        size=TINY_SIZES,
        image_modes=synth.IMAGE_MODES,
        mask_modes=("RGB", "RGBA", "P"),
        seed=1,
    )


@pytest.fixture
def camvid_grey_masks(tmp_path: Path) -> synth.SynthDataset:
    """L (greyscale) masks, with a grey class table ``(0,0,0), (40,40,40), ...``.

    Mask modes cycle L, RGB, P over the same grey table, so an L mask's grey values
    are class colours, not class indices.
    """
    return synth.make_camvid(
        tmp_path / "camvid_grey_masks",
        splits={"train": 4, "val": 2},
        size=TINY_SIZES,
        mask_modes=("L", "RGB", "P"),
        seed=2,
    )


@pytest.fixture
def camvid_jpeg(tmp_path: Path) -> synth.SynthDataset:
    """JPEG images (RGB and L, quality 90) with masks named like the image (no suffix)."""
    return synth.make_camvid(
        tmp_path / "camvid_jpeg",
        splits={"train": 4, "val": 2},
        size=TINY_SIZES,
        image_modes=synth.JPEG_IMAGE_MODES,
        image_ext=".jpg",
        mask_suffix="",
        seed=3,
    )


@pytest.fixture
def camvid_unknown_colors(tmp_path: Path) -> synth.SynthDataset:
    """Default layout with 2 planted unknown-colour regions (one near, one far).

    See `SynthDataset.planted_unknown` for where they are.
    """
    return synth.make_camvid(
        tmp_path / "camvid_unknown",
        size=TINY_SIZES,
        mask_modes=("RGB", "P"),
        unknown_colors=2,
        seed=4,
    )


@pytest.fixture
def explicit_src(tmp_path: Path) -> synth.SynthDataset:
    """Flat ``--images/--masks/--classes`` layout: 6 RGB PNG pairs with the same stems."""
    root = tmp_path / "explicit"
    return synth.make_explicit(
        root / "images", root / "masks", root / "classes.csv", 6, size=TINY_SIZES, seed=5
    )


@pytest.fixture
def classification_src(tmp_path: Path) -> synth.SynthClassification:
    """Keras layout ``root/{train,val}/{bird,cat,dog}/*``: JPEG, PNG, GIF, BMP, CMYK, EXIF."""
    return synth.make_classification(tmp_path / "classification", seed=6)


@pytest.fixture
def classification_flat(tmp_path: Path) -> synth.SynthClassification:
    """Flat Keras layout ``root/{bird,cat,dog}/*`` (no split level), 4 files per class."""
    return synth.make_classification(tmp_path / "classification_flat", per_class=4,
                                     flat=True, seed=7)
