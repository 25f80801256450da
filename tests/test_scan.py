"""`imgshard scan`: colours, missing classes, duplicates, bad inputs, verdict, CLI."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from converter.testing import synth
from converter.cli import main as cli_main
from converter.convert import BadInputError, convert
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.inspect.scan import ScanOptions, UnknownColorInfo, format_report, scan, suggest_tolerance
from converter.inspect.scan_labels import suggest_size
from tests._look import add_unused_class, copy_pair

REPO = Path(__file__).resolve().parents[1]


def _scan(root, **kw):
    return scan(SourceSpec(root=str(root)), ScanOptions(workers=1, **kw))


def test_scan_counts_pairs_per_split(camvid_src):
    r = _scan(camvid_src.root)
    assert r.splits == {"test": 2, "train": 6, "val": 2}
    assert r.bad == []
    assert r.verdict["status"] == "ok"
    assert r.verdict["flags"] == []


def test_scan_finds_planted_unknown_colors(camvid_unknown_colors):
    ds = camvid_unknown_colors
    r = _scan(ds.root)
    found = {u.color: u for u in r.unknown_colors}
    assert set(found) == {p.color for p in ds.planted_unknown}
    for p in ds.planted_unknown:
        u = found[p.color]
        assert u.pixels == p.pixels
        assert u.files == 1
        assert u.status == "unknown"
        key = f"{p.image_path.parent.name}/{p.image_path.name}"
        assert u.examples == (key,)
        d = np.abs(np.array(ds.colors, int) - np.array(p.color)).max(axis=1)
        assert u.distance == int(d.min())
        assert u.nearest == ds.classes[int(d.argmin())][0]
        if p.kind == "near":
            assert u.distance in (1, 2) and u.nearest == ds.classes[p.nearest_class][0]
    bad_masks = {b.path for b in r.bad if b.kind == "unknown_color"}
    assert bad_masks == {str(p.mask_path) for p in ds.planted_unknown}
    assert r.verdict["status"] == "needs_flags"


def test_scan_class_pixels_equal_the_drawn_class_maps(camvid_unknown_colors):
    ds = camvid_unknown_colors
    r = _scan(ds.root)
    expected = np.zeros(len(ds.classes), np.int64)
    for s in ds.samples:
        cmap = ds.expected_class_map(s.image_path, unknown_value=255)
        expected += np.bincount(cmap.ravel(), minlength=256)[: len(ds.classes)]
    assert [c["pixels"] for c in r.classes_table] == expected.tolist()
    total = sum(s.height * s.width for s in ds.samples)
    for c in r.classes_table:
        assert c["share"] == pytest.approx(100 * c["pixels"] / total, abs=1e-4)


def test_scan_verdict_flags_make_convert_succeed(camvid_unknown_colors, tmp_path):
    ds = camvid_unknown_colors
    spec = SourceSpec(root=str(ds.root))
    with pytest.raises(BadInputError):
        convert(spec, str(tmp_path / "plain"), OutputOptions(size=(32, 48)), RunOptions(workers=1))
    r = _scan(ds.root)
    v = r.verdict
    size, _ = suggest_size(r.images["sizes_wxh"])  # the sizes tie: from the median aspect
    h, w = size.split("x")
    near = next(p for p in ds.planted_unknown if p.kind == "near")
    tol = int(np.abs(np.array(ds.colors, int) - np.array(near.color)).max(axis=1).min())
    assert v["flags"] == ["--color-tolerance", str(tol), "--unknown-color", "ignore"]
    assert v["command"].startswith(f"imgshard convert {shlex.quote(str(ds.root))} OUT --size {h}x{w} ")
    result = convert(spec, str(tmp_path / "fixed"),
                     OutputOptions(size=(32, 48), color_tolerance=tol, unknown_color="ignore"), RunOptions(workers=1))
    assert result.published and result.bad == []


def test_scan_tolerance_snaps_near_color_to_its_class(camvid_unknown_colors):
    ds = camvid_unknown_colors
    near = next(p for p in ds.planted_unknown if p.kind == "near")
    r = _scan(ds.root, color_tolerance=2)
    u = next(u for u in r.unknown_colors if u.color == near.color)
    assert u.status == "snapped"
    row = next(c for c in r.classes_table if c["name"] == u.nearest)
    assert row["snapped_pixels"] == near.pixels
    assert str(near.mask_path) not in {b.path for b in r.bad}


def test_scan_reports_class_that_never_occurs(camvid_src):
    add_unused_class(camvid_src.class_dict_path, "Bicyclist")
    r = _scan(camvid_src.root)
    assert r.never_present == ["Bicyclist"]
    assert r.classes_table[-1]["pixels"] == 0 and r.classes_table[-1]["files"] == 0
    assert "never present in any mask: Bicyclist" in " ".join(r.verdict["warnings"])
    assert r.verdict["status"] == "warnings"


def test_scan_finds_duplicates_across_and_within_splits(camvid_src):
    copy_pair(camvid_src, "train", 0, "test", "leak_a")
    copy_pair(camvid_src, "train", 0, "val", "leak_b")
    copy_pair(camvid_src, "train", 1, "train", "again")
    r = _scan(camvid_src.root)
    d = r.duplicates
    assert d["pairs_per_split_pair"] == {"test/train": 1, "test/val": 1, "train/train": 1, "train/val": 1}
    assert d["cross_split_pairs"] == 3 and d["within_split_pairs"] == 1
    keys = sorted(sorted(g["keys"]) for g in d["groups"])
    first = camvid_src.pairs["train"][0][0].name
    second = camvid_src.pairs["train"][1][0].name
    assert keys == sorted([sorted(["test/leak_a.png", "val/leak_b.png", f"train/{first}"]),
                           sorted(["train/again.png", f"train/{second}"])])
    assert all(g["identical_files"] for g in d["groups"])
    assert any("across splits (leakage" in w for w in r.verdict["warnings"])


def test_scan_duplicate_by_pixels_when_file_bytes_differ(camvid_src):
    from PIL import Image

    image, _ = camvid_src.pairs["train"][2]
    new_image, _ = copy_pair(camvid_src, "train", 2, "val", "resaved")
    with Image.open(image) as im:
        im.save(new_image, compress_level=0)  # same pixels, other bytes
    assert new_image.read_bytes() != image.read_bytes()
    g = _scan(camvid_src.root).duplicates["groups"]
    assert len(g) == 1 and not g[0]["identical_files"]


def test_scan_image_sizes_and_modes(camvid_all_modes):
    r = _scan(camvid_all_modes.root)
    assert r.images["image_modes"] == {"L": 3, "P": 3, "RGB": 3, "RGBA": 3}
    assert r.images["mask_modes"] == {"P": 4, "RGB": 4, "RGBA": 4}
    assert r.images["sizes_wxh"] == {"64x48": 6, "96x64": 6}
    assert r.images["image_formats"] == {"PNG": 12}


def test_scan_names_bad_inputs_like_convert(camvid_src, tmp_path):
    root = Path(camvid_src.root)
    img0, mask0 = camvid_src.pairs["train"][0]
    img0.write_bytes(img0.read_bytes()[:200])  # truncated image
    img1, _ = camvid_src.pairs["train"][1]
    img1.unlink()  # mask without image
    _, mask2 = camvid_src.pairs["train"][2]
    size2 = camvid_src.sample(mask2).height
    other = next(s.mask_path for s in camvid_src.samples if s.height != size2)  # size mismatch
    mask2.write_bytes(other.read_bytes())
    (root / "val" / "junk.png").write_bytes(b"not an image at all")  # + no mask
    (root / "val_labels" / "empty_L.png").write_bytes(b"")
    (root / "val" / "empty.png").write_bytes(open(camvid_src.pairs["val"][0][0], "rb").read())
    r = _scan(root)
    with pytest.raises(BadInputError) as e:
        convert(SourceSpec(root=str(root)), str(tmp_path / "out"), OutputOptions(size=(32, 48)),
                RunOptions(workers=1))
    scan_bad = sorted((b.path, b.kind) for b in r.bad)
    convert_bad = sorted((b.path, b.kind) for b in e.value.bad)
    assert scan_bad == convert_bad
    assert {k for _, k in scan_bad} >= {"truncated", "missing_image", "size_mismatch", "missing_mask", "empty_file"}
    assert r.verdict["flags"] == ["--max-bad", str(len(r.bad))]


def test_suggest_tolerance_never_makes_a_colour_ambiguous():
    def info(color, d1, d2):
        return UnknownColorInfo(color, 10, 1, 0.1, "A", d1, d1 == d2, d2, "unknown", ("k",))

    # a near colour (2 off A) and one midway between two classes (3 from both)
    tol, left = suggest_tolerance([info((1, 1, 1), 2, 40), info((9, 9, 9), 3, 3)])
    assert tol == 2 and [u.color for u in left] == [(9, 9, 9)]
    tol, left = suggest_tolerance([info((1, 1, 1), 2, 2)])
    assert tol == 0 and len(left) == 1
    tol, left = suggest_tolerance([info((1, 1, 1), 60, 90)])
    assert tol == 0 and len(left) == 1  # too far to snap safely


def test_scan_with_two_workers_equals_one_worker(camvid_unknown_colors):
    one = scan(SourceSpec(root=str(camvid_unknown_colors.root)), ScanOptions(workers=1)).to_json()
    two = scan(SourceSpec(root=str(camvid_unknown_colors.root)), ScanOptions(workers=2)).to_json()
    assert one == two


def test_scan_explicit_folders(explicit_src):
    root = Path(explicit_src.root)
    spec = SourceSpec(images=str(root / "images"), masks=str(root / "masks"), classes=str(root / "classes.csv"),
                      split="train")
    r = scan(spec, ScanOptions(workers=1))
    assert r.splits == {"train": 6}
    assert "--images" in r.verdict["command"] and "--classes" in r.verdict["command"]


def test_scan_text_report_lists_colours_and_verdict(camvid_unknown_colors):
    text = format_report(_scan(camvid_unknown_colors.root))
    assert "Unknown colours (2" in text
    assert "would snap it" in text
    assert "run: imgshard convert" in text


def test_scan_cli_json_parses_and_exit_code(camvid_unknown_colors, capsys):
    rc = cli_main(["scan", str(camvid_unknown_colors.root), "--json", "--workers", "1", "-q"])
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert rc == 65
    assert doc["verdict"]["status"] == "needs_flags"
    assert len(doc["unknown_colors"]) == 2
    assert doc["pairs"] == {"test": 2, "train": 6, "val": 2}


def test_scan_cli_process_clean_source_exits_0_with_progress_on_stderr(camvid_src):
    p = subprocess.run([sys.executable, "-m", "converter.cli", "scan", str(camvid_src.root), "--workers", "1"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Verdict: OK" in p.stdout
    assert "scan: 100%" in p.stderr


def test_scan_missing_class_table_lists_the_colours_and_convert_names_the_file(tmp_path):
    """Issue 26 changed scan: colour masks without class_dict.csv are no longer refused; the colours
    present are the classes, and no command is printed until the table is written. convert still
    refuses without it, naming the file."""
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 2}, size=(16, 16))
    os.unlink(ds.class_dict_path)
    r = _scan(ds.root)
    assert r.labels["classes_from_colours"] and r.verdict["command"] is None
    assert "without a class table" in r.verdict["reason"] and all(c.name.startswith("#") for c in r.classes)
    with pytest.raises(FileNotFoundError, match="class_dict.csv"):
        convert(SourceSpec(root=str(ds.root)), str(tmp_path / "out"), OutputOptions(size=(8, 8)), RunOptions(workers=1))


def test_scan_empty_source_says_nothing_to_convert(tmp_path):
    ds = synth.make_camvid(tmp_path / "empty", splits={"train": 0}, size=(16, 16))
    r = _scan(ds.root)
    assert r.splits == {"train": 0}
    assert r.verdict["status"] == "no_data" and not r.verdict["convert_ok_without_flags"]
    assert "Nothing to convert" in format_report(r)
