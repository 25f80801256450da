"""`imgshard preview`: contact sheets whose pixels are where and what they should be."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import readers
from converter.inspect import preview as pv
from converter.cli import main as cli_main
from converter.options import SourceSpec
from converter.inspect.preview import PreviewOptions, preview_dataset, preview_sources
from tests._look import convert_tiny, write_classification


def _png(path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB"))


def _crop(arr, box):
    x0, y0, x1, y1 = box
    return arr[y0:y1, x0:x1]


@pytest.fixture
def converted(camvid_src, tmp_path):
    convert_tiny(camvid_src.root, tmp_path / "out")
    return readers.open(tmp_path / "out")


def test_preview_dataset_png_size_and_class_colours_at_known_places(converted, tmp_path):
    out = tmp_path / "preview.png"
    sheet = preview_dataset(converted.path, out, PreviewOptions(split="train", n=3, seed=0))
    arr = _png(out)
    # 32x48 records are enlarged 4x to 128x192 tiles; three columns
    assert sheet.size == (2 * pv.MARGIN + 3 * 192 + 2 * pv.GAP, arr.shape[0]) == (616, arr.shape[0])
    assert arr.shape[1] == 616
    records = {r.key: r for r in converted.records("train")}
    palette = np.array([c for _, c in converted.classes], np.uint8)
    assert len(sheet.boxes) == 3
    for box in sheet.boxes:
        rec = records[box["key"]]
        assert box["scale"] == 4
        expected_mask = np.repeat(np.repeat(palette[rec.mask], 4, axis=0), 4, axis=1)
        np.testing.assert_array_equal(_crop(arr, box["mask"]), expected_mask)
        np.testing.assert_array_equal(_crop(arr, box["image"]),
                                      np.repeat(np.repeat(rec.image, 4, axis=0), 4, axis=1))
        # overlay: half image, half class colour, at the centre of the stored pixel (5, 7)
        x0, y0, _, _ = box["overlay"]
        got = arr[y0 + 5 * 4 + 2, x0 + 7 * 4 + 2].astype(int)
        want = np.rint(rec.image[5, 7] * 0.5 + palette[rec.mask[5, 7]] * 0.5).astype(int)
        assert np.abs(got - want).max() <= 1
    for entry, (name, color) in zip(sheet.legend, converted.classes):
        assert entry["name"] == name
        x0, y0, x1, y1 = entry["box"]
        assert tuple(arr[(y0 + y1) // 2, (x0 + x1) // 2]) == tuple(color)


def test_preview_picks_the_same_samples_for_the_same_seed(converted, tmp_path):
    a = preview_dataset(converted.path, tmp_path / "a.png", PreviewOptions(n=3, seed=7))
    b = preview_dataset(converted.path, tmp_path / "b.png", PreviewOptions(n=3, seed=7))
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    keys = {tuple(x["key"] for x in a.boxes)}
    for seed in range(1, 6):
        s = preview_dataset(converted.path, tmp_path / "c.png", PreviewOptions(n=3, seed=seed))
        keys.add(tuple(x["key"] for x in s.boxes))
    assert len(keys) > 1
    assert [x["key"] for x in a.boxes] == [x["key"] for x in b.boxes]


def test_preview_onehot_dataset_shows_ignored_pixels_as_grey_checker(camvid_unknown_colors, tmp_path):
    convert_tiny(camvid_unknown_colors.root, tmp_path / "oh", mask_encoding="onehot", unknown_color="ignore",
                 size=(64, 96))
    ds = readers.open(tmp_path / "oh")
    far = next(p for p in camvid_unknown_colors.planted_unknown if p.kind == "far")
    assert camvid_unknown_colors.sample(far.image_path).height == 64  # stored at source size: regions map 1:1
    key = f"{far.image_path.parent.name}/{far.image_path.name}"
    split = far.image_path.parent.name
    sheet = preview_dataset(ds.path, tmp_path / "oh.png", PreviewOptions(split=split, keys=(key,)))
    arr = _png(tmp_path / "oh.png")
    box = sheet.boxes[0]
    tile = _crop(arr, box["mask"])
    top, left, bottom, right = far.region
    s = int(box["scale"])
    region = tile[top * s:bottom * s, left * s:right * s].reshape(-1, 3)
    colors = {tuple(c) for c in region}
    assert colors <= set(pv.IGNORE_COLORS) and len(colors) == 2


def test_preview_sources_marks_unknown_colours_loud(camvid_unknown_colors, tmp_path):
    ds = camvid_unknown_colors
    planted = ds.planted_unknown[0]
    key = f"{planted.image_path.parent.name}/{planted.image_path.name}"
    out = tmp_path / "src.png"
    sheet = preview_sources(SourceSpec(root=str(ds.root)), out, PreviewOptions(keys=(key,)))
    arr = _png(out)
    box = sheet.boxes[0]
    s = int(box["scale"])
    tile = _crop(arr, box["mask"])
    top, left, bottom, right = planted.region
    region = tile[top * s:bottom * s, left * s:right * s].reshape(-1, 3)
    assert {tuple(c) for c in region} == set(pv.UNKNOWN_COLORS)
    # every other pixel has its class colour
    expected = ds.expected_class_map(planted.image_path, unknown_value=255)
    known = np.repeat(np.repeat(expected != 255, s, axis=0), s, axis=1)
    palette = ds.colors
    want = np.repeat(np.repeat(palette[np.minimum(expected, len(palette) - 1)], s, axis=0), s, axis=1)
    np.testing.assert_array_equal(tile[known], want[known])
    assert any(e["name"] == "colour in no class" for e in sheet.legend)


def test_preview_sources_with_tolerance_snaps_near_colour(camvid_unknown_colors, tmp_path):
    near = next(p for p in camvid_unknown_colors.planted_unknown if p.kind == "near")
    key = f"{near.image_path.parent.name}/{near.image_path.name}"
    sheet = preview_sources(SourceSpec(root=str(camvid_unknown_colors.root)), tmp_path / "t.png",
                            PreviewOptions(keys=(key,), color_tolerance=2))
    tile = _crop(_png(tmp_path / "t.png"), sheet.boxes[0]["mask"])
    s = int(sheet.boxes[0]["scale"])
    top, left, _, _ = near.region
    assert tuple(tile[top * s, left * s]) == camvid_unknown_colors.classes[near.nearest_class][1]


def test_preview_sources_bad_file_is_captioned_not_fatal(camvid_src, tmp_path):
    image, _ = camvid_src.pairs["val"][0]
    image.write_bytes(b"garbage")
    key = f"val/{image.name}"
    sheet = preview_sources(SourceSpec(root=str(camvid_src.root)), tmp_path / "bad.png",
                            PreviewOptions(keys=(key, f"val/{camvid_src.pairs['val'][1][0].name}")))
    assert "mask" not in sheet.boxes[0] and "mask" in sheet.boxes[1]


def test_preview_unknown_key_is_an_error(converted, tmp_path):
    with pytest.raises(KeyError, match="no sample 'train/nope.png'"):
        preview_dataset(converted.path, tmp_path / "x.png", PreviewOptions(keys=("train/nope.png",)))


def test_preview_output_folder_must_exist(converted, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        preview_dataset(converted.path, tmp_path / "no" / "x.png")


def test_preview_classification_grid_with_class_names(classification_src, tmp_path):
    write_classification(classification_src, tmp_path / "cls")
    ds = readers.open(tmp_path / "cls")
    sheet = preview_dataset(ds.path, tmp_path / "cls.png", PreviewOptions(n=5, seed=1))
    arr = _png(tmp_path / "cls.png")
    records = {r.key: r for r in ds.records("train")}
    assert len(sheet.boxes) == 5
    for box in sheet.boxes:
        rec = records[box["key"]]
        assert box["label"] == rec.label
        s = int(box["scale"])
        np.testing.assert_array_equal(_crop(arr, box["image"]), np.repeat(np.repeat(rec.image, s, 0), s, 1))


def test_preview_cli_detects_dataset_and_sources(converted, camvid_src, tmp_path, capsys):
    assert cli_main(["preview", converted.path, "-o", str(tmp_path / "d.png"), "-n", "2"]) == 0
    assert "from the dataset" in capsys.readouterr().err
    assert cli_main(["preview", str(camvid_src.root), "-o", str(tmp_path / "s.png"), "-n", "2",
                     "--split", "val"]) == 0
    assert "from the raw sources" in capsys.readouterr().err
    with Image.open(tmp_path / "s.png") as im:
        assert im.size[0] == 616
