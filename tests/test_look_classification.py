"""`imgshard preview` and `inspect` on class folders and on datasets made by the real converter."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

import readers
from converter.cli import main as cli_main
from converter.convert import convert
from converter.inspect.describe import describe, format_description
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.inspect.preview import ERROR_TEXT, PreviewOptions, preview_dataset, preview_sources


def _png(path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB"))


def _crop(arr, box):
    x0, y0, x1, y1 = box
    return arr[y0:y1, x0:x1]


def _displayed(path) -> np.ndarray:
    """What a viewer shows: EXIF applied, RGB through Pillow's convert (grey repeated)."""
    with Image.open(path) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))


def _convert(src, out, fmt="tfrecord", size=(24, 24)) -> readers.Dataset:
    result = convert(SourceSpec(root=str(src)), str(out), OutputOptions(size=size, task="classification", format=fmt),
                     RunOptions(workers=1))
    assert result.published
    return readers.open(out)


def test_preview_raw_class_folders_is_a_grid_of_displayed_images_with_labels(classification_src, tmp_path):
    ds = classification_src
    out = tmp_path / "raw.png"
    sheet = preview_sources(SourceSpec(root=str(ds.root)), out, PreviewOptions(n=18))
    arr = _png(out)
    root = Path(ds.root)
    label_of = {str(p.relative_to(root)): label for files in ds.files.values() for p, label in files}
    assert sorted(b["key"] for b in sheet.boxes) == sorted(label_of)
    for box in sheet.boxes:
        assert box["label"] == label_of[box["key"]]
        s = int(box["scale"])
        expected = _displayed(root / box["key"])
        np.testing.assert_array_equal(_crop(arr, box["image"]), np.repeat(np.repeat(expected, s, 0), s, 1))
    (rotated,) = ds.paths_of_kind("jpeg_exif_rotated")
    box = next(b for b in sheet.boxes if b["key"] == str(rotated.relative_to(root)))
    x0, y0, x1, y1 = box["image"]
    assert y1 - y0 > x1 - x0  # portrait, as displayed


def test_preview_raw_class_folders_captions_a_bad_file_in_red(classification_src, tmp_path):
    root = Path(classification_src.root)
    (root / "val" / "cat" / "junk.jpg").write_bytes(b"not a jpeg")
    out = tmp_path / "raw.png"
    sheet = preview_sources(SourceSpec(root=str(root)), out,
                            PreviewOptions(keys=("val/cat/junk.jpg", "val/cat/cat_0000.png")))
    bad, good = sheet.boxes
    assert "image" not in bad and "image" in good
    arr = _png(out)
    x, y = good["image"][:2]  # the bad cell is left of the good one, same row
    cell = arr[y:y + 40, 0:x]
    assert (np.abs(cell.astype(int) - ERROR_TEXT).max(axis=-1) < 60).any()


def test_preview_cli_raw_class_folders_split_and_val_fraction(classification_src, classification_flat, tmp_path,
                                                              capsys):
    assert cli_main(["preview", str(classification_src.root), "-o", str(tmp_path / "v.png"), "--split", "val",
                     "-n", "20"]) == 0
    assert "6 sample(s) from the raw sources" in capsys.readouterr().err
    assert cli_main(["preview", str(classification_flat.root), "-o", str(tmp_path / "f.png"), "--split", "val",
                     "--val-fraction", "0.5", "-n", "20"]) == 0
    err = capsys.readouterr().err
    n_val = int(err.split("(")[1].split(",")[1].split()[0])
    from converter.discover.classfolders import discover_classification

    found, _ = discover_classification(SourceSpec(root=str(classification_flat.root)), 0.5)
    assert n_val == sum(s.split == "val" for s in found.samples) > 0


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_preview_converted_classification_dataset_shows_records_and_labels(classification_src, tmp_path, fmt):
    ds = _convert(classification_src.root, tmp_path / "out", fmt)
    out = tmp_path / "p.png"
    sheet = preview_dataset(ds.path, out, PreviewOptions(split="val", n=4, seed=3))
    arr = _png(out)
    records = {r.key: r for r in ds.records("val")}
    assert len(sheet.boxes) == 4
    for box in sheet.boxes:
        rec = records[box["key"]]
        assert box["label"] == rec.label and box["scale"] == 8  # 24x24 records -> 192 px tiles
        np.testing.assert_array_equal(_crop(arr, box["image"]), np.repeat(np.repeat(rec.image, 8, 0), 8, 1))


def test_preview_cli_converted_classification_dataset_by_key(classification_src, tmp_path, capsys):
    ds = _convert(classification_src.root, tmp_path / "out")
    key = next(iter(ds.records("train"))).key
    assert cli_main(["preview", str(ds.path), "-o", str(tmp_path / "k.png"), "--key", key]) == 0
    assert "1 sample(s) from the dataset" in capsys.readouterr().err


def test_inspect_converted_classification_dataset_counts_and_absent_classes(classification_src, tmp_path):
    root = Path(classification_src.root)
    for f in (root / "val" / "dog").iterdir():
        f.unlink()
    (root / "train" / "zebra").mkdir()
    ds = _convert(root, tmp_path / "out", "npz")
    d = describe(ds.path)
    assert d["task"] == "classification" and d["share_unit"] == "records"
    assert d["record_shapes"] == {"image": {"shape": [24, 24, 3], "dtype": "uint8"},
                                  "label": {"shape": [], "dtype": "int64"}}
    for sp in ("train", "val"):
        labels = Counter(r.label for r in ds.records(sp))
        n = sum(labels.values())
        assert d["splits"][sp]["samples"] == n
        assert d["splits"][sp]["class_images"] == [labels.get(i, 0) for i in range(4)]
        for c in d["classes"]:
            assert c["images"][sp] == labels.get(c["index"], 0)
            assert c["share"][sp] == pytest.approx(100 * labels.get(c["index"], 0) / n, abs=1e-4)
    text = format_description(d)
    assert "label int64" in text
    lines = {line.split()[1]: line for line in text.splitlines() if line.startswith("    ") and line.split()[0].isdigit()}
    assert "absent from val" in lines["dog"] and "absent from train, val" in lines["zebra"]
    assert "(4)" in lines["bird"]  # image counts beside the shares
    weights = ds.class_weights("train")
    assert weights.shape == (4,) and weights[3] == 0 and np.isfinite(weights).all()


def test_inspect_cli_converted_classification_dataset(classification_src, tmp_path, capsys):
    ds = _convert(classification_src.root, tmp_path / "out")
    assert cli_main(["inspect", str(ds.path), "--no-color"]) == 0
    text = capsys.readouterr().out
    assert "Task: classification" in text and "share of records" in text
