"""Bad input: every kind collected in one run, reported, nothing published; --max-bad."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from converter.testing import synth
from converter.inspect.verify import verify
from readers.manifest import Manifest
from tests._cron import all_pairs, assert_whole, convert_args, link_samples, manifest_bytes, run_cli, shard_hashes

#: file name in train/ (or train_labels/) -> the kind the converter must report
EXPECTED_KINDS = {
    "cut.png": "truncated",
    "dangling.png": "unreadable",
    "empty.png": "empty_file",
    "text.png": "not_an_image",
    "mismatch_L.png": "size_mismatch",
    "lonely.png": "missing_mask",
    "orphan_L.png": "missing_image",
    "odd_colour_L.png": "unknown_color",
    "big.png": "too_large",
    "big_L.png": "too_large",  # its mask is as large: both files are listed
    "bomb.png": "too_large",
}


def _png_with_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height (8-bit RGB) with one tiny IDAT: a bomb's header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
            + chunk(b"IEND", b""))


def _copy_pair(src: Path, good: tuple[Path, Path], stem: str) -> tuple[Path, Path]:
    image, mask = src / "train" / f"{stem}.png", src / "train_labels" / f"{stem}_L.png"
    image.write_bytes(good[0].read_bytes())
    mask.write_bytes(good[1].read_bytes())
    return image, mask


def plant_every_bad_kind(full: synth.SynthDataset, big: synth.SynthDataset, src: Path) -> None:
    """Add one source of every bad kind to the train split of `src` (see EXPECTED_KINDS)."""
    good = full.pairs["train"][0]
    image, _ = _copy_pair(src, good, "cut")
    data = image.read_bytes()
    image.write_bytes(data[: len(data) // 2])
    (src / "train" / "dangling.png").symlink_to(src / "train" / "no-such-file.png")
    (src / "train_labels" / "dangling_L.png").write_bytes(good[1].read_bytes())
    _copy_pair(src, good, "empty")[0].write_bytes(b"")
    _copy_pair(src, good, "text")[0].write_text("this is a README, not an image\n")
    _, mask = _copy_pair(src, good, "mismatch")
    with Image.open(good[1]) as m:
        m.resize((m.width + 4, m.height)).save(mask)
    (src / "train" / "lonely.png").write_bytes(good[0].read_bytes())
    (src / "train_labels" / "orphan_L.png").write_bytes(good[1].read_bytes())
    _, mask = _copy_pair(src, good, "odd_colour")
    arr = np.array(Image.open(good[1]).convert("RGB"))
    arr[:5, :5] = (250, 3, 7)  # in no class of the table
    Image.fromarray(arr).save(mask)
    _copy_pair(src, big.pairs["train"][0], "big")  # 64x96 > --max-pixels 4000
    _copy_pair(src, good, "bomb")[0].write_bytes(_png_with_header(20_000, 20_000))


@pytest.fixture
def sources(tmp_path: Path):
    full = synth.make_camvid(tmp_path / "full", splits={"train": 5, "val": 2}, size=[(40, 56), (36, 48)], seed=21)
    big = synth.make_camvid(tmp_path / "big", splits={"train": 1}, size=(64, 96), seed=22)
    src = link_samples(full, tmp_path / "src", all_pairs(full))
    return full, big, src


def _reports(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "reports").glob("convert-*.json"))]


def test_every_bad_input_kind_is_collected_in_one_run_and_nothing_is_published(sources, tmp_path, capsys):
    full, big, src = sources
    out = tmp_path / "out"
    assert run_cli(convert_args(src, out, "--max-pixels", "4000")) == 0  # a good dataset first
    manifest, hashes = manifest_bytes(out), shard_hashes(out)
    plant_every_bad_kind(full, big, src)
    capsys.readouterr()

    code = run_cli(convert_args(src, out, "--max-pixels", "4000"))
    assert code == 65
    err = capsys.readouterr().err
    for name in EXPECTED_KINDS:
        assert name in err, f"{name} is not named in the error:\n{err}"
    assert "--max-bad 11" in err
    assert manifest_bytes(out) == manifest and shard_hashes(out) == hashes
    assert verify(out).ok and not verify(out).warnings
    report = _reports(out)[-1]
    assert report["published"] is False and report["counts"]["bad"] == 11
    kinds = {os.path.basename(b["path"]): b["kind"] for b in report["bad"]}
    assert kinds == EXPECTED_KINDS
    assert all(b["reason"] and b["fix"] for b in report["bad"])
    assert "seconds" in report and report["unknown_colors"][0]["color"] == [250, 3, 7]


def test_max_bad_publishes_the_good_samples_and_lists_the_bad(sources, tmp_path, capsys):
    full, big, src = sources
    out = tmp_path / "out"
    plant_every_bad_kind(full, big, src)
    assert run_cli(convert_args(src, out, "--max-pixels", "4000", "--max-bad", "10")) == 65
    assert manifest_bytes(out) is None
    assert not [p for p in out.iterdir() if p.suffix == ".tfrecord"]
    capsys.readouterr()

    assert run_cli([a for a in convert_args(src, out, "--max-pixels", "4000", "--max-bad", "11") if a != "-q"]) == 0
    err = capsys.readouterr().err
    assert "11 bad source file(s) skipped" in err
    good = {f"{split}/{img.name}" for split, pairs in full.pairs.items() for img, _ in pairs}
    assert_whole(out, good)
    report = _reports(out)[-1]
    assert report["published"] is True and len(report["bad"]) == 11
    assert report["history"]["added"] == len(good)


def test_pillow_bomb_guard_holds_whatever_max_pixels_says(sources, tmp_path):
    full, big, src = sources
    out = tmp_path / "out"
    _copy_pair(src, full.pairs["train"][0], "bomb")[0].write_bytes(_png_with_header(20_000, 20_000))
    assert Image.MAX_IMAGE_PIXELS is not None
    assert run_cli(convert_args(src, out, "--max-pixels", str(10**12))) == 65
    (bad,) = _reports(out)[-1]["bad"]
    assert bad["kind"] == "too_large" and "decompression-bomb" in bad["reason"]
    assert Image.MAX_IMAGE_PIXELS == 89_478_485  # Pillow's default: nothing switched its guard off


def test_the_bomb_guard_follows_pillows_setting_whether_or_not_pillow_is_imported(tmp_path, monkeypatch):
    """The fast PNG path checks Pillow's limit without importing Pillow (start-up cost, issue 4)."""
    import subprocess
    import sys

    from converter.transform import decode

    assert decode.PILLOW_DEFAULT_MAX_IMAGE_PIXELS == Image.MAX_IMAGE_PIXELS == 89_478_485
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png_with_header(20_000, 20_000))
    code = ("import sys\n"
            "from converter.transform.decode import DecodeError, decode_image, read_source\n"
            "try:\n"
            f"    decode_image(read_source({str(bomb)!r}, 'bomb.png'), 10**12)\n"
            "except DecodeError as e:\n"
            "    print(e.kind, 'decompression-bomb' in e.reason, 'PIL' in sys.modules)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=root))
    assert proc.stdout.split() == ["too_large", "True", "False"], proc.stderr[-2000:]

    # A caller who lowers Pillow's limit (Pillow imported) lowers the fast path's too.
    small = tmp_path / "small.png"
    Image.fromarray(synth.textured_image(100, 120, np.random.default_rng(1))).save(small)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 5_000)
    with pytest.raises(decode.DecodeError) as e:
        decode.decode_image(decode.read_source(str(small), "small.png"), 10**12)
    assert e.value.kind == "too_large" and "5000 pixels" in e.value.reason


def test_changed_source_that_turns_bad_keeps_its_old_record_with_replace(sources, tmp_path):
    full, big, src = sources
    out = tmp_path / "out"
    assert run_cli(convert_args(src, out)) == 0
    key = "train/" + full.pairs["train"][1][0].name
    old = next(r for r in __import__("readers").open(out).records("train") if r.key == key).image.copy()
    path = src / key
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[: len(data) // 2])
    assert run_cli(convert_args(src, out, "--on-change", "replace")) == 65  # bad: nothing published
    assert run_cli(convert_args(src, out, "--on-change", "replace", "--max-bad", "1")) == 0
    ds = __import__("readers").open(out)
    kept = next(r for r in ds.records("train") if r.key == key)
    assert (kept.image == old).all()
    assert_whole(out, {f"{s}/{i.name}" for s, pairs in full.pairs.items() for i, _ in pairs})
    assert Manifest.load(out).history[-1]["replaced"] == 0


def test_a_sample_whose_image_and_mask_are_both_bad_lists_both(sources, tmp_path):
    full, big, src = sources
    out = tmp_path / "out"
    good = full.pairs["train"][0]
    image, mask = _copy_pair(src, good, "both")
    image.write_text("not an image")
    arr = np.array(Image.open(good[1]).convert("RGB"))
    arr[:3, :3] = (250, 3, 7)
    Image.fromarray(arr).save(mask)
    _copy_pair(src, good, "both_empty")[0].write_bytes(b"")
    (src / "train_labels" / "both_empty_L.png").write_bytes(b"")
    assert run_cli(convert_args(src, out)) == 65
    kinds = {os.path.basename(b["path"]): b["kind"] for b in _reports(out)[-1]["bad"]}
    assert kinds == {"both.png": "not_an_image", "both_L.png": "unknown_color",
                     "both_empty.png": "empty_file", "both_empty_L.png": "empty_file"}


def test_a_fifo_among_the_images_is_reported_instead_of_hanging_the_run(sources, tmp_path):
    full, big, src = sources
    os.mkfifo(src / "train" / "pipe.png")
    (src / "train_labels" / "pipe_L.png").write_bytes(full.pairs["train"][0][1].read_bytes())
    out = tmp_path / "out"
    assert run_cli(convert_args(src, out)) == 65
    (bad,) = _reports(out)[-1]["bad"]
    assert bad["kind"] == "unreadable" and "not a regular file" in bad["reason"]
