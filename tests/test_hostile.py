"""Hostile and damaged sources, and a hostile output folder, against the real CLI (issue 12).

A generated corpus of damaged files (short and cut streams, lying headers, bad CRCs on
critical and ancillary chunks, bad row filters, tRNS oddities, zero bytes, non-PNG data
named .png, FIFOs, symlink loops, dangling links) sits among good samples in one source
folder. `convert`, `scan` and `preview` run on it in child processes with a timeout and
an address-space limit (`tests/_hostile.py`); each damaged file must be listed as a bad
input of the right kind, with no traceback, no hang and bounded memory. Output-folder
faults and runs with nothing to convert end in one named line and a documented exit code.
Every promise tested here is listed in docs/RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from _hostile import assert_named_error, run_hostile
from converter.testing import synth
from converter.transform import png
from converter.transform.decode import DecodeError, SourceFile, decode_image, decode_mask
from readers.manifest import MANIFEST_NAME
from tests._pngcraft import Png, chunk, ihdr_bomb, short_stream

MAX_PIXELS = 10**8
W, H = 48, 32  # the size of the good samples' images and masks


def _image(**kw: object) -> Png:
    return Png(width=W, height=H, color_type=2, **kw)  # type: ignore[arg-type]


def _with_bad_idat_data() -> bytes:
    data = bytearray(zlib.compress(_image(seed=9).raw()))
    data[len(data) // 2] ^= 0xFF  # damaged deflate data; the chunk CRCs are computed over it (right)
    return _image(seed=9).bytes(bytes(data))


#: image file name in train/ -> (bytes, or a builder of a special file; kind convert and scan must report)
HOSTILE_IMAGES = {
    "short_stream.png": (short_stream(_image(seed=1), 20), "truncated"),
    "ihdr_9000x9000.png": (ihdr_bomb(), "truncated"),
    "cut_in_half.png": (_image(seed=2).bytes()[:400], "truncated"),
    "bad_deflate_data.png": (_with_bad_idat_data(), "corrupt"),
    "bad_crc_ihdr.png": (_image(seed=3, bad_crc=frozenset({b"IHDR"})).bytes(), "corrupt"),
    "bad_crc_ancillary.png": (_image(seed=4, before_idat=(chunk(b"tEXt", b"k\0v", bad_crc=True),)).bytes(), "corrupt"),
    "row_filter_17.png": (_image(rows=b"".join(bytes([17]) + bytes(W * 3) for _ in range(H))).bytes(), "corrupt"),
    "short_trns.png": (_image(seed=5, before_idat=(chunk(b"tRNS", b"\0"),)).bytes(), "truncated"),
    "zero_bytes.png": (b"", "empty_file"),
    "not_png_text.png": (b"this is a text file, not a picture\n" * 4, "not_an_image"),
    "png_signature_then_junk.png": (png.SIGNATURE + bytes(range(256)) * 2, "corrupt"),
    "fifo.png": ("fifo", "unreadable"),
    "symlink_loop.png": ("loop", "unreadable"),
    "dangling_link.png": ("dangling", "unreadable"),
}
#: mask file name in train_labels/ (its image is good) -> (bytes, kind)
HOSTILE_MASKS = {
    "mask_row_filter_17_L.png": (_image(rows=b"".join(bytes([17]) + bytes(W * 3) for _ in range(H))).bytes(),
                                 "corrupt"),
    "mask_short_palette_L.png": (short_stream(Png(width=W, height=H, color_type=3, seed=6), 10), "truncated"),
    "mask_fifo_L.png": ("fifo", "unreadable"),
}


def _plant(path: Path, content: bytes | str) -> None:
    if content == "fifo":
        os.mkfifo(path)
    elif content == "loop":
        path.symlink_to(path.name)
    elif content == "dangling":
        path.symlink_to(path.parent / "no-such-file.png")
    else:
        path.write_bytes(content)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def hostile_src(tmp_path_factory) -> Path:
    """Three good pairs, then every hostile image (with a good mask) and mask (with a good image)."""
    root = tmp_path_factory.mktemp("hostile")
    ds = synth.make_camvid(root / "src", splits={"train": 3}, size=(H, W), seed=21, quirks=False)
    src = ds.root
    good_image, good_mask = ds.pairs["train"][0]
    assert Image.open(good_image).size == (W, H)
    for name, (content, _) in HOSTILE_IMAGES.items():
        _plant(src / "train" / name, content)
        shutil.copy(good_mask, src / "train_labels" / name.replace(".png", "_L.png"))
    for name, (content, _) in HOSTILE_MASKS.items():
        _plant(src / "train_labels" / name, content)
        shutil.copy(good_image, src / "train" / name.replace("_L.png", ".png"))
    return Path(src)


def _expected() -> dict[str, str]:
    return {name: kind for name, (_, kind) in {**HOSTILE_IMAGES, **HOSTILE_MASKS}.items()}


@pytest.fixture(scope="module")
def convert_run(hostile_src, tmp_path_factory) -> tuple[str, dict[str, str], Path]:
    out = tmp_path_factory.mktemp("hostile-out") / "out"
    proc = run_hostile(["convert", str(hostile_src), str(out), "--size", "16x16", "--workers", "2"])
    text = assert_named_error(proc, codes=[65])
    reports = sorted((out / "reports").glob("convert-*.json"))
    kinds = {os.path.basename(b["path"]): b["kind"] for b in json.loads(reports[-1].read_text())["bad"]}
    return text, kinds, out


@pytest.fixture(scope="module")
def scan_run(hostile_src) -> dict[str, str]:
    proc = run_hostile(["scan", str(hostile_src), "--json", "--workers", "2"])
    assert_named_error(proc, codes=[65])
    return {os.path.basename(b["path"]): b["kind"] for b in json.loads(proc.stdout)["bad"]}


@pytest.mark.parametrize("name", sorted(_expected()))
def test_convert_lists_hostile_source_with_its_kind(convert_run, name):
    text, kinds, out = convert_run
    assert name in text  # named in the one error message
    assert kinds.get(name) == _expected()[name], kinds
    assert not (out / MANIFEST_NAME).exists()  # nothing published


@pytest.mark.parametrize("name", sorted(_expected()))
def test_scan_lists_hostile_source_with_its_kind(scan_run, name):
    assert scan_run.get(name) == _expected()[name], scan_run


def test_convert_max_bad_publishes_only_the_good_samples(hostile_src, tmp_path):
    out = tmp_path / "out"
    n_bad = len(_expected())
    proc = run_hostile(["convert", str(hostile_src), str(out), "--size", "16x16", "--max-bad", str(n_bad), "-q"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    import readers

    keys = sorted(r.key for r in readers.open(out).records("train"))
    assert keys == sorted(f"train/{p.name}" for p in (hostile_src / "train").iterdir()
                          if p.name not in HOSTILE_IMAGES and p.name.replace(".png", "_L.png") not in HOSTILE_MASKS)


def test_preview_of_hostile_sources_captions_every_bad_file(hostile_src, tmp_path):
    sheet = tmp_path / "sheet.png"
    proc = run_hostile(["preview", str(hostile_src), "-o", str(sheet), "-n", "50"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert Image.open(sheet).size[0] > 0
    code = ("import json; from converter.options import SourceSpec; from converter.inspect.preview import PreviewOptions, "
            "source_samples; _, s = source_samples(SourceSpec(root=%r), PreviewOptions(n=50), 10**8); "
            "print(json.dumps({x.key: x.error for x in s}))" % str(hostile_src))
    proc = run_hostile(code=code)
    assert proc.returncode == 0, proc.stderr
    captions = json.loads(proc.stdout)
    for name, kind in _expected().items():
        key = "train/" + name.replace("_L.png", ".png")
        if kind in ("unreadable", "empty_file"):  # discovery drops these: never decoded, never shown
            assert key not in captions
            continue
        assert captions[key] is not None and captions[key].startswith(f"[{kind}]"), (name, captions[key])


# --- item 2: a short image-data stream, and a header claiming more than the data can hold


@pytest.mark.parametrize("fast", [True, False], ids=["fast_path", "pillow"])
@pytest.mark.parametrize("as_mask", [False, True], ids=["image", "mask"])
def test_png_short_zlib_stream_is_truncated_not_padded_with_black(fast, as_mask, monkeypatch):
    if not fast:
        monkeypatch.setattr(png, "available", lambda: False)
    data = short_stream(Png(width=W, height=H, color_type=0 if as_mask else 2, seed=8), 20)
    with pytest.raises(DecodeError) as e:
        (decode_mask if as_mask else decode_image)(SourceFile("short.png", data, None), MAX_PIXELS)  # type: ignore[arg-type]
    assert e.value.kind == "truncated" and "20 of 32 rows" in e.value.reason


@pytest.mark.parametrize("interlace", [0, 1])
def test_png_complete_stream_still_decodes_equal_to_pillow(interlace):
    import io

    data = Png(width=W, height=H, color_type=2, seed=10, interlace=interlace).bytes()
    got = decode_image(SourceFile("ok.png", data, None), MAX_PIXELS)  # type: ignore[arg-type]
    np.testing.assert_array_equal(got, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_png_ihdr_9000x9000_in_429_bytes_is_refused_before_allocating():
    data = ihdr_bomb(9000, 9000)
    assert len(data) < 429
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as e:
            decode_image(SourceFile("bomb.png", data, None), MAX_PIXELS)  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.kind == "truncated" and "9000x9000" in e.value.reason
    assert peak < 8 * 1024**2, f"{peak} bytes allocated for a {len(data)}-byte file"


def test_png_highly_compressible_but_genuine_image_is_not_refused_by_the_ratio_bound():
    data = Png(width=1500, height=1200, color_type=2, rows=bytes((1 + 4500) * 1200)).bytes()
    assert len(data) * 1000 < 1500 * 1200 * 3  # over 1000:1, as flat real images compress
    assert decode_image(SourceFile("flat.png", data, None), MAX_PIXELS).shape == (1200, 1500, 3)  # type: ignore[arg-type]


# --- item 5: only regular files are opened as sources


def _read_source_in_child(path: str) -> subprocess.CompletedProcess:
    """read_source(path) in a child with the hostile limits (a FIFO would block, /dev/zero
    fill memory, if the regular-file check failed): prints 'KIND REASON'."""
    return run_hostile(code=(
        "from converter.transform.decode import read_source, DecodeError\n"
        f"try:\n    read_source({path!r}, 'x.png')\nexcept DecodeError as e:\n"
        "    print(e.kind, e.reason)\n"), timeout=30)


def test_source_swapped_for_a_fifo_after_discovery_is_unreadable_not_a_hang(tmp_path):
    fifo = tmp_path / "swapped.png"
    os.mkfifo(fifo)
    proc = _read_source_in_child(str(fifo))
    assert proc.returncode == 0 and proc.stdout.startswith("unreadable") and "FIFO" in proc.stdout, proc


def test_source_that_is_a_character_device_is_unreadable_not_read_forever():
    proc = _read_source_in_child("/dev/zero")
    assert proc.returncode == 0 and proc.stdout.startswith("unreadable") and "character device" in proc.stdout, proc


@pytest.mark.parametrize("what", ["fifo", "folder"])
def test_class_table_that_is_not_a_regular_file_is_named_not_a_hang(tmp_path, what):
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 2}, size=(H, W), seed=3, quirks=False)
    csv = Path(ds.class_dict_path)
    csv.unlink()
    os.mkfifo(csv) if what == "fifo" else csv.mkdir()
    proc = run_hostile(["convert", str(ds.root), str(tmp_path / "out"), "--size", "16x16"], timeout=60)
    assert_named_error(proc, "class_dict.csv", "not a regular file")


@pytest.mark.parametrize("how", ["found_beside_the_data", "given_as_classes"])
def test_names_file_that_is_a_fifo_is_named_or_passed_over_not_a_hang(tmp_path, how):
    from _annotations import make_labelme

    exp = make_labelme(tmp_path / "src")
    names = exp.root / "labels.txt"
    names.unlink()
    os.mkfifo(names)
    extra = ["--classes", str(names)] if how == "given_as_classes" else []
    proc = run_hostile(["convert", str(exp.root), str(tmp_path / "out"), "--size", "16x16", *extra], timeout=60)
    if how == "given_as_classes":
        assert_named_error(proc, "labels.txt", "not a regular file")
    else:  # a names file that is not a regular file is not a names file: the labels found name the classes
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_annotation_file_that_is_a_fifo_is_not_a_hang(tmp_path):
    from _annotations import make_coco

    exp = make_coco(tmp_path / "src")
    js = exp.root / "train" / "_annotations.coco.json"
    js.unlink()
    os.mkfifo(js)
    for command in (["scan", str(exp.root)], ["convert", str(exp.root), str(tmp_path / "out"), "--size", "16x16"]):
        proc = run_hostile(command, timeout=60)
        assert "Traceback (most recent call last)" not in proc.stdout + proc.stderr, proc.stderr[-3000:]


def test_spec_file_that_is_a_fifo_is_named_not_a_hang(tmp_path):
    spec = tmp_path / "spec.toml"
    os.mkfifo(spec)
    proc = run_hostile(["convert", "--spec", str(spec), str(tmp_path / "out"), "--size", "16x16"], timeout=60)
    assert_named_error(proc, "spec.toml", "not a regular file", codes=[65])


# --- item 7: output-folder faults


def test_output_path_that_is_a_file_exits_2(camvid_src, tmp_path):
    out = tmp_path / "out"
    out.write_text("not a folder")
    proc = run_hostile(["convert", str(camvid_src.root), str(out), "--size", "16x16"])
    assert_named_error(proc, str(out), "is a file", codes=[2])
    assert out.read_text() == "not a folder"


def test_output_path_that_is_a_broken_symlink_exits_2(camvid_src, tmp_path):
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "gone" / "dataset")
    proc = run_hostile(["convert", str(camvid_src.root), str(out), "--size", "16x16"])
    assert_named_error(proc, str(out), "is a broken symbolic link", codes=[2])


def test_output_parent_that_is_a_file_exits_2(camvid_src, tmp_path):
    parent = tmp_path / "parent"
    parent.write_text("x")
    proc = run_hostile(["convert", str(camvid_src.root), str(parent / "out"), "--size", "16x16"])
    assert_named_error(proc, f"{parent} is a file", codes=[2])


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this process cannot write: a read-only tmpfs as root, mode 555 otherwise."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs: {done.stderr.decode().strip()}")
        yield folder
        subprocess.run(["umount", str(folder)], check=True)
    else:
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
        yield folder
        folder.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("where", ["itself", "inside"])
def test_read_only_output_folder_exits_74_in_one_line(camvid_src, read_only_folder, where):
    out = read_only_folder if where == "itself" else read_only_folder / "out"
    proc = run_hostile(["convert", str(camvid_src.root), str(out), "--size", "16x16"])
    text = assert_named_error(proc, f"cannot write to the output folder {out}", codes=[74])
    assert len(text.strip().splitlines()) <= 2, text  # the detected-task line, then the one error line


# --- item 9: runs with nothing to convert


def test_empty_source_folders_exit_65_and_publish_nothing(tmp_path, camvid_src):
    src = tmp_path / "empty"
    (src / "train").mkdir(parents=True)
    (src / "train_labels").mkdir()
    shutil.copy(camvid_src.class_dict_path, src / "class_dict.csv")
    proc = run_hostile(["convert", str(src), str(tmp_path / "out"), "--size", "16x16"])
    assert_named_error(proc, "nothing to convert", "no source images", codes=[65])
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_every_source_bad_under_max_bad_exits_65_and_publishes_nothing(tmp_path, camvid_src):
    src = tmp_path / "bad"
    (src / "train").mkdir(parents=True)
    (src / "train_labels").mkdir()
    shutil.copy(camvid_src.class_dict_path, src / "class_dict.csv")
    for i in range(2):
        (src / "train" / f"{i}.png").write_bytes(short_stream(_image(seed=i), 4))
        (src / "train_labels" / f"{i}_L.png").write_bytes(b"junk")
    proc = run_hostile(["convert", str(src), str(tmp_path / "out"), "--size", "16x16", "--max-bad", "10"])
    assert_named_error(proc, "every source is bad", "0.png", "1_L.png", codes=[65])
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()
    scan = run_hostile(["scan", str(src), "--json"])  # scan's verdict agrees: no flag makes it succeed
    assert scan.returncode == 65 and json.loads(scan.stdout)["verdict"]["status"] == "no_data", scan.stdout[-2000:]


def test_nothing_new_on_an_existing_dataset_still_exits_0(tmp_path, camvid_src):
    out = tmp_path / "out"
    args = ["convert", str(camvid_src.root), str(out), "--size", "16x16", "--workers", "1"]
    assert run_hostile(args).returncode == 0
    proc = run_hostile(args)
    assert proc.returncode == 0 and "Nothing new" in proc.stderr, proc.stderr


def test_split_labels_that_is_a_file_is_one_named_error(tmp_path):
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 3}, size=(H, W), seed=4, quirks=False)
    labels = Path(ds.root) / "train_labels"
    shutil.rmtree(labels)
    labels.write_text("oops")
    for command in (["convert", str(ds.root), str(tmp_path / "out"), "--size", "16x16"], ["scan", str(ds.root)]):
        text = assert_named_error(run_hostile(command), f"{labels} is a file, not a folder of masks", codes=[65])
        assert "image without mask" not in text


@pytest.mark.parametrize("where", ["folder", "read_only"])
def test_preview_output_that_cannot_be_written_is_one_named_error(camvid_src, read_only_folder, where):
    target = read_only_folder if where == "folder" else read_only_folder / "sheet.png"
    proc = run_hostile(["preview", str(camvid_src.root), "-o", str(target)])
    assert_named_error(proc, str(target), codes=[2] if where == "folder" else [74])


# --- class folders: the same damaged files among classification sources

CLASS_HOSTILE = ("short_stream.png", "ihdr_9000x9000.png", "row_filter_17.png", "bad_crc_ancillary.png",
                 "not_png_text.png", "zero_bytes.png", "fifo.png", "symlink_loop.png", "dangling_link.png")


@pytest.fixture(scope="module")
def hostile_class_src(tmp_path_factory) -> Path:
    ds = synth.make_classification(tmp_path_factory.mktemp("hostile-cls") / "src", per_class={"train": 2, "val": 1}, seed=5)
    root = Path(ds.root)
    for name in CLASS_HOSTILE:
        _plant(root / "train" / "cat" / name, HOSTILE_IMAGES[name][0])
    return root


@pytest.mark.parametrize("command", ["convert", "scan"])
def test_class_folders_list_every_hostile_image_with_its_kind(hostile_class_src, tmp_path, command):
    if command == "convert":
        out = tmp_path / "out"
        proc = run_hostile(["convert", str(hostile_class_src), str(out), "--size", "16x16"])
        assert_named_error(proc, *CLASS_HOSTILE, codes=[65])
        bad = json.loads(sorted((out / "reports").glob("convert-*.json"))[-1].read_text())["bad"]
    else:
        proc = run_hostile(["scan", str(hostile_class_src), "--json"])
        assert_named_error(proc, codes=[65])
        bad = json.loads(proc.stdout)["bad"]
    kinds = {os.path.basename(b["path"]): b["kind"] for b in bad}
    assert kinds == {name: HOSTILE_IMAGES[name][1] for name in CLASS_HOSTILE}
