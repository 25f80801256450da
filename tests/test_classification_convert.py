"""Converting class-folder datasets: labels, pixels (EXIF, CMYK, grey, GIF, BMP), incremental runs, CLI."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from PIL import Image, ImageOps

import readers
from converter import cli
from converter.testing import synth
from converter.convert import BadInputError, convert
from converter.discover.classfolders import val_hash_fraction
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.plan.shards import PlanError
from readers.index import shard_samples
from readers.manifest import Manifest

ONE_WORKER = RunOptions(workers=1)
PAD_SIZE = (80, 80)  # larger than every generated image (32..72 a side): crop-or-pad only pads


def _convert(src, out, **options):
    opts = OutputOptions(**{"size": (16, 16), "task": "classification", **options})
    return convert(SourceSpec(root=str(src)), str(out), opts, ONE_WORKER)


def _key(root, path) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def _expected_labels(ds: synth.SynthClassification) -> dict[str, tuple[str, int]]:
    return {_key(ds.root, p): (split or "train", label) for split, files in ds.files.items() for p, label in files}


def _pillow_reference(path, size) -> np.ndarray:
    """What a viewer shows (EXIF applied, RGB via Pillow's convert), centred in a zero canvas."""
    with Image.open(path) as im:
        rgb = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    out = np.zeros(size + (3,), np.uint8)
    y, x = (size[0] - rgb.shape[0]) // 2, (size[1] - rgb.shape[1]) // 2
    out[y:y + rgb.shape[0], x:x + rgb.shape[1]] = rgb
    return out


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_classification_records_carry_folder_labels(classification_src, tmp_path, fmt):
    result = _convert(classification_src.root, tmp_path / "out", format=fmt)
    assert result.published
    ds = readers.open(tmp_path / "out")
    assert ds.task == "classification"
    assert ds.classes == [("bird", None), ("cat", None), ("dog", None)]
    expected = _expected_labels(classification_src)
    seen = {}
    for split in ds.splits:
        for r in ds.records(split):
            assert r.mask is None
            assert r.image.shape == (16, 16, 3) and r.image.dtype == np.uint8
            seen[r.key] = (split, r.label)
    assert seen == expected
    for split in ds.splits:  # class counts per split: images per class
        counts = np.bincount([lab for s, lab in expected.values() if s == split], minlength=3)
        assert ds.class_pixel_counts(split).tolist() == counts.tolist()
    manifest = Manifest.load(tmp_path / "out")
    assert manifest.mask is None
    assert all(s.label == seen[s.key][1] for _, sh in manifest.iter_shards()
               for s in shard_samples(str(tmp_path / "out"), sh))


def test_pixels_equal_pillow_oriented_rgb_for_every_file_kind(classification_src, tmp_path):
    _convert(classification_src.root, tmp_path / "out", size=PAD_SIZE, fit="crop-or-pad")
    ds = readers.open(tmp_path / "out")
    images = {r.key: r.image for split in ds.splits for r in ds.records(split)}
    for path, kind in classification_src.kinds.items():
        got = images[_key(classification_src.root, path)]
        np.testing.assert_array_equal(got, _pillow_reference(path, PAD_SIZE), err_msg=f"{kind}: {path}")
        if kind in ("jpeg_grey", "png_grey"):
            assert np.array_equal(got[..., 0], got[..., 1]) and np.array_equal(got[..., 1], got[..., 2])


def test_exif_orientation_gives_displayed_size(classification_src, tmp_path):
    _convert(classification_src.root, tmp_path / "out", size=PAD_SIZE, fit="crop-or-pad")
    ds = readers.open(tmp_path / "out")
    images = {r.key: r.image for split in ds.splits for r in ds.records(split)}
    (path,) = classification_src.paths_of_kind("jpeg_exif_rotated")
    h, w = classification_src.expected_sizes[path]
    with Image.open(path) as im:
        assert (im.height, im.width) == (w, h) and h > w  # stored landscape, displayed portrait
    image = images[_key(classification_src.root, path)]
    y, x = (PAD_SIZE[0] - h) // 2, (PAD_SIZE[1] - w) // 2
    content = np.zeros(PAD_SIZE, bool)
    content[y:y + h, x:x + w] = True
    assert not image[~content].any()  # padding exactly outside the displayed size
    for edge in (image[y], image[y + h - 1], image[:, x], image[:, x + w - 1]):
        assert edge.any()


def test_cmyk_jpeg_becomes_rgb_close_to_its_source(classification_src, tmp_path):
    _convert(classification_src.root, tmp_path / "out", size=PAD_SIZE, fit="crop-or-pad")
    ds = readers.open(tmp_path / "out")
    (path,) = classification_src.paths_of_kind("jpeg_cmyk")
    record = next(r for s in ds.splits for r in ds.records(s) if r.key == _key(classification_src.root, path))
    with Image.open(path) as im:
        assert im.mode == "CMYK"
        c, m, y_, k = (np.asarray(im, np.float64)[..., i] for i in range(4))
    naive = np.stack([255 - np.minimum(255, v + k) for v in (c, m, y_)], axis=-1)  # Pillow's CMYK->RGB rule
    h, w = naive.shape[:2]
    oy, ox = (PAD_SIZE[0] - h) // 2, (PAD_SIZE[1] - w) // 2
    assert np.abs(record.image[oy:oy + h, ox:ox + w].astype(np.float64) - naive).max() <= 1


def test_corrupt_image_in_class_folder_is_reported_and_blocks_publish(classification_src, tmp_path):
    bad = classification_src.root / "train" / "cat" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(BadInputError) as info:
        _convert(classification_src.root, tmp_path / "out")
    assert [b.path for b in info.value.bad] == [str(bad)]
    assert not (tmp_path / "out" / "imgshard.json").exists()
    result = convert(SourceSpec(root=str(classification_src.root)), str(tmp_path / "out"),
                     OutputOptions(size=(16, 16), task="classification"), RunOptions(workers=1, max_bad=1))
    assert result.published and result.manifest.split("train").num_samples == len(classification_src.files["train"])


def _add_flat_files(ds: synth.SynthClassification, tmp_path, per_class: int, seed: int) -> list[str]:
    """New files (new names) in the existing class folders; returns their keys."""
    extra = synth.make_classification(tmp_path / f"extra{seed}", classes=ds.classes, per_class=per_class,
                                      flat=True, seed=seed)
    keys = []
    for path, _label in extra.files[""]:
        target = ds.root / path.parent.name / f"new{seed}_{path.name}"
        shutil.copy(path, target)
        keys.append(_key(ds.root, target))
    return keys


def test_flat_val_fraction_keeps_assignments_across_incremental_runs(classification_flat, tmp_path):
    out = tmp_path / "out"
    _convert(classification_flat.root, out, val_fraction=0.5)
    first = readers.open(out)
    before = {r.key: split for split in first.splits for r in first.records(split)}
    assert set(before.values()) == {"train", "val"}
    shards_before = {s.file: s.digest for _, s in first.manifest.iter_shards()}

    new_keys = _add_flat_files(classification_flat, tmp_path, per_class=3, seed=11)
    result = _convert(classification_flat.root, out, val_fraction=0.5)
    assert result.plan.new == len(new_keys) == 9 and result.plan.unchanged == len(before)
    after_ds = readers.open(out)
    after = {r.key: split for split in after_ds.splits for r in after_ds.records(split)}
    assert {k: after[k] for k in before} == before  # old assignments unchanged
    for key in new_keys:
        assert after[key] == ("val" if val_hash_fraction(key) < 0.5 else "train")
    listed = {s.file: s.digest for _, s in after_ds.manifest.iter_shards()}
    assert {f: listed[f] for f in shards_before} == shards_before  # old shards untouched
    for name, digest in shards_before.items():
        from converter.plan.fingerprint import digest_file

        assert digest_file(str(out / name)) == digest


def test_changed_val_fraction_is_refused_without_rebuild(classification_flat, tmp_path):
    _convert(classification_flat.root, tmp_path / "out", val_fraction=0.5)
    with pytest.raises(PlanError, match="val_fraction"):
        _convert(classification_flat.root, tmp_path / "out", val_fraction=0.3)


def test_new_class_folder_is_refused_without_rebuild(classification_flat, tmp_path):
    _convert(classification_flat.root, tmp_path / "out")
    (classification_flat.root / "ant").mkdir()
    shutil.copy(classification_flat.paths_of_kind("png_rgb")[0], classification_flat.root / "ant" / "a.png")
    with pytest.raises(PlanError, match=r"added: \['ant'\]"):
        _convert(classification_flat.root, tmp_path / "out")
    result = convert(SourceSpec(root=str(classification_flat.root)), str(tmp_path / "out"),
                     OutputOptions(size=(16, 16), task="classification"), RunOptions(workers=1, rebuild=True))
    assert [c.name for c in result.manifest.classes] == ["ant", "bird", "cat", "dog"]


def test_cli_detects_classification(classification_src, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["convert", str(classification_src.root), str(out), "--size", "16x16", "--workers", "1"]) == 0
    assert "task classification (detected" in capsys.readouterr().err
    assert readers.open(out).task == "classification"


def test_cli_task_segmentation_overrides_detection(classification_src, tmp_path, capsys):
    code = cli.main(["convert", str(classification_src.root), str(tmp_path / "out"), "--size", "16x16",
                     "--task", "segmentation", "-q"])
    assert code == 1
    assert "class_dict.csv" in capsys.readouterr().err
    assert not (tmp_path / "out" / "imgshard.json").exists()


def test_cli_task_classification_overrides_mask_like_folder_name(tmp_path):
    src = synth.make_classification(tmp_path / "src", classes=("labels", "plain"), per_class=2, flat=True, seed=3)
    from converter.discover.classfolders import detect_task

    assert detect_task(SourceSpec(root=str(src.root))).value == "segmentation"  # "labels" looks like masks
    out = tmp_path / "out"
    assert cli.main(["convert", str(src.root), str(out), "--size", "8x8", "--task", "classification",
                     "--workers", "1", "-q"]) == 0
    assert readers.open(out).classes == [("labels", None), ("plain", None)]


def test_cli_val_fraction_implies_classification(classification_flat, tmp_path):
    out = tmp_path / "out"
    assert cli.main(["convert", str(classification_flat.root), str(out), "--size", "8x8", "--val-fraction", "0.5",
                     "--workers", "1", "-q"]) == 0
    assert sorted(readers.open(out).splits) == ["train", "val"]


def test_png_with_exif_orientation_is_rotated(tmp_path):
    """libspng ignores a PNG's eXIf chunk; such PNGs take the Pillow path and are oriented."""
    rgb = synth.textured_image(20, 36, np.random.default_rng(4))  # stored 20x36 (landscape)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display: 36x20 (portrait)
    for name in ("a", "b"):
        (tmp_path / "src" / name).mkdir(parents=True)
        Image.fromarray(rgb).save(tmp_path / "src" / name / "img.png", "PNG", exif=exif.tobytes())
    _convert(tmp_path / "src", tmp_path / "out", size=(40, 40), fit="crop-or-pad")
    image = next(readers.open(tmp_path / "out").records("train")).image
    expected = np.rot90(rgb, k=-1)  # clockwise
    assert expected.shape[:2] == (36, 20)
    np.testing.assert_array_equal(image[2:38, 10:30], expected)
    assert not image[:, :10].any() and not image[:, 30:].any()


def test_files_whose_extension_lies_are_decoded_by_content(classification_flat, tmp_path):
    """Real datasets hide a GIF (or a PNG) among the JPEGs under a .jpg name."""
    gif = classification_flat.paths_of_kind("gif")[0]
    png = classification_flat.paths_of_kind("png_rgb")[0]
    fake_jpg = gif.parent / "hidden_gif.jpg"
    fake_jpeg = png.parent / "hidden_png.jpeg"
    shutil.copy(gif, fake_jpg)
    shutil.copy(png, fake_jpeg)
    _convert(classification_flat.root, tmp_path / "out", size=PAD_SIZE, fit="crop-or-pad")
    images = {r.key: r.image for r in readers.open(tmp_path / "out").records("train")}
    for path in (fake_jpg, fake_jpeg):
        np.testing.assert_array_equal(images[_key(classification_flat.root, path)], _pillow_reference(path, PAD_SIZE))
    assert np.array_equal(images[_key(classification_flat.root, fake_jpg)], images[_key(classification_flat.root, gif)])
