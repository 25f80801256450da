"""Tests of `converter.testing.synth`: the synthetic datasets the other tests stand on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from converter.testing import synth


def _tree_digest(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `root`."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _decoded_rgb(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def _expected_rgb(ds: synth.SynthDataset, path: Path) -> np.ndarray:
    """Class colours of the expected class map, with planted unknown colours painted in."""
    rgb = ds.colors[ds.expected_class_map(path)]
    for planted in ds.planted_in(path):
        top, left, bottom, right = planted.region
        rgb[top:bottom, left:right] = planted.color
    return rgb


_MIXED = dict(
    splits={"train": 5, "val": 2, "test": 1},
    size=[(40, 56), (32, 48)],
    image_modes=("RGB", "RGBA", "P", "L"),
    mask_modes=("RGB", "RGBA", "P"),
    unknown_colors=3,
)


# ----------------------------------------------------------------------------- determinism


def test_make_camvid_same_arguments_give_byte_identical_files(tmp_path):
    synth.make_camvid(tmp_path / "a", seed=11, **_MIXED)
    synth.make_camvid(tmp_path / "b", seed=11, **_MIXED)
    a, b = _tree_digest(tmp_path / "a"), _tree_digest(tmp_path / "b")
    assert len(a) == 1 + 2 * 8
    assert a == b


def test_make_camvid_jpeg_and_grey_masks_are_byte_identical(tmp_path):
    kwargs = dict(splits={"train": 3}, image_ext=".jpg", image_modes=("RGB", "L"),
                  mask_modes=("L", "P"), unknown_colors=2, seed=3)
    synth.make_camvid(tmp_path / "a", **kwargs)
    synth.make_camvid(tmp_path / "b", **kwargs)
    assert _tree_digest(tmp_path / "a") == _tree_digest(tmp_path / "b")


def test_make_camvid_different_seed_changes_pixels(tmp_path):
    a = synth.make_camvid(tmp_path / "a", splits={"train": 2}, seed=0)
    b = synth.make_camvid(tmp_path / "b", splits={"train": 2}, seed=1)
    for (image_a, _), (image_b, _) in zip(a.pairs["train"], b.pairs["train"]):
        assert image_a.read_bytes() != image_b.read_bytes()


def test_make_classification_same_arguments_give_byte_identical_files(tmp_path):
    synth.make_classification(tmp_path / "a", seed=2)
    synth.make_classification(tmp_path / "b", seed=2)
    assert _tree_digest(tmp_path / "a") == _tree_digest(tmp_path / "b")


# ----------------------------------------------------------------------------- layout


def test_camvid_layout_names_and_sizes(camvid_src):
    root = camvid_src.root
    assert {p.name for p in root.iterdir()} == {
        "class_dict.csv", "train", "train_labels", "val", "val_labels", "test", "test_labels"
    }
    assert {split: len(pairs) for split, pairs in camvid_src.pairs.items()} == {
        "train": 6, "val": 2, "test": 2
    }
    names = [s.name for s in camvid_src.samples]
    assert names[0] == "0001TP_006690"
    assert len(set(names)) == len(names)
    sizes = set()
    for split, pairs in camvid_src.pairs.items():
        assert pairs == sorted(pairs, key=lambda pair: pair[0].name)
        for image_path, mask_path in pairs:
            assert image_path.parent == root / split
            assert mask_path == root / f"{split}_labels" / f"{image_path.stem}_L.png"
            with Image.open(image_path) as image, Image.open(mask_path) as mask:
                assert image.size == mask.size
                assert image.mode == "RGB" and mask.mode == "RGB"
                sizes.add(image.size[::-1])
    assert sizes == {(64, 96), (48, 64)}


def test_camvid_leaves_no_temporary_files(camvid_all_modes):
    leftovers = [p for p in camvid_all_modes.root.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_zero_count_split_gives_empty_folders(tmp_path):
    ds = synth.make_camvid(tmp_path / "ds", splits={"train": 2, "test": 0})
    assert list((tmp_path / "ds" / "test").iterdir()) == []
    assert list((tmp_path / "ds" / "test_labels").iterdir()) == []
    assert "test" not in ds.pairs


def test_empty_mask_suffix_names_mask_like_image(camvid_jpeg):
    for image_path, mask_path in camvid_jpeg.pairs["train"]:
        assert image_path.suffix == ".jpg"
        assert mask_path.name == image_path.stem + ".png"


def test_jpeg_images_cycle_rgb_and_l(camvid_jpeg):
    for sample in camvid_jpeg.samples:
        with Image.open(sample.image_path) as image:
            assert image.format == "JPEG"
            assert image.mode == sample.image_mode


def test_make_explicit_flat_layout(explicit_src, tmp_path):
    root = tmp_path / "explicit"
    assert explicit_src.root == root
    assert explicit_src.class_dict_path == root / "classes.csv"
    assert list(explicit_src.pairs) == ["train"]
    pairs = explicit_src.pairs["train"]
    assert len(pairs) == 6
    for image_path, mask_path in pairs:
        assert image_path.parent == root / "images"
        assert mask_path == root / "masks" / image_path.name
    assert np.array_equal(_decoded_rgb(pairs[0][1]), _expected_rgb(explicit_src, pairs[0][0]))


def test_make_explicit_same_folder_without_suffix_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mask_suffix.*Received"):
        synth.make_explicit(tmp_path / "d", tmp_path / "d", tmp_path / "c.csv", 2)


# ----------------------------------------------------------------------------- masks


@pytest.mark.parametrize("fixture", ["camvid_src", "camvid_all_modes", "camvid_grey_masks"])
def test_masks_decode_to_class_colours_of_expected_class_map(fixture, request):
    ds = request.getfixturevalue(fixture)
    assert ds.num_samples >= 6
    for sample in ds.samples:
        decoded = _decoded_rgb(sample.mask_path)
        class_map = ds.expected_class_map(sample.image_path)
        assert class_map.shape == (sample.height, sample.width)
        assert class_map.dtype == np.uint8
        assert np.array_equal(decoded, ds.colors[class_map]), sample


def test_expected_class_map_accepts_mask_path_and_str(camvid_src):
    image_path, mask_path = camvid_src.pairs["val"][0]
    by_image = camvid_src.expected_class_map(image_path)
    assert np.array_equal(by_image, camvid_src.expected_class_map(str(mask_path)))


def test_expected_class_map_unknown_path_raises(camvid_src, tmp_path):
    with pytest.raises(ValueError, match="Received: path="):
        camvid_src.expected_class_map(tmp_path / "nope.png")


def test_mask_modes_cycle(camvid_all_modes):
    seen = set()
    for sample in camvid_all_modes.samples:
        with Image.open(sample.mask_path) as mask, Image.open(sample.image_path) as image:
            assert mask.mode == sample.mask_mode
            assert image.mode == sample.image_mode
            seen.add((image.mode, mask.mode))
    assert len(seen) == 12


def test_most_masks_hold_every_class(camvid_all_modes):
    complete = [
        len(np.unique(camvid_all_modes.expected_class_map(s.image_path))) == 5
        for s in camvid_all_modes.samples
    ]
    assert sum(complete) >= 0.75 * len(complete)


def test_p_mask_palette_is_shuffled(camvid_all_modes):
    p_samples = [s for s in camvid_all_modes.samples if s.mask_mode == "P"]
    assert p_samples
    for sample in p_samples:
        with Image.open(sample.mask_path) as mask:
            indices = np.asarray(mask)
            palette = np.array(mask.getpalette("RGB"), np.uint8).reshape(-1, 3)
        class_map = camvid_all_modes.expected_class_map(sample.image_path)
        assert not np.array_equal(indices, class_map)
        # The palette maps each index to the colour of the class drawn there.
        assert np.array_equal(palette[indices], camvid_all_modes.colors[class_map])
        assert len(palette) > len(camvid_all_modes.classes)  # spare entries


def test_rgba_mask_alpha_is_arbitrary_but_colours_exact(camvid_all_modes):
    sample = next(s for s in camvid_all_modes.samples if s.mask_mode == "RGBA")
    with Image.open(sample.mask_path) as mask:
        rgba = np.asarray(mask)
    assert rgba.shape[-1] == 4
    assert len(np.unique(rgba[..., 3])) > 100
    class_map = camvid_all_modes.expected_class_map(sample.image_path)
    assert np.array_equal(rgba[..., :3], camvid_all_modes.colors[class_map])


def test_l_masks_hold_grey_class_colours_not_indices(camvid_grey_masks):
    assert all(len(set(color)) == 1 for _, color in camvid_grey_masks.classes)
    sample = next(s for s in camvid_grey_masks.samples if s.mask_mode == "L")
    with Image.open(sample.mask_path) as mask:
        assert mask.mode == "L"
        values = np.asarray(mask)
    class_map = camvid_grey_masks.expected_class_map(sample.image_path)
    assert np.array_equal(values, camvid_grey_masks.colors[class_map][..., 0])
    assert not np.array_equal(values, class_map)


def test_l_masks_with_colour_classes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="grey.*Received: mask_modes"):
        synth.make_camvid(tmp_path / "d", mask_modes=("L",),
                          classes=synth.CAMVID_LIKE_CLASSES[:3])


# ----------------------------------------------------------------------------- unknown colours


def test_unknown_colours_are_planted_and_recorded(camvid_unknown_colors):
    ds = camvid_unknown_colors
    planted = ds.planted_unknown
    assert [p.kind for p in planted] == ["near", "far"]
    class_colors = ds.colors.astype(int)
    for p in planted:
        assert p.color not in {c for _, c in ds.classes}
        distance = np.abs(class_colors - np.array(p.color)).sum(axis=1)
        assert distance.argmin() == p.nearest_class
        if p.kind == "near":
            assert 1 <= distance.min() <= 2
        else:
            assert distance.min() >= 60
        decoded = _decoded_rgb(p.mask_path)
        top, left, bottom, right = p.region
        assert p.pixels == (bottom - top) * (right - left) > 0
        assert (decoded[top:bottom, left:right] == p.color).all()
        assert (decoded == p.color).all(axis=-1).sum() == p.pixels
    # Every mask decodes to the class colours everywhere else.
    for sample in ds.samples:
        assert np.array_equal(_decoded_rgb(sample.mask_path), _expected_rgb(ds, sample.image_path))


def test_expected_class_map_marks_unknown_pixels_on_request(camvid_unknown_colors):
    planted = camvid_unknown_colors.planted_unknown[0]
    class_map = camvid_unknown_colors.expected_class_map(planted.image_path, unknown_value=255)
    assert (class_map == 255).sum() == planted.pixels


def test_unknown_colours_in_grey_masks_are_grey(tmp_path):
    ds = synth.make_camvid(tmp_path / "d", splits={"train": 2}, mask_modes=("L",),
                           unknown_colors=4, seed=9)
    assert len(ds.planted_unknown) == 4
    for p in ds.planted_unknown:
        assert len(set(p.color)) == 1
    for sample in ds.samples:
        assert np.array_equal(_decoded_rgb(sample.mask_path), _expected_rgb(ds, sample.image_path))
    # Two regions per mask, never overlapping.
    for sample in ds.samples:
        assert sum(p.pixels for p in ds.planted_in(sample.image_path)) == (
            ds.expected_class_map(sample.image_path, unknown_value=255) == 255
        ).sum()


# ----------------------------------------------------------------------------- images


def test_images_are_textured(camvid_src):
    for image_path, _ in camvid_src.pairs["train"]:
        pixels = _decoded_rgb(image_path)
        assert pixels.std() > 20
        assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 0.5 * pixels.shape[0] * pixels.shape[1]


def test_textured_image_shape_dtype_and_determinism():
    a = synth.textured_image(30, 50, np.random.default_rng(5))
    b = synth.textured_image(30, 50, np.random.default_rng(5))
    assert a.shape == (30, 50, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b)


def test_textured_image_png_is_photo_sized():
    import io

    pixels = synth.textured_image(270, 480, np.random.default_rng(0))
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    # Photographs compress to roughly half their raw size as PNG; a flat image to ~0.
    assert buffer.tell() > 0.35 * pixels.nbytes


def test_rgba_and_palette_images(camvid_all_modes):
    rgba = next(s for s in camvid_all_modes.samples if s.image_mode == "RGBA")
    with Image.open(rgba.image_path) as image:
        assert np.asarray(image)[..., 3].std() > 10
    palette = next(s for s in camvid_all_modes.samples if s.image_mode == "P")
    with Image.open(palette.image_path) as image:
        assert image.mode == "P"
        assert len(np.unique(np.asarray(image))) > 64


def test_random_mask_values_and_validation():
    mask = synth.random_mask(40, 60, 7, np.random.default_rng(0))
    assert mask.shape == (40, 60) and mask.dtype == np.uint8
    assert mask.max() < 7
    with pytest.raises(ValueError, match="Received: num_classes=0"):
        synth.random_mask(40, 60, 0, np.random.default_rng(0))
    with pytest.raises(TypeError, match="Received: rng of type int"):
        synth.random_mask(40, 60, 3, 0)


# ----------------------------------------------------------------------------- class CSV


def test_class_dict_quirks_present(camvid_src):
    raw = camvid_src.class_dict_path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")
    text = raw.decode("utf-8-sig")
    lines = text.split("\r\n")
    assert lines[0] == "name, r, g, b, class_11"
    assert lines[1] == "Sky, 128, 128, 128, 1"
    assert "" in lines[1:-1]  # a blank line among the rows
    rows = [line.split(", ") for line in lines[1:] if line]
    assert [(r[0], tuple(int(v) for v in r[1:4])) for r in rows] == camvid_src.classes


def test_class_dict_plain(tmp_path):
    path = synth.write_class_dict(tmp_path / "c.csv", synth.CAMVID_LIKE_CLASSES[:2])
    assert path.read_bytes() == b"name,r,g,b\nSky,128,128,128\nBuilding,128,0,0\n"


def test_camvid_like_classes_have_distinct_colours():
    assert len(synth.CAMVID_LIKE_CLASSES) == 32
    assert len({c for _, c in synth.CAMVID_LIKE_CLASSES}) == 32
    assert len({n for n, _ in synth.CAMVID_LIKE_CLASSES}) == 32


def test_write_class_dict_rejects_bad_colour(tmp_path):
    with pytest.raises(ValueError, match="Received row"):
        synth.write_class_dict(tmp_path / "c.csv", [("Sky", (300, 0, 0))])


# ----------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"size": (0, 5)}, "Received: size="),
        ({"image_modes": ("CMYK",)}, "Received: image_modes="),
        ({"image_modes": ("RGBA",), "image_ext": ".jpg"}, "Received: image_modes="),
        ({"image_ext": ".tif"}, "Received: image_ext="),
        ({"num_classes": 33}, "Received: num_classes=33"),
        ({"splits": {}}, "Received: splits="),
        ({"seed": -1}, "Received: seed=-1"),
        ({"classes": [("A", (1, 1, 1)), ("B", (1, 1, 1))]}, "distinct"),
        ({"classes": [("A", (1, 1, 1))], "num_classes": 2}, "Received: num_classes=2"),
    ],
)
def test_make_camvid_bad_arguments_name_the_argument(tmp_path, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        synth.make_camvid(tmp_path / "d", **kwargs)


# ----------------------------------------------------------------------------- classification


def test_classification_layout_and_kinds(classification_src):
    ds = classification_src
    assert ds.classes == ["bird", "cat", "dog"]
    assert set(ds.files) == {"train", "val"}
    assert len(ds.files["train"]) == 12 and len(ds.files["val"]) == 6
    for split, files in ds.files.items():
        for path, label in files:
            assert path.parent == ds.root / split / ds.classes[label]
    assert set(ds.kinds.values()) == set(synth.CLASSIFICATION_KINDS)
    for kind in ("gif", "bmp", "jpeg_cmyk", "jpeg_exif_rotated"):
        assert len(ds.paths_of_kind(kind)) == 1
    formats = {}
    for path, kind in ds.kinds.items():
        with Image.open(path) as image:
            formats[kind] = (image.format, image.mode)
    assert formats["gif"] == ("GIF", "P")
    assert formats["bmp"] == ("BMP", "RGB")
    assert formats["jpeg_cmyk"] == ("JPEG", "CMYK")
    assert formats["jpeg_grey"] == ("JPEG", "L")
    assert formats["png_grey"] == ("PNG", "L")
    assert formats["png_rgba"] == ("PNG", "RGBA")
    assert any(p.suffix == ".JPG" for p in ds.kinds)


def test_classification_exif_orientation_gives_expected_size(classification_src):
    (path,) = classification_src.paths_of_kind("jpeg_exif_rotated")
    with Image.open(path) as image:
        assert image.getexif()[0x0112] == 6
        stored_height, stored_width = image.height, image.width
        oriented = ImageOps.exif_transpose(image)
    assert stored_width > stored_height
    assert (oriented.height, oriented.width) == classification_src.expected_sizes[path]
    assert classification_src.expected_sizes[path] == (stored_width, stored_height)
    for other, size in classification_src.expected_sizes.items():
        if other != path:
            with Image.open(other) as image:
                assert (image.height, image.width) == size


def test_classification_flat_layout(classification_flat):
    assert list(classification_flat.files) == [""]
    files = classification_flat.files[""]
    assert len(files) == 12
    for path, label in files:
        assert path.parent == classification_flat.root / classification_flat.classes[label]


def test_classification_per_class_int_needs_flat(tmp_path):
    with pytest.raises(TypeError, match="Received: per_class=3"):
        synth.make_classification(tmp_path / "d", per_class=3)


# ----------------------------------------------------------------------------- bench dataset


def test_make_bench_dataset_reuses_complete_dataset(tmp_path):
    root = tmp_path / "bench"
    ds = synth.make_bench_dataset(root, n=3, size=(36, 52), workers=1)
    assert len(ds.pairs["train"]) == 3
    stamp = json.loads((root / synth.BENCH_STAMP_NAME).read_text())
    assert stamp["params"] == {"n": 3, "size": [36, 52], "num_classes": 5, "seed": 0}
    mtimes = {p: p.stat().st_mtime_ns for p in root.rglob("*.png")}
    again = synth.make_bench_dataset(root, n=3, size=(36, 52), workers=1)
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.png")} == mtimes
    assert again.pairs == ds.pairs
    image_path, mask_path = ds.pairs["train"][0]
    assert np.array_equal(_decoded_rgb(mask_path), _expected_rgb(ds, image_path))


def test_make_bench_dataset_regenerates_damaged_file(tmp_path):
    root = tmp_path / "bench"
    ds = synth.make_bench_dataset(root, n=2, size=(36, 52), workers=1)
    image_path = ds.pairs["train"][0][0]
    good = image_path.read_bytes()
    image_path.write_bytes(good[:100])  # truncated
    synth.make_bench_dataset(root, n=2, size=(36, 52), workers=1)
    assert image_path.read_bytes() == good


def test_make_bench_dataset_smaller_n_removes_stale_samples(tmp_path):
    root = tmp_path / "bench"
    synth.make_bench_dataset(root, n=3, size=(36, 52), workers=1)
    ds = synth.make_bench_dataset(root, n=2, size=(36, 52), workers=1)
    assert sorted((root / "train").iterdir()) == sorted(i for i, _ in ds.pairs["train"])
    assert sorted((root / "train_labels").iterdir()) == sorted(m for _, m in ds.pairs["train"])


@pytest.mark.slow
def test_make_bench_dataset_workers_do_not_change_bytes(tmp_path):
    synth.make_bench_dataset(tmp_path / "one", n=4, size=(36, 52), workers=1)
    synth.make_bench_dataset(tmp_path / "two", n=4, size=(36, 52), workers=2)
    one, two = _tree_digest(tmp_path / "one"), _tree_digest(tmp_path / "two")
    assert one == two
