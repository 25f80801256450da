"""Class-folder discovery: layouts, task detection, labels, the stable --val-fraction split."""

from __future__ import annotations

import os
import shutil

import pytest

from converter.testing import synth
from converter.discover.classfolders import (
    assign_split,
    classification_layout,
    detect_task,
    discover_classification,
    image_extensions,
    val_hash_fraction,
)
from converter.options import OutputOptions, SourceSpec, Task


def _key_of(root, path) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def test_split_layout_detected_as_classification(classification_src):
    spec = SourceSpec(root=str(classification_src.root))
    assert classification_layout(str(classification_src.root)) == "split"
    assert detect_task(spec) is Task.CLASSIFICATION


def test_flat_layout_detected_as_classification(classification_flat):
    assert classification_layout(str(classification_flat.root)) == "flat"
    assert detect_task(SourceSpec(root=str(classification_flat.root))) is Task.CLASSIFICATION


def test_camvid_layout_detected_as_segmentation(camvid_src):
    assert detect_task(SourceSpec(root=str(camvid_src.root))) is Task.SEGMENTATION


def test_camvid_without_label_folders_is_not_classification(camvid_src):
    # train/ holding images directly is a CamVid split, not class folders.
    for split in ("train", "val", "test"):
        shutil.rmtree(camvid_src.root / f"{split}_labels")
    (camvid_src.root / "class_dict.csv").unlink()
    assert detect_task(SourceSpec(root=str(camvid_src.root))) is Task.SEGMENTATION


def test_images_and_masks_folders_are_not_class_folders(tmp_path):
    synth.make_explicit(tmp_path / "src" / "images", tmp_path / "src" / "masks", tmp_path / "classes.csv", 2,
                        size=(16, 16), seed=1)
    assert classification_layout(str(tmp_path / "src")) is None
    assert detect_task(SourceSpec(root=str(tmp_path / "src"))) is Task.SEGMENTATION


def test_explicit_images_without_masks_is_classification(classification_flat):
    assert detect_task(SourceSpec(images=str(classification_flat.root))) is Task.CLASSIFICATION


def test_split_layout_labels_are_sorted_class_folder_indices(classification_src):
    found, classes = discover_classification(SourceSpec(root=str(classification_src.root)))
    assert [c.name for c in classes] == ["bird", "cat", "dog"] == classification_src.classes
    assert all(c.color is None for c in classes)
    assert set(found.splits) == {"train", "val"}
    expected = {(split, _key_of(classification_src.root, p), label)
                for split, files in classification_src.files.items() for p, label in files}
    assert {(s.split, s.key, s.label) for s in found.samples} == expected
    assert found.bad == ()


def test_every_pillow_file_kind_is_found(classification_src):
    found, _ = discover_classification(SourceSpec(root=str(classification_src.root)))
    paths = {s.image for s in found.samples}
    for kind in ("gif", "bmp", "jpeg_cmyk", "jpeg_grey", "jpeg_exif_rotated", "png_grey", "png_rgba"):
        for p in classification_src.paths_of_kind(kind):
            assert str(p) in paths, kind
    assert {".gif", ".bmp", ".jpg", ".jpeg", ".png", ".webp", ".tif"} <= image_extensions()
    assert ".h5" not in image_extensions()


def test_class_missing_from_one_split_keeps_labels(classification_src):
    shutil.rmtree(classification_src.root / "val" / "bird")
    _, classes = discover_classification(SourceSpec(root=str(classification_src.root)))
    assert [c.name for c in classes] == ["bird", "cat", "dog"]


def test_image_outside_class_folder_is_bad_input(classification_src):
    stray = classification_src.root / "train" / "stray.png"
    shutil.copy(classification_src.paths_of_kind("png_rgb")[0], stray)
    found, _ = discover_classification(SourceSpec(root=str(classification_src.root)))
    assert [(b.path, b.kind) for b in found.bad] == [(str(stray), "no_class")]
    assert "move it into" in found.bad[0].fix


def test_zero_byte_image_is_bad_input(classification_flat):
    empty = classification_flat.root / "cat" / "empty.jpg"
    empty.write_bytes(b"")
    found, _ = discover_classification(SourceSpec(root=str(classification_flat.root)))
    assert [(b.path, b.kind) for b in found.bad] == [(str(empty), "empty_file")]
    assert all(s.image != str(empty) for s in found.samples)


def test_non_split_folder_beside_split_folders_is_an_error(classification_src):
    (classification_src.root / "extra" / "cat").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"extra"):
        discover_classification(SourceSpec(root=str(classification_src.root)))


def test_no_class_folder_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="No class folders"):
        discover_classification(SourceSpec(root=str(tmp_path / "empty")))


def test_flat_layout_without_val_fraction_is_all_train(classification_flat):
    found, classes = discover_classification(SourceSpec(root=str(classification_flat.root)))
    assert found.splits == ("train",)
    assert {s.split for s in found.samples} == {"train"}
    assert {(s.key, s.label) for s in found.samples} == {
        (_key_of(classification_flat.root, p), label) for p, label in classification_flat.files[""]}


def test_flat_layout_val_fraction_assigns_by_key_hash(classification_flat):
    found, _ = discover_classification(SourceSpec(root=str(classification_flat.root)), 0.5)
    assert found.splits == ("train", "val")
    for s in found.samples:
        assert s.split == ("val" if val_hash_fraction(s.key) < 0.5 else "train")
    assert {s.split for s in found.samples} == {"train", "val"}  # 12 keys: both splits occur


def test_val_hash_fraction_is_uniform_enough_and_stable():
    keys = [f"cat/img_{i:05d}.jpg" for i in range(2000)]
    share = sum(assign_split(k, 0.2) == "val" for k in keys) / len(keys)
    assert 0.17 < share < 0.23
    assert val_hash_fraction("cat/a.jpg") == val_hash_fraction("cat/a.jpg")
    assert assign_split("cat/a.jpg", None) == "train"


def test_val_fraction_with_split_folders_is_an_error(classification_src):
    with pytest.raises(ValueError, match="--val-fraction applies to the flat layout"):
        discover_classification(SourceSpec(root=str(classification_src.root)), 0.2)


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.1, True, "x"])
def test_val_fraction_out_of_range_is_refused(value):
    with pytest.raises(ValueError, match="--val-fraction"):
        OutputOptions(size=(8, 8), task="classification", val_fraction=value)


def test_val_fraction_needs_classification():
    with pytest.raises(ValueError, match="classification"):
        OutputOptions(size=(8, 8), val_fraction=0.2)


def test_explicit_images_folder_of_classes_uses_split(classification_flat):
    found, classes = discover_classification(SourceSpec(images=str(classification_flat.root), split="test"))
    assert found.splits == ("test",)
    assert {s.split for s in found.samples} == {"test"}
    assert all(s.key.startswith("test/") for s in found.samples)
    assert [c.name for c in classes] == classification_flat.classes


def test_class_table_csv_with_classification_is_an_error(classification_flat):
    with pytest.raises(ValueError, match="--classes"):
        discover_classification(SourceSpec(root=str(classification_flat.root), classes="x.csv"))
