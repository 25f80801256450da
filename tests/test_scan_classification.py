"""`imgshard scan` on class-folder (classification) sources: counts, bad inputs, EXIF, duplicates, verdict."""

from __future__ import annotations

import io
import json
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import readers
from converter.testing import synth
from converter.cli import main as cli_main
from converter.convert import BadInputError, convert
from converter.discover.classfolders import discover_classification
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.inspect.scan import ScanOptions, format_report, scan
from converter.inspect.scan_classification import ClassScanReport, exif_info

REPO = Path(__file__).resolve().parents[1]


def _scan(root, **kw) -> ClassScanReport:
    r = scan(SourceSpec(root=str(root)), ScanOptions(workers=1, **kw))
    assert isinstance(r, ClassScanReport)
    return r


def _run_verdict_command(r: ClassScanReport, out: Path) -> int:
    """Run the verdict's `imgshard convert ...` command (OUT replaced) through the real CLI."""
    argv = shlex.split(r.verdict["command"])
    assert argv[:2] == ["imgshard", "convert"]
    argv = [str(out) if a == "OUT" else a for a in argv[1:]]
    return cli_main(argv + ["--workers", "1", "-q"])


def _jpeg_with_exif(path: Path, exif_payload: bytes, size=(30, 20), seed=0) -> None:
    rgb = synth.textured_image(size[1], size[0], np.random.default_rng(seed))
    Image.fromarray(rgb).save(path, "JPEG", quality=90, exif=exif_payload)


def test_scan_detects_class_folders_and_counts_per_split_and_class(classification_src):
    ds = classification_src
    r = _scan(ds.root)
    assert r.to_json()["task"] == "classification" and r.layout == "split"
    assert r.splits == {"train": 12, "val": 6} and r.usable == r.splits
    expected = {sp: Counter(label for _, label in files) for sp, files in ds.files.items()}
    for c in r.classes_table:
        for sp in ("train", "val"):
            assert c["images"][sp] == expected[sp][c["index"]]
            assert c["share"][sp] == pytest.approx(100 * expected[sp][c["index"]] / r.usable[sp], abs=1e-4)
    assert [c["name"] for c in r.classes_table] == ds.classes
    assert r.bad == [] and r.never_present == [] and r.missing_per_split == {}
    assert r.verdict["status"] == "ok" and r.verdict["flags"] == [] and r.verdict["task_flags"] == []
    assert "--task" not in r.verdict["command"]


def test_scan_sizes_modes_formats_and_exif_rotation_as_displayed(classification_src):
    ds = classification_src
    r = _scan(ds.root)
    expected_sizes = Counter(f"{w}x{h}" for (h, w) in ds.expected_sizes.values())
    assert Counter(r.images["sizes_wxh"]) == expected_sizes
    assert r.images["image_formats"] == {"BMP": 1, "GIF": 1, "JPEG": 7, "PNG": 9}
    assert r.images["image_modes"]["CMYK"] == 1 and r.images["image_modes"]["P"] == 1
    (rotated,) = ds.paths_of_kind("jpeg_exif_rotated")
    assert r.exif["orientations"] == {"6": 1} and r.exif["rotated_or_flipped"] == 1
    summary = next(s for s in r.summaries if s.image == str(rotated))
    h, w = ds.expected_sizes[rotated]
    assert summary.image_size == (w, h)  # displayed (portrait), not stored (landscape)


def test_scan_reports_class_missing_from_a_split_and_empty_class_folder(classification_src):
    root = Path(classification_src.root)
    for f in (root / "val" / "dog").iterdir():
        f.unlink()
    (root / "train" / "zebra").mkdir()
    r = _scan(root)
    assert [c["name"] for c in r.classes_table] == ["bird", "cat", "dog", "zebra"]
    assert r.never_present == ["zebra"]
    assert r.missing_per_split == {"val": ["dog"]}
    assert r.verdict["status"] == "warnings" and r.verdict["convert_ok_without_flags"]
    text = "\n".join(r.verdict["warnings"])
    assert "zebra" in text and "'val': dog" in text
    assert "NO IMAGES" in format_report(r)


def test_scan_names_bad_inputs_like_convert_and_its_command_succeeds(classification_src, tmp_path):
    root = Path(classification_src.root)
    good = root / "train" / "cat" / "cat_0000.jpg"
    (root / "train" / "cat" / "truncated.jpg").write_bytes(good.read_bytes()[:300])
    (root / "train" / "dog" / "junk.png").write_bytes(b"this is not an image")
    (root / "val" / "bird" / "empty.jpg").write_bytes(b"")
    shutil.copy(good, root / "val" / "stray.jpg")  # outside a class folder
    big = root / "val" / "cat" / "big.png"
    Image.fromarray(synth.textured_image(90, 90, np.random.default_rng(1))).save(big)
    r = _scan(root, max_pixels=80 * 80)
    with pytest.raises(BadInputError) as e:
        convert(SourceSpec(root=str(root)), str(tmp_path / "failed"),
                OutputOptions(size=(16, 16), task="classification"), RunOptions(workers=1, max_pixels=80 * 80))
    scan_bad = sorted((b.path, b.kind) for b in r.bad)
    assert scan_bad == sorted((b.path, b.kind) for b in e.value.bad)
    assert {k for _, k in scan_bad} == {"truncated", "not_an_image", "empty_file", "no_class", "too_large"}
    assert r.verdict["status"] == "needs_flags" and r.verdict["flags"] == ["--max-bad", "5"]
    assert r.usable == {"train": 12, "val": 6} and r.splits == {"train": 14, "val": 7}
    # the command the verdict prints converts: every usable image, nothing else
    argv = shlex.split(r.verdict["command"]) + ["--max-pixels", str(80 * 80)]
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv[1:]]
    assert cli_main(argv + ["--workers", "1", "-q"]) == 0
    ds = readers.open(tmp_path / "out")
    assert {sp: ds.manifest.split(sp).num_samples for sp in ds.splits} == r.usable


def test_scan_finds_duplicates_within_and_across_splits_and_class_conflicts(classification_src):
    root = Path(classification_src.root)
    src = root / "train" / "cat" / "cat_0001.png"
    shutil.copy(src, root / "val" / "cat" / "leak.png")  # across splits, same class
    shutil.copy(src, root / "train" / "dog" / "mislabelled.png")  # within train, another class
    with Image.open(src) as im:  # same pixels, other bytes
        im.save(root / "val" / "bird" / "resaved.bmp", "BMP")
    r = _scan(root)
    d = r.duplicates
    (group,) = d["groups"]
    assert sorted(group["keys"]) == ["train/cat/cat_0001.png", "train/dog/mislabelled.png",
                                     "val/bird/resaved.bmp", "val/cat/leak.png"]
    assert not group["identical_files"]
    assert group["classes"] == ["bird", "cat", "dog"] and group["conflicting_classes"]
    assert d["pairs_per_split_pair"] == {"train/train": 1, "train/val": 4, "val/val": 1}
    assert d["cross_split_pairs"] == 4 and d["within_split_pairs"] == 2
    assert d["groups_with_conflicting_classes"] == 1
    warnings = "\n".join(r.verdict["warnings"])
    assert "across splits" in warnings and "different classes" in warnings


def test_scan_flat_layout_val_fraction_matches_convert_splits(classification_flat, tmp_path):
    root = classification_flat.root
    plain = _scan(root)
    assert plain.layout == "flat" and plain.splits == {"train": 12}
    assert any("--val-fraction" in h for h in plain.verdict["hints"])
    r = _scan(root, val_fraction=0.3)
    found, _ = discover_classification(SourceSpec(root=str(root)), 0.3)
    assert r.splits == dict(sorted(Counter(s.split for s in found.samples).items()))
    assert r.verdict["task_flags"] == ["--val-fraction", "0.3"]
    assert _run_verdict_command(r, tmp_path / "out") == 0
    ds = readers.open(tmp_path / "out")
    assert {sp: ds.manifest.split(sp).num_samples for sp in ds.splits} == r.splits


def test_scan_task_classification_overrides_detection_and_command_says_so(tmp_path):
    src = synth.make_classification(tmp_path / "src", classes=("labels", "plain"), per_class=2, flat=True, seed=3)
    with pytest.raises(FileNotFoundError, match="No split folders"):  # "labels" looks like masks: segmentation
        scan(SourceSpec(root=str(src.root)), ScanOptions(workers=1))
    r = _scan(src.root, task="classification")
    assert r.splits == {"train": 4}
    assert r.verdict["task_flags"] == ["--task", "classification"]
    assert _run_verdict_command(r, tmp_path / "out") == 0
    assert readers.open(tmp_path / "out").classes == [("labels", None), ("plain", None)]


def test_scan_explicit_images_folder_of_classes(classification_flat):
    spec = SourceSpec(images=str(classification_flat.root), split="val")
    r = scan(spec, ScanOptions(workers=1))
    assert isinstance(r, ClassScanReport) and r.layout == "folder"
    assert r.splits == {"val": 12}
    assert shlex.split(r.verdict["command"])[2:6] == ["--images", str(classification_flat.root), "--split", "val"]


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")  # Pillow's own warning, from convert's decode
def test_scan_corrupt_exif_and_invalid_orientation_are_warnings_not_bad_inputs(classification_flat, tmp_path):
    root = Path(classification_flat.root)
    # an IFD that promises 5 entries and holds none; an orientation of 9 (valid: 1..8)
    _jpeg_with_exif(root / "cat" / "corrupt_exif.jpg", b"Exif\x00\x00II*\x00\x08\x00\x00\x00\x05\x00\x12\x01\x03\x00")
    _jpeg_with_exif(root / "dog" / "orientation9.jpg",
                    b"Exif\x00\x00II*\x00\x08\x00\x00\x00\x01\x00\x12\x01\x03\x00\x01\x00\x00\x00\x09\x00\x00\x00"
                    b"\x00\x00\x00\x00", seed=1)
    r = _scan(root)
    problems = {p["key"]: p["problem"] for p in r.exif["problems"]}
    assert set(problems) == {"cat/corrupt_exif.jpg", "dog/orientation9.jpg"}
    assert "Corrupt EXIF" in problems["cat/corrupt_exif.jpg"]
    assert "orientation 9 is not 1..8" in problems["dog/orientation9.jpg"]
    assert r.bad == [] and r.verdict["status"] == "warnings"
    assert any("unusable EXIF" in w for w in r.verdict["warnings"])
    # convert accepts both files, as the scan said
    result = convert(SourceSpec(root=str(root)), str(tmp_path / "out"), OutputOptions(size=(8, 8), task="classification"),
                     RunOptions(workers=1))
    assert result.published and result.manifest.split("train").num_samples == 14


def test_exif_info_reads_orientation_of_png_exif_chunk(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 3
    buf = io.BytesIO()
    Image.fromarray(synth.textured_image(10, 12, np.random.default_rng(2))).save(buf, "PNG", exif=exif.tobytes())
    assert exif_info(buf.getvalue()) == (3, None)
    plain = io.BytesIO()
    Image.fromarray(synth.textured_image(10, 12, np.random.default_rng(2))).save(plain, "PNG")
    assert exif_info(plain.getvalue()) == (None, None)


def test_scan_classification_two_workers_equal_one(classification_src):
    one = scan(SourceSpec(root=str(classification_src.root)), ScanOptions(workers=1)).to_json()
    two = scan(SourceSpec(root=str(classification_src.root)), ScanOptions(workers=2)).to_json()
    assert one == two


def test_scan_val_fraction_with_segmentation_task_is_refused():
    with pytest.raises(ValueError, match="--val-fraction applies to classification"):
        ScanOptions(task="segmentation", val_fraction=0.2)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        ScanOptions(val_fraction=1.5)


def test_scan_cli_classification_json_and_exit_codes(classification_src, capsys):
    root = str(classification_src.root)
    assert cli_main(["scan", root, "--json", "--workers", "1", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["task"] == "classification" and doc["samples"] == {"train": 12, "val": 6}
    assert [c["total"] for c in doc["classes"]] == [6, 6, 6]
    (Path(root) / "train" / "cat" / "junk.jpg").write_bytes(b"junk")
    assert cli_main(["scan", root, "--json", "--workers", "1", "-q"]) == 65
    doc = json.loads(capsys.readouterr().out)
    assert doc["bad_counts"] == {"not_an_image": 1} and doc["verdict"]["flags"] == ["--max-bad", "1"]


def test_scan_cli_process_class_folders_with_progress_and_report(classification_src):
    p = subprocess.run([sys.executable, "-m", "converter.cli", "scan", str(classification_src.root), "--workers", "2"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "task classification (detected" in p.stderr
    assert "scan: 100%" in p.stderr and "image/s" in p.stderr
    assert "Images per class" in p.stdout and "Verdict: OK" in p.stdout
    assert f"run: imgshard convert {classification_src.root} OUT --size" in p.stdout


def test_scan_empty_class_folders_say_nothing_to_convert(tmp_path):
    for name in ("a", "b"):
        (tmp_path / "src" / "train" / name).mkdir(parents=True)
    r = _scan(tmp_path / "src", task="classification")
    assert r.splits == {"train": 0}
    assert r.verdict["status"] == "no_data" and not r.verdict["convert_ok_without_flags"]
    assert "Nothing to convert" in format_report(r)
