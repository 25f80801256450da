"""Issue 25, converter side: cut JPEGs, JPEG bombs, non-UTF-8 file names and animated masks are
named bad inputs (`convert`, `scan`, `--max-bad`); good JPEGs of every common encoder pass."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from _hostile import assert_named_error, run_hostile
from converter.testing import synth
from converter.transform.decode import DecodeError, SourceFile, decode_image
from converter.transform.jpeg import scan_check_available
from readers.manifest import SourceFingerprint

H, W = 96, 64
needs_walk = pytest.mark.skipif(not scan_check_available(),
                                reason="the _jpegscan extension is not built (no C compiler): scans are not walked")


def _jpeg(rgb: np.ndarray, **params) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", **params)
    return buf.getvalue()


def _sof_offset(data: bytes) -> int:
    return next(data.index(m) for m in (b"\xff\xc0", b"\xff\xc1", b"\xff\xc2") if m in data)


def _with_size(data: bytes, height: int, width: int) -> bytes:
    """The JPEG with the frame header's height and width replaced (its scan data untouched)."""
    at = _sof_offset(data) + 5
    return data[:at] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[at + 4:]


def _cut_with_eoi(data: bytes, fraction: float) -> bytes:
    """Cut inside the scan data and closed with an end-of-image marker, as a careless tool does."""
    cut = data[:int(len(data) * fraction)]
    return cut.rstrip(b"\xff") + b"\xff\xd9"


def _src(data: bytes, name: str = "x.jpg") -> SourceFile:
    return SourceFile(name, data, SourceFingerprint(name, len(data), 0, "xxh3_128:0"))


@pytest.fixture(scope="module")
def texture() -> np.ndarray:
    return synth.textured_image(H, W, np.random.default_rng(25))


@pytest.mark.parametrize("params", [{}, {"quality": 30}, {"subsampling": 0}, {"subsampling": 1}, {"optimize": True},
                                    {"restart_marker_blocks": 3}, {"restart_marker_rows": 1}, {"progressive": True}],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default")
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_good_pillow_jpeg_passes_the_scan_check_with_pillows_pixels(texture, params, mode):
    data = _jpeg(texture, **params) if mode == "RGB" else _grey_jpeg(texture, **params)
    expected = np.asarray(Image.open(io.BytesIO(data)))
    assert expected.ndim == (3 if mode == "RGB" else 2)
    assert np.array_equal(decode_image(_src(data), 10**8), expected)


def _grey_jpeg(rgb: np.ndarray, **params) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).convert("L").save(buf, "JPEG", **params)
    return buf.getvalue()


@pytest.mark.parametrize("flags", [[], [cv2.IMWRITE_JPEG_RST_INTERVAL, 5], [cv2.IMWRITE_JPEG_OPTIMIZE, 1],
                                   [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422],
                                   [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]], ids=["plain", "rst5", "optimize", "422", "prog"])
def test_good_opencv_jpeg_passes_the_scan_check(texture, flags):
    ok, encoded = cv2.imencode(".jpg", texture[:, :, ::-1], flags)
    data = encoded.tobytes()
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(decode_image(_src(data), 10**8), expected)


@pytest.mark.parametrize("params", [{}, {"subsampling": 0}, {"restart_marker_rows": 1}],
                         ids=["420", "444", "restart-every-row"])
@needs_walk
def test_jpeg_cut_and_closed_with_end_marker_is_truncated_not_grey(texture, params):
    data = _cut_with_eoi(_jpeg(texture, **params), 0.6)
    Image.open(io.BytesIO(data)).load()  # what made this dangerous: Pillow decodes it without a word
    with pytest.raises(DecodeError) as e:
        decode_image(_src(data, "cut.jpg"), 10**8)
    assert e.value.kind == "truncated" and "of its 96 rows" in e.value.reason and e.value.path == "cut.jpg"


@needs_walk
def test_jpeg_cut_inside_its_last_restart_interval_is_truncated(texture):
    """Every restart marker present (so only the last interval is walked), the data cut inside it."""
    data = _jpeg(texture, restart_marker_rows=1)
    last = max(data.rfind(bytes([0xFF, m])) for m in range(0xD0, 0xD8))
    cut = data[:last + 2 + (len(data) - last) // 2].rstrip(b"\xff") + b"\xff\xd9"
    with pytest.raises(DecodeError, match="ends after about 80 of its 96 rows") as e:
        decode_image(_src(cut), 10**8)
    assert e.value.kind == "truncated"


@needs_walk
def test_jpeg_header_declaring_more_rows_than_its_data_holds_is_truncated(texture):
    data = _with_size(_jpeg(texture), 2 * H, W)
    assert Image.open(io.BytesIO(data)).size == (W, 2 * H)
    with pytest.raises(DecodeError, match=f"ends after about {H} of its {2 * H} rows") as e:
        decode_image(_src(data), 10**8)
    assert e.value.kind == "truncated"


def _sos_offsets(data: bytes) -> list[int]:
    """Offsets of the start-of-scan markers of a (progressive) JPEG, read segment by segment."""
    pos, found = 2, []
    while pos + 4 <= len(data) and data[pos + 1] != 0xD9:
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        if data[pos + 1] == 0xDA:
            found.append(pos)
            pos += 2 + length
            while not (data[pos] == 0xFF and data[pos + 1] not in (0x00, *range(0xD0, 0xD8))):
                pos += 1
            continue
        pos += 2 + length
    return found


def _pillow_loads(data: bytes) -> bool:
    try:
        Image.open(io.BytesIO(data)).load()
    except OSError:
        return False
    return True


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_progressive_jpeg_cut_before_its_last_scan_is_truncated(texture, mode):
    """A Pillow-written progressive JPEG cut at every scan boundary and inside every scan but the
    last, closed with an end-of-image marker (Pillow decodes most of these without an error, blurred
    or grey) or not: `truncated`. A cut inside the last scan is not detected (docs/RELIABILITY.md)."""
    data = _jpeg(texture, progressive=True) if mode == "RGB" else _grey_jpeg(texture, progressive=True)
    scans = _sos_offsets(data)
    assert len(scans) >= 6, scans  # libjpeg's default progressive script
    cuts = [at for at in scans[1:]] + [(a + b) // 2 for a, b in zip(scans, scans[1:])]
    silent = 0
    for cut in cuts:
        for closed in (True, False):
            bad = data[:cut].rstrip(b"\xff") + (b"\xff\xd9" if closed else b"")
            if closed:
                silent += _pillow_loads(bad)
            with pytest.raises(DecodeError) as e:
                decode_image(_src(bad, "cut.jpg"), 10**8)
            assert e.value.kind == "truncated" and "progressive JPEG" in e.value.reason, (cut, closed)
            assert e.value.path == "cut.jpg"
    assert silent > len(cuts) // 2  # what made them dangerous: most decode in Pillow without an error
    inside_last = data[:(scans[-1] + len(data)) // 2].rstrip(b"\xff") + b"\xff\xd9"
    assert decode_image(_src(inside_last), 10**8).shape[:2] == (H, W)  # the gap this check leaves


def test_jpeg_claiming_9000x9000_in_a_few_kilobytes_is_refused_before_decoding(texture, tmp_path):
    """A 1-2 KB file that says 9000x9000: refused by the size bound, in a child whose peak memory
    stays far below the 240 MB libjpeg would allocate for it."""
    bomb = _with_size(_jpeg(texture[:16, :16], quality=20), 9000, 9000)
    assert len(bomb) < 4096
    path = tmp_path / "bomb.jpg"
    path.write_bytes(bomb)
    code = ("from converter.transform.decode import DecodeError, decode_image, read_source\n"
            f"src = read_source({str(path)!r}, 'bomb.jpg')\n"
            "try:\n    decode_image(src, 10**9)\nexcept DecodeError as e:\n    print('KIND', e.kind, e.reason)\n"
            # VmHWM: this process's peak (ru_maxrss would carry the forking parent's over exec)
            "print('RSS_KB', [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])\n")
    proc = run_hostile(code=code)
    assert proc.returncode == 0, proc.stderr
    assert "KIND truncated the JPEG header says 9000x9000" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    rss_kb = int(proc.stdout.split("RSS_KB")[1])
    assert rss_kb < 200 * 1024, rss_kb


def _animated_gif_mask(colors: list[tuple[int, int, int]], height: int, width: int) -> bytes:
    frames = []
    for shift in range(2):
        idx = (np.add.outer(np.arange(height), np.arange(width)) // 7 + shift) % len(colors)
        frame = Image.fromarray(idx.astype(np.uint8), "P")
        frame.putpalette([c for rgb in colors for c in rgb])
        frames.append(frame)
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return buf.getvalue()


@pytest.fixture(scope="module")
def bad_names_src(tmp_path_factory, texture) -> tuple[Path, dict[str, str]]:
    """A CamVid folder of good JPEG pairs plus: a cut JPEG, a tall-header JPEG, a JPEG bomb,
    a pair with a latin-1 name, and an animated GIF mask. Returns it and name -> kind."""
    root = tmp_path_factory.mktemp("rel-src")
    ds = synth.make_camvid(root / "src", splits={"train": 3}, size=(H, W), seed=25, image_ext=".jpg", quirks=False)
    src = ds.root
    good_image, good_mask = ds.pairs["train"][0]
    jpeg = good_image.read_bytes()
    planted = {"cut_eoi.jpg": _cut_with_eoi(jpeg, 0.55), "tall_header.jpg": _with_size(jpeg, 2 * H, W),
               "bomb.jpg": _with_size(jpeg, 9000, 9000)}
    for name, data in planted.items():
        (src / "train" / name).write_bytes(data)
        shutil.copy(good_mask, src / "train_labels" / name.replace(".jpg", "_L.png"))
    latin1 = os.fsdecode(b"caf\xe9")  # 'caf\udce9': how Python names a latin-1 file on a UTF-8 system
    shutil.copy(good_image, src / "train" / f"{latin1}.jpg")
    shutil.copy(good_mask, src / "train_labels" / f"{latin1}_L.png")
    shutil.copy(good_image, src / "train" / "animated.jpg")
    colors = [tuple(c) for _, c in ds.classes][:3]
    (src / "train_labels" / "animated_L.gif").write_bytes(_animated_gif_mask(colors, H, W))
    kinds = {"cut_eoi.jpg": "truncated", "tall_header.jpg": "truncated", "bomb.jpg": "truncated",
             "caf\\xe9.jpg": "bad_name", "caf\\xe9_L.png": "bad_name", "animated_L.gif": "animated"}
    return Path(src), kinds


def _report_kinds(bad: list[dict]) -> dict[str, str]:
    return {os.path.basename(b["path"]): b["kind"] for b in bad}


@needs_walk
def test_convert_lists_cut_jpegs_bad_names_and_animated_masks_by_kind(bad_names_src, tmp_path):
    src, kinds = bad_names_src
    out = tmp_path / "out"
    proc = run_hostile(["convert", str(src), str(out), "--size", "16x16", "--workers", "2"])
    text = assert_named_error(proc, "caf\\xe9.jpg", "not valid UTF-8", "cut_eoi.jpg", "animated_L.gif", codes=[65])
    assert "surrogates not allowed" not in text
    report = json.loads(sorted((out / "reports").glob("convert-*.json"))[-1].read_text())
    assert _report_kinds(report["bad"]) == kinds


@needs_walk
def test_scan_lists_the_same_files_with_the_same_kinds(bad_names_src):
    src, kinds = bad_names_src
    proc = run_hostile(["scan", str(src), "--json", "--workers", "2"])
    assert_named_error(proc, codes=[65])
    assert _report_kinds(json.loads(proc.stdout)["bad"]) == kinds


@needs_walk
def test_max_bad_counts_them_and_publishes_only_the_good_samples(bad_names_src, tmp_path):
    src, kinds = bad_names_src
    out = tmp_path / "out"
    proc = run_hostile(["convert", str(src), str(out), "--size", "16x16", "--max-bad", str(len(kinds)), "-q"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    import readers

    keys = sorted(r.key for r in readers.open(out).records("train"))
    assert keys == sorted(f"train/{p.name}" for p in (src / "train").iterdir()
                          if p.name not in ("cut_eoi.jpg", "tall_header.jpg", "bomb.jpg", "animated.jpg")
                          and p.name.isascii() and p.name.encode("utf-8", "surrogateescape").isascii())
    proc = run_hostile(["convert", str(src), str(tmp_path / "out2"), "--size", "16x16",
                        "--max-bad", str(len(kinds) - 1), "-q"])
    assert_named_error(proc, codes=[65])  # one fewer allowed: refused


def _class_folders(root: Path, names: list[bytes], rng: np.random.Generator) -> None:
    for name in names:
        folder = os.path.join(os.fsencode(root), name)
        os.makedirs(folder, exist_ok=True)
        for i in range(2):
            Image.fromarray(synth.textured_image(20, 24, rng)).save(os.fsdecode(os.path.join(folder, b"img%d.png" % i)))


def test_class_folders_latin1_image_name_is_bad_name_and_latin1_class_folder_is_refused(tmp_path):
    rng = np.random.default_rng(3)
    src = tmp_path / "src"
    _class_folders(src, [b"cat", b"dog"], rng)
    Image.fromarray(synth.textured_image(20, 24, rng)).save(os.fsdecode(os.fsencode(src / "cat") + b"/\xe9t\xe9.png"))
    proc = run_hostile(["convert", str(src), str(tmp_path / "out"), "--size", "16x16", "--workers", "1"])
    assert_named_error(proc, "cat/\\xe9t\\xe9.png", "not valid UTF-8", codes=[65])
    proc = run_hostile(["convert", str(src), str(tmp_path / "out"), "--size", "16x16", "--max-bad", "1", "-q"])
    assert proc.returncode == 0, proc.stderr
    import readers

    assert sorted(r.key for r in readers.open(tmp_path / "out").records("train")) == [
        "cat/img0.png", "cat/img1.png", "dog/img0.png", "dog/img1.png"]

    _class_folders(src, [b"caf\xe9"], rng)  # a class name must be text: the whole run is refused, by name
    for command in (["convert", str(src), str(tmp_path / "out2"), "--size", "16x16", "--max-bad", "9"],
                    ["scan", str(src)]):
        assert_named_error(run_hostile(command), "class folder name(s) caf\\xe9 are not valid UTF-8", codes=[65])
