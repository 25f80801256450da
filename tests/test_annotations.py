"""Annotation files that are not mask images (issue 27): each export converts bit-exact
against its reference implementation (`tests/_annotations.py`), cron re-converts only what
changed, hostile files get named errors."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest

import readers
from converter.cli import main as cli_main
from converter.convert import convert
from converter.discover.annotations.base import AnnotationFileError
from converter.discover.layouts import detect_layout
from converter.options import AnnotationOptions, OnChange, OutputOptions, RunOptions, SourceSpec
from tests import _annotations as A

SIZE = (20, 26)  # (h, w): never a source size


def assert_converts(exp: A.Export, out, spec: SourceSpec | None = None, size=SIZE) -> readers.Dataset:
    convert(spec or SourceSpec(root=str(exp.root)), str(out), OutputOptions(size=size), RunOptions(workers=2))
    data = readers.open(out)
    assert [n for n, _ in data.classes] == exp.names
    assert data.splits == exp.splits()
    records = {r.key: r for split in data.splits for r in data.records(split)}
    assert set(records) == set(exp.images)
    for key, image in exp.images.items():
        ref_image, ref_mask = A.reference(image, exp.expected[key], size)
        np.testing.assert_array_equal(records[key].image, ref_image, err_msg=key)
        np.testing.assert_array_equal(records[key].mask.astype(np.int64), ref_mask, err_msg=key)
    return data


def test_coco_roboflow_export_bit_exact_with_placeholder_crowd_and_sparse_ids(tmp_path):
    exp = A.make_coco(tmp_path / "src")
    assert detect_layout(str(exp.root)).layout.name == "coco"
    assert_converts(exp, tmp_path / "out")
    assert any((m == A.IGNORE).any() for m in exp.expected.values())  # crowd regions really are there
    assert len({int(v) for m in exp.expected.values() for v in np.unique(m)}) == 5


def test_coco_cron_adds_new_images_and_reconverts_only_the_changed_polygon(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    exp = A.make_coco(src, splits=("train",), per_split=5)
    convert(SourceSpec(root=str(src)), str(out), OutputOptions(size=SIZE), RunOptions(workers=1))
    again = convert(SourceSpec(root=str(src)), str(out), OutputOptions(size=SIZE), RunOptions(workers=1))
    assert again.plan.nothing_to_do and again.plan.unchanged == 5
    exp = A.make_coco(src, splits=("train",), per_split=5, extra_image=True, move_polygon=True)  # file rewritten
    grown = convert(SourceSpec(root=str(src)), str(out), OutputOptions(size=SIZE),
                    RunOptions(workers=1, on_change=OnChange.REPLACE))
    assert (grown.plan.new, grown.plan.replaced, grown.plan.unchanged) == (1, 1, 4)
    records = {r.key: r for r in readers.open(out).records("train")}
    for key, image in exp.images.items():
        np.testing.assert_array_equal(records[key].mask.astype(np.int64),
                                      A.reference(image, exp.expected[key], SIZE)[1], err_msg=key)


def _coco_file(tmp_path, anns, images=None, cats=None) -> str:
    root = tmp_path / "hostile"
    A.write_image(root / "a.png", 10, 12, A.rng_for(5, 0))
    doc = {"images": images or [{"id": 1, "file_name": "a.png", "height": 10, "width": 12}],
           "annotations": anns, "categories": cats or [{"id": 1, "name": "thing"}]}
    (root / "ann.json").write_text(json.dumps(doc) if not isinstance(anns, str) else anns)
    return str(root)


@pytest.mark.parametrize("anns, says", [
    ([{"id": 41, "image_id": 1, "category_id": 9, "segmentation": [[0, 0, 5, 0, 5, 5]]}], "category_id 9"),
    ([{"id": 42, "image_id": 1, "category_id": 1, "segmentation": [[0, 0, 1e12, 0, 5, 5]]}], "not finite or beyond"),
    ([{"id": 43, "image_id": 1, "category_id": 1, "segmentation": {"size": [10, 12], "counts": [5, 200]}}],
     "past the 10x12 image"),
    ([{"id": 44, "image_id": 1, "category_id": 1, "segmentation": {"size": [10, 12], "counts": A.compressed_rle(
        np.pad(np.ones((20, 20), np.uint8), ((3, 0), (0, 0))))}}], "past the 10x12 image"),
    ([{"id": 45, "image_id": 7, "category_id": 1, "segmentation": [[0, 0, 5, 0, 5, 5]]}], "image_id 7"),
])
def test_coco_hostile_annotations_named_with_file_and_annotation_id(tmp_path, anns, says):
    root = _coco_file(tmp_path, anns)
    with pytest.raises(AnnotationFileError) as e:
        convert(SourceSpec(root=root), str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))
    assert says in str(e.value) and "ann.json" in str(e.value)
    assert f"annotation id {anns[0]['id']}" in str(e.value) or "image_id" in says


def test_coco_invalid_json_and_nan_named(tmp_path):
    good = '{"images": [], "annotations": [], "categories": [], '
    for text, says in ((good + '"x": NaN}', "NaN"), (good + '"x": [1,', "invalid JSON")):
        root = _coco_file(tmp_path, text)
        with pytest.raises(AnnotationFileError, match=says) as e:
            convert(SourceSpec(root=root), str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))
        assert "ann.json" in str(e.value)


def test_coco_file_above_the_size_limit_refused_without_reading_it(tmp_path):
    root = tmp_path / "big"
    A.write_image(root / "a.png", 10, 12, A.rng_for(5, 0))
    with open(root / "instances_train.json", "wb") as f:
        f.truncate(2 << 30)  # a sparse 2 GB file: never read
    with pytest.raises(AnnotationFileError, match="above the limit") as e:
        convert(SourceSpec(root=str(root), layout="coco"), str(tmp_path / "out"), OutputOptions(size=SIZE),
                RunOptions(workers=1))
    assert "instances_train.json" in str(e.value)


def test_coco_keep_crowd_flag_and_overlap_rules(tmp_path):
    exp = A.make_coco(tmp_path / "src", splits=("train",), per_split=3)
    spec = SourceSpec(root=str(exp.root), annotations=AnnotationOptions(keep_crowd=True, overlap="first"))
    convert(spec, str(tmp_path / "out"), OutputOptions(size=(30, 44)), RunOptions(workers=1))
    records = {r.key: r for r in readers.open(tmp_path / "out").records("train")}
    key = next(k for k in exp.images if k.endswith("img_000_jpg.rf.0000.jpg"))
    mask = records[key].mask
    assert not (mask == A.IGNORE).any()  # crowd kept as its class
    assert set(np.unique(mask)) <= {0, 1, 2, 3}


@pytest.mark.parametrize("make, layout", [
    (lambda p: A.make_yolo(p, names_as="list"), "yolo"),
    (lambda p: A.make_yolo(p, names_as="dict", roboflow=False), "yolo"),
    (lambda p: A.make_labelme(p), "labelme"),
    (lambda p: A.make_labelme(p, labels_txt=False), "labelme"),
    (lambda p: A.make_cvat(p), "cvat"),
    (lambda p: A.make_instances(p), "instances"),
    (lambda p: A.make_instances(p, grouped=True), "instances"),
    (lambda p: A.make_rlecsv(p), "rlecsv"),
    (lambda p: A.make_rlecsv(p, class_column=False), "rlecsv"),
], ids=["yolo_roboflow_list", "yolo_ultralytics_dict", "labelme_labels_txt", "labelme_found", "cvat_xml",
        "instances", "instances_grouped", "rlecsv_classid", "rlecsv_airbus"])
def test_export_converts_bit_exact_against_its_reference(tmp_path, make, layout):
    exp = make(tmp_path / "src")
    assert detect_layout(str(exp.root)).layout.name == layout
    assert_converts(exp, tmp_path / "out")


def _scan_command(exp: A.Export, tmp_path, capsys) -> dict:
    """`imgshard scan SRC --json`: the report; its one command is then run as a user would paste it."""
    capsys.readouterr()  # what the generator printed (pycocotools)
    code = cli_main(["scan", str(exp.root), "--workers", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["verdict"]
    args = shlex.split(report["verdict"]["command"])[1:]
    args[args.index("OUT")] = str(tmp_path / "cli_out")
    args[args.index("--size") + 1] = f"{SIZE[0]}x{SIZE[1]}"
    assert cli_main(args + ["--workers", "1", "-q"]) == 0
    return report


@pytest.mark.parametrize("make", [A.make_coco, A.make_yolo, A.make_labelme, A.make_cvat, A.make_instances,
                                  A.make_rlecsv], ids=lambda f: f.__name__[5:])
def test_scan_reports_format_classes_and_its_command_converts_bit_exact(tmp_path, capsys, make):
    exp = make(tmp_path / "src")
    report = _scan_command(exp, tmp_path, capsys)
    assert report["annotations"]["format"] == make.__name__[5:]
    assert [c["name"] for c in report["classes"]] == exp.names
    expected_pixels = [sum(int((m == i).sum()) for m in exp.expected.values()) for i in range(len(exp.names))]
    assert [c["pixels"] for c in report["classes"]] == expected_pixels
    assert report["total_pairs"] == len(exp.images)
    data = readers.open(tmp_path / "cli_out")
    records = {r.key: r for split in data.splits for r in data.records(split)}
    for key, image in exp.images.items():
        np.testing.assert_array_equal(records[key].mask.astype(np.int64),
                                      A.reference(image, exp.expected[key], SIZE)[1], err_msg=key)


def test_scan_counts_overlaps_and_reader_findings(tmp_path, capsys):
    exp = A.make_coco(tmp_path / "src")
    capsys.readouterr()
    cli_main(["scan", str(exp.root), "--workers", "1", "--json"])
    ann = json.loads(capsys.readouterr().out)["annotations"]
    assert ann["overlap_pixels"] > 0 and ann["overlap_files"] > 0
    assert ann["problems"]["crowd regions (ignored)"] == 6
    assert any("placeholder" in n for n in ann["notes"])
    assert ann["ignored_pixels"] == sum(int((m == A.IGNORE).sum()) for m in exp.expected.values())
