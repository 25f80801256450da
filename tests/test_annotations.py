"""Annotation files that are not mask images (issue 27): each export converts bit-exact
against its reference implementation (`tests/_annotations.py`), cron re-converts only what
changed, hostile files get named errors."""

from __future__ import annotations

import json
import os
import shlex

import numpy as np
import pytest
from PIL import Image

import readers
from converter.cli import main as cli_main
from converter.convert import BadInputError, convert
from converter.discover.classfolders import classification_layout, detect_task
from converter.discover.annotations.base import AnnotationFileError
from converter.discover.layouts import LayoutError, detect_layout
from converter.options import (AnnotationOptions, LabelOptions, MaskSemantics, OnChange, OutputOptions, RunOptions,
                               SourceSpec, Task)
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
    (lambda p: A.make_yolo(p, names_as="classes_txt"), "yolo"),
    (lambda p: A.make_labelme(p), "labelme"),
    (lambda p: A.make_labelme(p, labels_txt=False), "labelme"),
    (lambda p: A.make_cvat(p), "cvat"),
    (lambda p: A.make_instances(p), "instances"),
    (lambda p: A.make_instances(p, grouped=True), "instances"),
    (lambda p: A.make_rlecsv(p), "rlecsv"),
    (lambda p: A.make_rlecsv(p, class_column=False), "rlecsv"),
], ids=["yolo_roboflow_list", "yolo_ultralytics_dict", "yolo_classes_txt", "labelme_labels_txt", "labelme_found", "cvat_xml",
        "instances", "instances_grouped", "rlecsv_classid", "rlecsv_airbus"])
def test_export_converts_bit_exact_against_its_reference(tmp_path, make, layout):
    """cvat_xml: written as CVAT's ``dump_as_cvat_annotation`` (formats/cvat.py) writes it, expected by CVAT's
    own "Segmentation mask" export rule (formats/mask.py ``_export``; `_annotations.cvat_reference`)."""
    exp = make(tmp_path / "src")
    assert detect_layout(str(exp.root)).layout.name == layout
    assert_converts(exp, tmp_path / "out")


def _scan_command(exp: A.Export, tmp_path, capsys, expect: int = 0) -> dict:
    """`imgshard scan SRC --json`: the report; its one command is then run as a user would paste it."""
    capsys.readouterr()  # what the generator printed (pycocotools)
    code = cli_main(["scan", str(exp.root), "--workers", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == expect, report["verdict"]
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


def test_yolo_detection_boxes_refused_by_name_never_taken_for_masks(tmp_path):
    root = tmp_path / "boxes"
    for i in range(2):
        A.write_image(root / "train" / "images" / f"a{i}.jpg", 20, 20, A.rng_for(7, i))
        (root / "train" / "labels").mkdir(parents=True, exist_ok=True)
        (root / "train" / "labels" / f"a{i}.txt").write_text("0 0.5 0.5 0.2 0.3\n1 0.1 0.2 0.05 0.05\n")
    with pytest.raises(AnnotationFileError, match="detection labels") as e:
        convert(SourceSpec(root=str(root)), str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))
    assert "labels" in str(e.value) and "segmentation" in str(e.value)


def test_labelme_invalid_json_named_with_its_file(tmp_path):
    exp = A.make_labelme(tmp_path / "src")
    (exp.root / "IMG_0002.json").write_text('{"shapes": [{"label": "road", "points": [[1, 2], [3, ')
    with pytest.raises(AnnotationFileError, match="invalid JSON") as e:
        convert(SourceSpec(root=str(exp.root)), str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))
    assert "IMG_0002.json" in str(e.value)


def test_cvat_mask_rle_past_its_box_and_unknown_label_named(tmp_path):
    exp = A.make_cvat(tmp_path / "src")
    xml = (exp.root / "annotations.xml").read_text()
    bad = xml.replace('<tag label="sky"', '<mask label="sky" rle="5, 9000" left="0" top="0" width="4" height="4" '
                      'z_order="0"></mask><tag label="sky"', 1)
    (exp.root / "annotations.xml").write_text(bad)
    with pytest.raises(AnnotationFileError, match="past its 4x4 box") as e:
        convert(SourceSpec(root=str(exp.root)), str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))
    assert "annotations.xml" in str(e.value) and "image id 0" in str(e.value)
    (exp.root / "annotations.xml").write_text(xml.replace('label="house"', 'label="castle"', 1))
    with pytest.raises(AnnotationFileError, match="'castle'"):
        convert(SourceSpec(root=str(exp.root)), str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))


@pytest.mark.parametrize("runs", ["1 99999", "1 99999999999999999999999", "5 x"])
def test_rle_csv_runs_past_the_image_are_a_bad_input_naming_csv_and_row(tmp_path, runs):
    exp = A.make_rlecsv(tmp_path / "src")
    text = (exp.root / "train.csv").read_text().splitlines()
    name = text[1].split(",")[0]
    text.insert(2, f"{name},2,{runs}")
    (exp.root / "train.csv").write_text("\n".join(text) + "\n")
    with pytest.raises(BadInputError) as e:
        convert(SourceSpec(root=str(exp.root)), str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))
    assert "train.csv" in str(e.value) and "row 3" in str(e.value)
    assert ("past" if runs == "1 99999" else "not integers") in str(e.value)


def test_labelme_cron_reconverts_only_the_image_whose_shape_changed(tmp_path):
    exp = A.make_labelme(tmp_path / "src")
    out = tmp_path / "out"
    convert(SourceSpec(root=str(exp.root)), str(out), OutputOptions(size=SIZE), RunOptions(workers=1))
    path = exp.root / "IMG_0001.json"
    doc = json.loads(path.read_text())
    doc["shapes"][0]["points"][0] = [1.0, 1.0]
    path.write_text(json.dumps(doc))
    (exp.root / "IMG_0003.json").write_text(json.dumps(json.loads((exp.root / "IMG_0003.json").read_text()), indent=4))
    again = convert(SourceSpec(root=str(exp.root)), str(out), OutputOptions(size=SIZE),
                    RunOptions(workers=1, on_change=OnChange.REPLACE))
    assert (again.plan.new, again.plan.replaced, again.plan.unchanged) == (0, 1, 3)


def test_cvat_coco_export_crowd_masks_kept_with_flag_and_scan_hints_it(tmp_path, capsys):
    """CVAT's COCO 1.0 export (formats/coco.py ``_export``: datumaro ``coco_instances``, its
    ``find_instance_parts`` in guess mode and ``convert_instance``): a mask is an uncompressed RLE
    (``counts`` a list, column-major from background) with ``iscrowd: 1``; images in ``images/<subset>/``."""
    from pycocotools import mask as mu

    root = tmp_path / "cvat_coco"
    h, w = 24, 30
    A.write_image(root / "images" / "default" / "f0.png", h, w, A.rng_for(9, 0))
    blob = A._blob(A.rng_for(9, 1), h, w)
    doc = {"licenses": [{"name": "", "id": 0, "url": ""}], "info": {"contributor": "", "description": ""},
           "categories": [{"id": 1, "name": "cell", "supercategory": ""}],
           "images": [{"id": 1, "width": w, "height": h, "file_name": "f0.png", "license": 0}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 1, "area": 1.0, "bbox": [0, 0, 1, 1],
                            "segmentation": {"size": [h, w], "counts": A.coco_counts(blob.flatten(order="F"))}},
                           {"id": 2, "image_id": 1, "category_id": 1, "iscrowd": 0, "area": 20.0,  # a box alone
                            "bbox": [2.0, 3.0, 5.0, 4.0], "segmentation": []}]}
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "instances_default.json").write_text(json.dumps(doc))
    capsys.readouterr()
    cli_main(["scan", str(root), "--workers", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    verdict = report["verdict"]
    assert any("--keep-crowd" in h for h in verdict["hints"])
    assert "boxes only" in json.dumps(report)  # CVAT writes a box alone as segmentation: [] (nothing drawn)
    spec = SourceSpec(root=str(root), annotations=AnnotationOptions(keep_crowd=True))
    convert(spec, str(tmp_path / "out"), OutputOptions(size=(h, w)), RunOptions(workers=1))
    record = next(readers.open(tmp_path / "out").records("train"))
    np.testing.assert_array_equal(record.mask, mu.decode(mu.frPyObjects(doc["annotations"][0]["segmentation"], h, w)))


def test_images_beside_annotation_files_and_one_class_folders_are_never_classification(tmp_path):
    exp = A.make_rlecsv(tmp_path / "airbus", class_column=False)
    assert detect_task(SourceSpec(root=str(exp.root))) is Task.SEGMENTATION
    cvat = A.make_cvat(tmp_path / "cvat")
    assert classification_layout(str(cvat.root)) is None
    one = tmp_path / "one"
    for i in range(3):
        A.write_image(one / "cats" / f"{i}.png", 10, 10, A.rng_for(3, i))
        A.write_image(one / "train" / "cats" / f"{i}.png", 10, 10, A.rng_for(4, i))
    assert classification_layout(str(one)) is None
    assert classification_layout(str(one / "train")) is None


def test_preview_draws_rasterized_annotations(tmp_path):
    from converter.inspect.preview import PreviewOptions, source_samples

    exp = A.make_cvat(tmp_path / "src")
    _, shown = source_samples(SourceSpec(root=str(exp.root)), PreviewOptions(n=4), 1 << 24)
    assert len(shown) == 4
    for p in shown:
        np.testing.assert_array_equal(p.class_map, exp.expected[p.key], err_msg=p.key)
    out = tmp_path / "sheet.png"
    assert cli_main(["preview", str(exp.root), "-o", str(out), "-n", "2"]) == 0


def test_image_listed_twice_is_a_named_error(tmp_path):
    anns = [{"id": 1, "image_id": 1, "category_id": 1, "segmentation": [[0, 0, 5, 0, 5, 5]]}]
    images = [{"id": 1, "file_name": "a.png", "height": 10, "width": 12},
              {"id": 2, "file_name": "a.png", "height": 10, "width": 12}]
    root = _coco_file(tmp_path, anns, images=images)
    with pytest.raises(AnnotationFileError, match="listed twice") as e:
        convert(SourceSpec(root=root), str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))
    assert "ann.json#1" in str(e.value) and "ann.json#2" in str(e.value)


def test_scan_reports_polygons_outside_and_with_too_few_points(tmp_path, capsys):
    anns = [{"id": 1, "image_id": 1, "category_id": 1, "segmentation": [[-3, 0, 5, 0, 5, 5]]},
            {"id": 2, "image_id": 1, "category_id": 1, "segmentation": [[1, 1, 4, 4]]},
            {"id": 3, "image_id": 1, "category_id": 1, "segmentation": [[0, 0, 12, 0, 12, 10]]}]
    root = _coco_file(tmp_path, anns)
    cli_main(["scan", root, "--workers", "1", "--json"])
    problems = json.loads(capsys.readouterr().out)["annotations"]["problems"]
    assert problems == {"polygons reaching outside the image (clipped)": 1,
                        "polygons with fewer than 3 points (dropped)": 1}


def test_shards_are_byte_identical_whatever_the_worker_count(tmp_path):
    exp = A.make_labelme(tmp_path / "src")
    for workers in (1, 2):
        convert(SourceSpec(root=str(exp.root)), str(tmp_path / f"w{workers}"), OutputOptions(size=SIZE),
                RunOptions(workers=workers))
    shards = sorted(p.name for p in (tmp_path / "w1").iterdir() if p.suffix in (".tfrecord", ".npz"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "w2").iterdir()
                                       if p.suffix in (".tfrecord", ".npz"))
    for name in shards:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), name


def test_unet_split_folders_with_images_and_masks_are_not_instance_folders(tmp_path):
    root = tmp_path / "unet"
    for split in ("train", "val"):
        for i in range(3):
            A.write_image(root / split / "images" / f"{i}.png", 10, 10, A.rng_for(6, i))
            A.write_image(root / split / "masks" / f"{i}.png", 10, 10, A.rng_for(8, i))
    assert detect_layout(str(root)).layout.name == "unet"


def test_coco_reexport_that_renumbers_ids_and_reorders_images_changes_nothing(tmp_path):
    exp = A.make_coco(tmp_path / "src", splits=("train",), per_split=4)
    out = tmp_path / "out"
    convert(SourceSpec(root=str(exp.root)), str(out), OutputOptions(size=SIZE), RunOptions(workers=1))
    path = exp.root / "train" / "_annotations.coco.json"
    doc = json.loads(path.read_text())
    new_id = {im["id"]: 1000 + k for k, im in enumerate(doc["images"])}
    for k, a in enumerate(doc["annotations"]):
        a["id"], a["image_id"] = 5000 + k, new_id[a["image_id"]]
    for im in doc["images"]:
        im["id"] = new_id[im["id"]]
    doc["images"].reverse()
    path.write_text(json.dumps(doc, indent=2))
    again = convert(SourceSpec(root=str(exp.root)), str(out), OutputOptions(size=SIZE),
                    RunOptions(workers=1, on_change=OnChange.REPLACE))
    assert again.plan.nothing_to_do and again.plan.unchanged == 4


def test_dsb_labels_csv_and_instance_folders_agree_and_both_are_offered(tmp_path):
    exp = A.make_instances(tmp_path / "dsb")
    rows = ["ImageId,EncodedPixels"]
    for key, image in exp.images.items():
        ident = key.split("/")[1]
        for m in sorted((image.parent.parent / "masks").glob("*.png")):
            rows.append(f"{ident},{A.kaggle_rle(np.asarray(Image.open(m)) > 0)}")
    (exp.root / "stage1_train_labels.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(LayoutError, match="--layout instances") as e:
        detect_layout(str(exp.root))
    assert "--layout rlecsv" in str(e.value)
    masks = {}
    for layout in ("instances", "rlecsv"):
        convert(SourceSpec(root=str(exp.root), layout=layout), str(tmp_path / layout), OutputOptions(size=SIZE),
                RunOptions(workers=1))
        masks[layout] = {r.key.split("/")[-1].split(".")[0]: r.mask for r in readers.open(tmp_path / layout).records("train")}
    assert masks["instances"].keys() == masks["rlecsv"].keys() and len(masks["rlecsv"]) == 3
    for key, image in exp.images.items():
        ident = key.split("/")[1]
        ref = A.reference(image, exp.expected[key], SIZE)[1]
        np.testing.assert_array_equal(masks["rlecsv"][ident], ref)
        np.testing.assert_array_equal(masks["instances"][ident], ref)


@pytest.mark.parametrize("rule", ["tool", "first", "ignore"])
def test_overlap_rules_on_two_overlapping_shapes(tmp_path, rule):
    root = tmp_path / "lm"
    h, w = 30, 40
    A.write_image(root / "a.png", h, w, A.rng_for(11, 0))
    a = [[2.0, 3.0], [30.0, 4.0], [25.0, 26.0], [4.0, 22.0]]
    b = [[15.0, 10.0], [38.0, 12.0], [36.0, 29.0], [14.0, 27.0]]
    c = [[16.0, 12.0], [20.0, 12.0], [20.0, 16.0], [16.0, 16.0]]  # inside b, same class: no clash
    shapes = [{"label": "x", "points": a, "shape_type": "polygon"}, {"label": "y", "points": b, "shape_type": "polygon"},
              {"label": "y", "points": c, "shape_type": "polygon"}]
    (root / "a.json").write_text(json.dumps({"shapes": shapes, "imagePath": "a.png", "imageHeight": h,
                                             "imageWidth": w}))
    ma, mb, mc = (A.labelme_shape_to_mask((h, w), p, "polygon") for p in (a, b, c))
    expected = np.zeros((h, w), np.int64)
    if rule == "tool":
        expected[ma], expected[mb | mc] = 1, 2
    elif rule == "first":
        expected[mb | mc], expected[ma] = 2, 1
    else:
        expected[ma], expected[mb | mc] = 1, 2
        expected[ma & (mb | mc)] = A.IGNORE
    assert (ma & mb).any() and (mb & mc).any()
    spec = SourceSpec(root=str(root), annotations=AnnotationOptions(overlap=rule))
    convert(spec, str(tmp_path / "out"), OutputOptions(size=(h, w)), RunOptions(workers=1))
    np.testing.assert_array_equal(next(readers.open(tmp_path / "out").records("train")).mask, expected)


@pytest.mark.parametrize("make", [A.make_coco, A.make_yolo, A.make_labelme], ids=["coco", "yolo", "labelme"])
def test_write_spec_pins_format_and_annotation_files_and_its_command_converts(tmp_path, capsys, make):
    exp = make(tmp_path / "src")
    spec_path = tmp_path / "source.json"
    capsys.readouterr()
    assert cli_main(["scan", str(exp.root), "--workers", "1", "--write-spec", str(spec_path), "-q"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    doc = json.loads(spec_path.read_text())
    pairs = [p for items in doc["splits"].values() for p in items]
    assert pairs and all(p["format"] == make.__name__[5:] and "annotations" in p for p in pairs)
    args = shlex.split(line[line.index("imgshard convert"):])[1:]
    args[args.index("OUT")] = str(tmp_path / "out")
    args[args.index("--size") + 1] = f"{SIZE[0]}x{SIZE[1]}"
    assert cli_main(args + ["--workers", "1", "-q"]) == 0
    data = readers.open(tmp_path / "out")
    assert data.splits == exp.splits()
    records = {r.key: r for split in data.splits for r in data.records(split)}
    for key, image in exp.images.items():
        np.testing.assert_array_equal(records[key].mask.astype(np.int64),
                                      A.reference(image, exp.expected[key], SIZE)[1], err_msg=key)
    if make is A.make_coco:  # a new split's annotation file appears: the spec does not look at it
        A.make_coco(tmp_path / "src", splits=("test",), per_split=2)
        assert cli_main(args + ["--workers", "1", "-q"]) == 0
        assert readers.open(tmp_path / "out").splits == exp.splits()


def test_exif_rotated_photo_is_oriented_as_the_annotation_tool_showed_it(tmp_path):
    """labelme (like CVAT, Ultralytics and Roboflow) annotates the photo as shown: EXIF orientation applied."""
    from PIL import ImageOps

    root = tmp_path / "lm"
    root.mkdir()
    stored = Image.fromarray(A.synth.textured_image(24, 40, A.rng_for(12, 0)))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 clockwise to show: the shown photo is 24 wide, 40 high
    stored.save(root / "phone.jpg", exif=exif, quality=95)
    shown = ImageOps.exif_transpose(Image.open(root / "phone.jpg"))
    w, h = shown.size
    assert (w, h) == (24, 40)
    pts = [[2.0, 3.0], [20.0, 5.0], [18.0, 36.0], [3.0, 30.0]]
    (root / "phone.json").write_text(json.dumps({"shapes": [{"label": "x", "points": pts, "shape_type": "polygon"}],
                                                 "imagePath": "phone.jpg", "imageHeight": h, "imageWidth": w}))
    convert(SourceSpec(root=str(root)), str(tmp_path / "out"), OutputOptions(size=(20, 12)), RunOptions(workers=1))
    record = next(readers.open(tmp_path / "out").records("train"))
    expected = A.labelme_shape_to_mask((h, w), pts, "polygon").astype(np.int64)
    ref_mask = np.asarray(Image.fromarray(expected.astype(np.int32), "I").resize((12, 20), Image.Resampling.NEAREST))
    np.testing.assert_array_equal(record.mask, ref_mask)
    ref_image = np.asarray(shown.convert("RGB").resize((12, 20), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(record.image, ref_image)


@pytest.mark.parametrize("make", [A.make_coco, A.make_labelme, A.make_yolo, A.make_cvat, A.make_instances,
                                  A.make_rlecsv], ids=lambda f: f.__name__[5:])
def test_annotation_sources_in_a_bucket_convert_as_the_local_folder(tmp_path, s3_bucket, make):
    from readers.storage import open_store

    exp = make(tmp_path / "src")
    url = f"{s3_bucket}/raw"
    store = open_store(url)
    for path in sorted(exp.root.rglob("*")):
        if path.is_file():
            store.put(path.relative_to(exp.root).as_posix(), path.read_bytes())
    convert(SourceSpec(root=url), str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))
    data = readers.open(tmp_path / "out")
    assert data.splits == exp.splits()
    records = {r.key: r for split in data.splits for r in data.records(split)}
    for key, image in exp.images.items():
        ref_image, ref_mask = A.reference(image, exp.expected[key], SIZE)
        np.testing.assert_array_equal(records[key].image, ref_image, err_msg=key)
        np.testing.assert_array_equal(records[key].mask.astype(np.int64), ref_mask, err_msg=key)


def test_cvat_xml_entity_bomb_and_broken_xml_are_named(tmp_path):
    exp = A.make_cvat(tmp_path / "src")
    lol = "".join(f'<!ENTITY l{i} "{"&l%d;" % (i - 1) * 10}">' for i in range(1, 10))
    bomb = f'<?xml version="1.0"?><!DOCTYPE annotations [<!ENTITY l0 "lol">{lol}]><annotations><version>1.1' \
           '</version><image id="0" name="frame_000000.png" width="40" height="30"><tag label="&l9;"/></image>' \
           '</annotations>'
    for text, says in ((bomb, "amplification"), ("<annotations><version>1.1</version><image id='0'", "invalid XML")):
        (exp.root / "annotations.xml").write_text(text)
        with pytest.raises(AnnotationFileError, match=says) as e:
            convert(SourceSpec(root=str(exp.root)), str(tmp_path / "out"), OutputOptions(size=SIZE),
                    RunOptions(workers=1))
        assert "annotations.xml" in str(e.value)


def test_labelme_mask_shape_placed_over_its_box(tmp_path):
    """labelme >= 5.3 `mask` shapes: points [[xmin, ymin], [xmax, ymax]], `mask` = base64 PNG of
    mask[ymin:ymax + 1, xmin:xmax + 1] (labelme's utils.img_arr_to_b64)."""
    import base64
    import io

    root = tmp_path / "lm"
    h, w = 30, 36
    A.write_image(root / "a.png", h, w, A.rng_for(13, 0))
    full = A._blob(A.rng_for(13, 1), h, w).astype(bool)
    ys, xs = np.nonzero(full)
    xmin, ymin, xmax, ymax = int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())
    buf = io.BytesIO()
    Image.fromarray(full[ymin:ymax + 1, xmin:xmax + 1]).save(buf, format="PNG")
    shapes = [{"label": "x", "points": [[0, 0], [35, 0], [35, 5]], "shape_type": "polygon"},
              {"label": "y", "points": [[xmin, ymin], [xmax, ymax]], "shape_type": "mask",
               "mask": base64.b64encode(buf.getvalue()).decode("ascii")}]
    (root / "a.json").write_text(json.dumps({"shapes": shapes, "imagePath": "a.png", "imageHeight": h,
                                             "imageWidth": w}))
    expected = np.zeros((h, w), np.int64)
    expected[A.labelme_shape_to_mask((h, w), shapes[0]["points"], "polygon")] = 1
    expected[full] = 2
    convert(SourceSpec(root=str(root)), str(tmp_path / "out"), OutputOptions(size=(h, w)), RunOptions(workers=1))
    np.testing.assert_array_equal(next(readers.open(tmp_path / "out").records("train")).mask, expected)


def test_rle_csv_severstal_v1_imageid_classid_column(tmp_path):
    exp = A.make_rlecsv(tmp_path / "src")
    rows = (exp.root / "train.csv").read_text().splitlines()
    out = ["ImageId_ClassId,EncodedPixels"]
    for row in rows[1:]:
        name, cls, runs = row.split(",")
        out += [f"{name}_{c},{runs if str(c) == cls else ''}" for c in (1, 2, 3, 4)]  # every class listed
    (exp.root / "train.csv").write_text("\n".join(out) + "\n")
    assert_converts(exp, tmp_path / "out")


def test_coco_without_image_sizes_takes_the_image_size(tmp_path):
    exp = A.make_coco(tmp_path / "src", splits=("train",))
    path = exp.root / "train" / "_annotations.coco.json"
    doc = json.loads(path.read_text())
    for im in doc["images"]:
        del im["height"], im["width"]
    path.write_text(json.dumps(doc))
    assert_converts(exp, tmp_path / "out")


def test_spec_annotation_options_are_followed_a_flag_adds_one_and_never_contradicts_one(tmp_path, capsys):
    exp = A.make_coco(tmp_path / "src", splits=("train",), per_split=3)
    spec_path = tmp_path / "source.json"
    capsys.readouterr()
    assert cli_main(["scan", str(exp.root), "--workers", "1", "--write-spec", str(spec_path), "-q", "--keep-crowd"]) == 0
    assert json.loads(spec_path.read_text())["annotation_options"] == {"keep_crowd": True}
    base = ["convert", "--spec", str(spec_path), "--size", "30x44", "--workers", "1", "-q"]
    assert cli_main(base[:3] + [str(tmp_path / "a")] + base[3:]) == 0
    assert cli_main(base[:3] + [str(tmp_path / "b")] + base[3:] + ["--overlap", "ignore"]) == 0
    key = next(k for k in exp.images if "img_000" in k)
    a = {r.key: r.mask for r in readers.open(tmp_path / "a").records("train")}[key]
    b = {r.key: r.mask for r in readers.open(tmp_path / "b").records("train")}[key]
    assert not (a == A.IGNORE).any()  # crowd kept, as the spec says
    assert (b == A.IGNORE).any() and not np.array_equal(a, b)  # --overlap ignore given: overlaps ignored
    assert cli_main(base[:3] + [str(tmp_path / "c")] + base[3:] + ["--keep-crowd"]) == 0  # the spec's own value
    capsys.readouterr()
    assert cli_main(base[:3] + [str(tmp_path / "d")] + base[3:] + ["--no-keep-crowd"]) != 0
    err = capsys.readouterr().err
    for text in (str(spec_path), "keep_crowd: True", "Drop the flag", "Received: --no-keep-crowd"):
        assert text in err, err
    assert not (tmp_path / "d" / "imgshard.json").exists()


def test_rle_csv_along_the_rows_found_by_scan_and_written_to_the_spec(tmp_path, capsys):
    exp = A.make_rlecsv(tmp_path / "src")
    rows = (exp.root / "train.csv").read_text().splitlines()
    out = [rows[0]]
    for row in rows[1:]:
        name, cls, runs = row.split(",")
        if runs:
            h, w = np.asarray(Image.open(exp.images[f"train/{name}"])).shape[:2]
            runs = A.kaggle_rle(A.decode_kaggle_rle(runs, h, w).T.copy())  # the same shape, runs along the rows
        out.append(f"{name},{cls},{runs}")
    (exp.root / "train.csv").write_text("\n".join(out) + "\n")
    report = _scan_command(exp, tmp_path, capsys, expect=65)  # exit 65: convert needs the flag it names
    assert "--rle-order rows" in report["verdict"]["command"]
    records = {r.key: r for r in readers.open(tmp_path / "cli_out").records("train")}
    for key, image in exp.images.items():
        np.testing.assert_array_equal(records[key].mask.astype(np.int64),
                                      A.reference(image, exp.expected[key], SIZE)[1], err_msg=key)
    spec_path = tmp_path / "source.json"
    cli_main(["scan", str(exp.root), "--workers", "1", "--write-spec", str(spec_path), "-q"])
    assert json.loads(spec_path.read_text())["annotation_options"] == {"rle_order": "rows"}


# -- an annotation file beside mask images of the same images: two readings (issue 27 follow-up) ----------

def _scan_json(root, capsys) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = cli_main(["scan", str(root), "--workers", "1", "--json"])
    said = capsys.readouterr()
    return code, json.loads(said.out), said.err


def test_tgs_csv_beside_mask_images_that_agree_reads_the_masks_and_says_so(tmp_path, capsys):
    exp = A.make_tgs_like(tmp_path / "tgs")
    _, report, _ = _scan_json(exp.root, capsys)  # 65: the masks need --mask-semantics binary, in its command
    assert report["verdict"]["command"], report["verdict"]
    text = json.dumps(report)
    assert "train.csv" in text and "train/masks" in text and "agrees" in text and "0 of " in text
    args = shlex.split(report["verdict"]["command"])[1:]
    args[args.index("OUT")] = str(tmp_path / "out")
    args[args.index("--size") + 1] = f"{SIZE[0]}x{SIZE[1]}"
    assert cli_main(args + ["--workers", "1", "-q"]) == 0
    records = {r.key: r for r in readers.open(tmp_path / "out").records("train")}
    assert set(records) == set(exp.images)
    for key, image in exp.images.items():
        _, ref_mask = A.reference(image, exp.expected[key], SIZE)
        np.testing.assert_array_equal(records[key].mask.astype(np.int64), ref_mask, err_msg=key)


def test_tgs_csv_beside_mask_images_that_disagree_refuses_and_each_flag_picks_a_reading(tmp_path, capsys):
    from converter.discover.annotations.ambiguity import ReadingsDisagree

    exp = A.make_tgs_like(tmp_path / "tgs", disagree=True)
    with pytest.raises(ReadingsDisagree) as e:
        convert(SourceSpec(root=str(exp.root)), str(tmp_path / "no"), OutputOptions(size=SIZE), RunOptions(workers=1))
    for text in ("--layout rlecsv", "--layout unet", "train.csv", "train/masks", "pixels differ", "Received:"):
        assert text in str(e.value), str(e.value)
    assert not (tmp_path / "no" / "imgshard.json").exists()
    code, report, err = _scan_json(exp.root, capsys)
    assert code == 65 and report["verdict"]["command"] is None and "--layout rlecsv" in err
    for layout in ("unet", "rlecsv"):  # each flag reads its own files, without comparing
        out = tmp_path / layout
        labels = LabelOptions(semantics=MaskSemantics.BINARY) if layout == "unet" else None
        convert(SourceSpec(root=str(exp.root), layout=layout), str(out), OutputOptions(size=(40, 40), labels=labels),
                RunOptions(workers=1))
        for r in readers.open(out).records("train"):
            mask = exp.expected["train/" + r.key.split("/")[-1]].astype(bool)  # keys differ by reading
            want = np.roll(mask, 5, axis=1) if layout == "rlecsv" else mask
            np.testing.assert_array_equal(r.mask > 0, want, err_msg=f"{layout} {r.key}")


@pytest.mark.parametrize("disagree", [False, True], ids=["same_classes", "categories_in_other_order"])
def test_coco_json_beside_voc_segmentation_class(tmp_path, capsys, disagree):
    from converter.discover.annotations.ambiguity import ReadingsDisagree

    exp = A.make_coco_beside_voc(tmp_path / "voc", disagree=disagree)
    spec = SourceSpec(root=str(exp.root))
    if not disagree:
        convert(spec, str(tmp_path / "out"), OutputOptions(size=(30, 36)), RunOptions(workers=1))
        for r in readers.open(tmp_path / "out").records("train"):
            keep = np.asarray(Image.open(exp.root / "SegmentationClass" / (r.key.split("/")[-1][:-4] + ".png"))) != 255
            want = exp.expected["train/" + r.key.split("/")[-1]]
            np.testing.assert_array_equal(r.mask[keep], want[keep], err_msg=r.key)
        return
    with pytest.raises(ReadingsDisagree, match="--layout coco") as e:
        convert(spec, str(tmp_path / "no"), OutputOptions(size=(30, 36)), RunOptions(workers=1))
    assert "--layout voc" in str(e.value) and "instances_train.json" in str(e.value)
    code, report, _ = _scan_json(exp.root, capsys)
    assert code == 65 and report["verdict"]["command"] is None
    swapped = {k: np.where(v > 0, 3 - v, 0) for k, v in exp.expected.items()}  # the COCO file's own classes
    convert(SourceSpec(root=str(exp.root), layout="coco"), str(tmp_path / "coco"), OutputOptions(size=(30, 36)),
            RunOptions(workers=1))
    for r in readers.open(tmp_path / "coco").records("train"):
        np.testing.assert_array_equal(r.mask.astype(np.int64), swapped["train/" + r.key.split("/")[-1]],
                                      err_msg=r.key)


def test_classes_file_in_another_order_than_the_drawn_classes_is_refused_by_convert_and_scan(tmp_path, capsys):
    """--classes over annotation files renames by row; in another order than the annotations' own
    classes, every pixel would be named wrongly (silently, before): a named error in convert and scan."""
    exp = A.make_labelme(tmp_path / "src")  # labels.txt: _background_, person, bike, road
    reordered = tmp_path / "names.txt"
    reordered.write_text("_background_\nroad\nperson\nbike\n")
    for command in (["convert", str(exp.root), str(tmp_path / "out"), "--size", "20x26"], ["scan", str(exp.root)]):
        assert cli_main([*command, "--classes", str(reordered)]) != 0
        err = capsys.readouterr().err
        assert "--classes" in err and "another order" in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "imgshard.json").exists()
    same = tmp_path / "same.txt"
    same.write_text((exp.root / "labels.txt").read_text())
    data = assert_converts(exp, tmp_path / "out2", SourceSpec(root=str(exp.root), classes=str(same)))
    assert [n for n, _ in data.classes] == exp.names


def test_classes_file_names_placeholder_classes_of_annotation_files(tmp_path):
    """An RLE CSV without a class column draws background + foreground: --classes names them, row by row."""
    exp = A.make_rlecsv(tmp_path / "src", class_column=False)
    names = tmp_path / "names.txt"
    names.write_text("background\nship\n")
    convert(SourceSpec(root=str(exp.root), classes=str(names)), str(tmp_path / "out"), OutputOptions(size=SIZE),
            RunOptions(workers=1))
    assert [n for n, _ in readers.open(tmp_path / "out").classes] == ["background", "ship"]


def test_detection_peek_at_an_object_is_one_ranged_read_never_the_whole_object(monkeypatch):
    """head_bytes (CVAT / LabelMe / RLE CSV detection) of a bucket object: a ranged GET of the
    head, not a GET of the whole object (an XML of any size in a bucket was read whole)."""
    import converter.discover.files as files
    from converter.discover.annotations import base

    class Bucket:
        def read(self, path):
            raise AssertionError("the whole object was read")

        def head(self, path, size):
            return (b"<annotations>" + b"x" * 10_000)[:size]

    monkeypatch.setattr(files, "files_for", lambda path: Bucket())
    monkeypatch.setattr(base, "files_for", lambda path: Bucket(), raising=False)
    assert base.head_bytes("s3://bucket/big.xml", 16) == b"<annotations>xxx"


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares `width` x `height` (1-bit grey) with one tiny IDAT: cheap to write."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [12_000, 20_000])  # a warning-sized box; a DecompressionBombError-sized one
def test_labelme_mask_shape_larger_than_its_image_refused_by_name_before_decoding(side):
    """A LabelMe ``mask`` shape is a crop of its image: a box PNG larger than the image is a
    damaged / hostile file, named before decoding (was decoded whole, or escaped as
    PIL's DecompressionBombError instead of a DecodeError)."""
    import base64

    from converter.discover.annotations.labelme import embedded_mask
    from converter.transform.decode import DecodeError

    b64 = base64.b64encode(_png_header(side, side)).decode("ascii")
    with pytest.raises(DecodeError, match="larger than its image|more pixels than Pillow"):
        embedded_mask(b64, [0.0, 0.0], 10, 12, "a.json#shape 0")


@pytest.mark.parametrize("damage", ["fifo", "folder", "truncated_early", "truncated_late"])
def test_coco_split_file_that_cannot_be_read_is_named_never_passed_over(tmp_path, capsys, damage):
    """A split's ``_annotations.coco.json`` that is a FIFO, a folder or cut short: scan and convert name the
    file and why, never convert the other split alone with exit 0."""
    exp = A.make_coco(tmp_path / "src")
    path = exp.root / "valid" / "_annotations.coco.json"
    text = path.read_text()
    path.unlink()
    if damage == "fifo":
        os.mkfifo(path)
    elif damage == "folder":
        path.mkdir()
    else:  # cut before the 'annotations' key (nothing says COCO but its name and first bytes), or inside it
        path.write_text(text[:40] if damage == "truncated_early" else text[: len(text) * 3 // 4])
    says = "not a regular file" if damage in ("fifo", "folder") else "invalid JSON"
    capsys.readouterr()
    assert cli_main(["scan", str(exp.root), "--workers", "1"]) == 65
    err = capsys.readouterr().err
    assert says in err and "valid/_annotations.coco.json" in err
    assert cli_main(["convert", str(exp.root), str(tmp_path / "out"), "--size", "20x26", "--workers", "1", "-q"]) == 65
    err = capsys.readouterr().err
    assert says in err and "valid/_annotations.coco.json" in err
    assert not (tmp_path / "out" / "imgshard.json").exists()


@pytest.mark.parametrize("name, folder", [("instances_val.json", "annotations"), ("data.json", ".")])
def test_coco_file_meant_by_its_folder_name_or_first_bytes_cut_short_is_named(tmp_path, name, folder):
    exp = A.make_coco(tmp_path / "src", splits=("train",))
    doc = json.loads((exp.root / "train" / "_annotations.coco.json").read_text())
    (exp.root / folder).mkdir(exist_ok=True)
    (exp.root / folder / name).write_text(json.dumps({"info": {}, "images": doc["images"]})[:-30])
    with pytest.raises(AnnotationFileError, match="invalid JSON") as e:
        convert(SourceSpec(root=str(exp.root)), str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))
    assert name in str(e.value)


def test_stray_json_files_are_passed_over_and_listed_by_scan(tmp_path, capsys):
    exp = A.make_coco(tmp_path / "src")
    (exp.root / "config.json").write_text(json.dumps({"epochs": 10, "images": "train"}))
    (exp.root / "broken_notes.json").write_text('{"epochs": 1')  # not COCO by name, folder or first bytes
    os.mkfifo(exp.root / "pipe.json")
    capsys.readouterr()
    assert cli_main(["scan", str(exp.root), "--workers", "1", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["annotations"]["notes"]
    passed = sorted(n.split(" (")[0] for n in notes if n.startswith("passed over"))
    assert passed == ["passed over broken_notes.json", "passed over config.json", "passed over pipe.json",
                      "passed over train/notes.json", "passed over valid/notes.json"]
    assert_converts(exp, tmp_path / "out")


def test_scan_of_mask_images_lists_the_json_files_it_passed_over(tmp_path, capsys):
    from converter.testing import synth

    ds = synth.make_camvid(tmp_path / "src", splits={"train": 2}, size=(16, 16))
    root = tmp_path / "src"
    (root / "config.json").write_text(json.dumps({"images": 2, "lr": 0.1}))
    capsys.readouterr()
    assert cli_main(["scan", str(root), "--workers", "1", "--json"]) == 0, ds
    report = json.loads(capsys.readouterr().out)
    assert report["passed_over"] == ["config.json (JSON without COCO's 'images', 'annotations' and 'categories')"]
    assert cli_main(["scan", str(root), "--workers", "1"]) == 0
    assert "Passed over: config.json (JSON without COCO's" in capsys.readouterr().out


def test_instance_mask_of_another_size_is_named_before_decoding(tmp_path):
    """An instance mask (``<id>/masks/*.png``) whose header declares another size than its
    image is a size_mismatch named from the header: never decoded whole first."""
    from converter.discover.annotations.instances import InstanceMasks
    from converter.transform.decode import DecodeError

    (tmp_path / "s1" / "masks").mkdir(parents=True)
    (tmp_path / "s1" / "masks" / "m0.png").write_bytes(_png_header(12_000, 12_000))
    doc = {"shapes": [{"v": 1, "file": "m0.png"}]}
    with pytest.raises(DecodeError) as e:
        list(InstanceMasks().shapes(doc, 10, 12, str(tmp_path / "s1")))
    assert e.value.kind == "size_mismatch" and "12000x12000" in str(e.value)
