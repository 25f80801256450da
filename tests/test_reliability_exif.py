"""Issue 25, item 5: EXIF orientation for segmentation, decided from the mask's size.

Expected pixels come from Pillow (`ImageOps.exif_transpose`), never from imgshard code.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

import readers
from _hostile import assert_named_error, run_hostile
from converter.testing import synth
from converter.transform.exif import orient
from readers.manifest import MANIFEST_NAME
from tests._cron import convert_args, run_cli

H, W = 48, 32  # displayed size of every image (portrait)


def _jpeg_with_orientation(stored: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(stored).save(buf, "JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_turns_pixels_as_pillows_exif_transpose(orientation):
    data = _jpeg_with_orientation(synth.textured_image(20, 36, np.random.default_rng(orientation)), orientation)
    with Image.open(io.BytesIO(data)) as im:
        stored = np.asarray(im)
        expected = np.asarray(ImageOps.exif_transpose(im))
    assert np.array_equal(orient(stored, orientation), expected)


@pytest.fixture
def exif_src(tmp_path) -> tuple[Path, dict[str, Path]]:
    """A CamVid folder: `portrait` stored landscape with orientation 6 and its mask drawn on the
    picture as shown (the phone case); `square` (orientation 6) and `upside` (orientation 3):
    sizes cannot decide; the other sample has no tag."""
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 4}, size=[(H, W), (40, 40), (H, W), (H, W)],
                           image_ext=".jpg", seed=5, quirks=False)
    pairs = ds.pairs["train"]
    files = {}
    for (image, _), name, turn, orientation in zip(pairs[:3], ("portrait", "square", "upside"), (1, 1, 2), (6, 6, 3)):
        shown = np.asarray(Image.open(image).convert("RGB"))
        image.write_bytes(_jpeg_with_orientation(np.ascontiguousarray(np.rot90(shown, turn)), orientation))
        files[name] = image
    return ds.root, files


def _records(out: Path) -> dict[str, np.ndarray]:
    return {r.key.split("/")[-1]: r.image for r in readers.open(out).records("train")}


def test_auto_applies_exif_where_the_mask_fits_the_shown_image_and_refuses_what_sizes_cannot_decide(exif_src,
                                                                                                      tmp_path):
    src, files = exif_src
    out = tmp_path / "out"
    proc = run_hostile(convert_args(src, out, size=f"{H}x{W}", workers=1)[:-1])  # without -q
    text = assert_named_error(proc, "--exif apply", codes=[65])
    report = json.loads(sorted((out / "reports").glob("convert-*.json"))[-1].read_text())
    kinds = {os.path.basename(b["path"]): b["kind"] for b in report["bad"]}
    assert kinds == {files["square"].name: "exif_ambiguous", files["upside"].name: "exif_ambiguous"}, text
    assert "orientation is 3 (turned 180 degrees)" in text

    proc = run_hostile(["scan", str(src), "--json"])
    bad = {os.path.basename(b["path"]): b["kind"] for b in json.loads(proc.stdout)["bad"]}
    assert bad == kinds

    assert run_cli(convert_args(src, out, "--max-bad", "2", size=f"{H}x{W}", workers=1)) == 0
    with Image.open(files["portrait"]) as im:
        expected = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert np.array_equal(_records(out)[files["portrait"].name], expected)  # turned, so it lines up with its mask
    assert "exif" not in json.loads((out / MANIFEST_NAME).read_text())["options"]  # absent: auto


def test_exif_apply_and_ignore_decide_for_every_image_and_the_manifest_records_it(exif_src, tmp_path):
    src, files = exif_src
    out = tmp_path / "apply"
    assert run_cli(convert_args(src, out, "--exif", "apply", size=f"{H}x{W}", workers=1)) == 0
    records = _records(out)
    for name in ("portrait", "upside"):
        with Image.open(files[name]) as im:
            assert np.array_equal(records[files[name].name], np.asarray(ImageOps.exif_transpose(im).convert("RGB")))
    assert json.loads((out / MANIFEST_NAME).read_text())["options"]["exif"] == "apply"

    out = tmp_path / "ignore"
    proc = run_hostile(convert_args(src, out, "--exif", "ignore", size=f"{H}x{W}", workers=1))
    text = assert_named_error(proc, "EXIF orientation is 6", "--exif ignore", codes=[65])
    report = json.loads(sorted((out / "reports").glob("convert-*.json"))[-1].read_text())
    assert [b["kind"] for b in report["bad"]] == ["size_mismatch"], text  # the portrait's mask fits only when turned
    assert run_cli(convert_args(src, out, "--exif", "ignore", "--max-bad", "1", size=f"{H}x{W}", workers=1)) == 0
    with Image.open(files["upside"]) as im:
        assert np.array_equal(_records(out)[files["upside"].name], np.asarray(im.convert("RGB")))  # as stored
    assert json.loads((out / MANIFEST_NAME).read_text())["options"]["exif"] == "ignore"


def test_scan_takes_exif_and_prints_no_command_until_the_sizes_cannot_decide_is_decided(exif_src, tmp_path):
    """`scan --exif auto` (the default) on pairs the sizes cannot decide (square, 180 degrees): the
    verdict names them and prints no command (only the user knows how the masks were drawn);
    `scan --exif apply` judges as convert --exif apply does, and its command (with --exif apply)
    converts."""
    import shlex

    src, files = exif_src
    proc = run_hostile(["scan", str(src), "--json"])
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "needs_decision" and verdict["command"] is None, verdict
    assert "--exif apply" in verdict["reason"] and "--exif ignore" in verdict["reason"], verdict
    assert files["square"].name in verdict["reason"]
    text = run_hostile(["scan", str(src)])
    assert "run: imgshard convert" not in text.stdout + text.stderr and "--exif apply" in text.stdout + text.stderr

    proc = run_hostile(["scan", str(src), "--exif", "apply", "--json"])
    report = json.loads(proc.stdout)
    verdict = report["verdict"]
    assert report["bad"] == [] and report["options"]["exif"] == "apply", report["bad"]
    assert verdict["status"] in ("ok", "warnings") and verdict["command"], verdict
    words = shlex.split(verdict["command"])
    assert words[words.index("--exif") + 1] == "apply", verdict["command"]
    out = tmp_path / "out"
    words[words.index("OUT")] = str(out)
    assert run_cli(words[1:] + ["--workers", "1", "-q"]) == 0
    assert json.loads((out / MANIFEST_NAME).read_text())["options"]["exif"] == "apply"
    with Image.open(files["upside"]) as im:  # its size is the dataset's (the square one is resized)
        assert np.array_equal(_records(out)[files["upside"].name], np.asarray(ImageOps.exif_transpose(im).convert("RGB")))

    report = json.loads(run_hostile(["scan", str(src), "--exif", "ignore", "--json"]).stdout)  # the portrait fits only turned
    assert [b["kind"] for b in report["bad"]] == ["size_mismatch"] and "--exif ignore" in report["verdict"]["command"]
