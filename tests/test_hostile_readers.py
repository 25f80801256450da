"""Damaged and hostile datasets against the readers, `verify` and `inspect` (issue 12, reader side).

Each case ends in a named error (the file and the reason), never a traceback, a hang,
a multi-GB allocation or wrong data. Hostile cases run in a child process through
`tests/_hostile.py` (timeout, address-space limit); the NPZ inflate cases read valid
data and compare it with `np.load`.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import xxhash

import readers
from _hostile import assert_named_error, run_hostile
from converter.testing import synth
from converter.inspect.describe import describe
from converter.inspect.verify import verify
from readers.formats.npz.writer import write_npz_member
from readers.formats.npz import reader as npz_reader
from readers.manifest import MANIFEST_NAME
from tests._cron import assert_whole, convert_args, run_cli
from tests._shards import write_dataset

INFLATERS = ["isal", "zlib"]


# -- helpers ---------------------------------------------------------------------------------------

def _npz_dataset(root: Path, **kw) -> Path:
    write_dataset(root, "npz", splits={"train": 6, "val": 3}, records_per_shard=3, height=24, width=20, **kw)
    return root


def _read_all_code(path: Path) -> str:
    """A child that opens `path` with readers.open and reads every record; a reader error
    is printed as one line (exit 3), anything else is a traceback (the test fails)."""
    return (
        "import sys, readers\n"
        "try:\n"
        f"    ds = readers.open({str(path)!r})\n"
        "    n = sum(1 for split in ds.splits for _ in ds.records(split))\n"
        "except (readers.ManifestError, readers.ShardError) as e:\n"
        "    print(type(e).__name__ + ': ' + str(e)); sys.exit(3)\n"
        "print('read', n, 'records')\n"
    )


def _assert_refused_everywhere(out: Path, *needles: str, inspect: bool = True) -> None:
    """readers.open (+ records), `imgshard verify`, `verify --deep` and `imgshard inspect` all
    end in a named error holding every needle."""
    assert_named_error(run_hostile(code=_read_all_code(out)), *needles)
    for args in (["verify", str(out)], ["verify", "--deep", str(out)]) + ((["inspect", str(out)],) if inspect else ()):
        text = assert_named_error(run_hostile(args), *needles)
        assert len(text.strip().splitlines()) <= 3, text  # a short report, not a dump


def _edit_manifest(out: Path, edit) -> None:
    doc = json.loads((out / MANIFEST_NAME).read_text())
    text = edit(doc)
    (out / MANIFEST_NAME).write_text(text if isinstance(text, str) else json.dumps(doc))


def _set(path: str, value):
    """An edit setting doc[path...] (dotted, list indices as ints) to `value`."""
    def edit(doc):
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = doc
        for p in parents:
            node = node[p]
        node[last] = value
    return edit


def _raw(path: str, raw: str):
    """An edit that writes `raw` JSON text (1e400, NaN, 5000 digits) at doc[path]."""
    def edit(doc):
        _set(path, "@@RAW@@")(doc)
        return json.dumps(doc).replace('"@@RAW@@"', raw)
    return edit


# -- item 1: ISA-L hands out a member's last bytes on a further call -------------------------------

class _Recording:
    """The inflater module (ISA-L or zlib) as the reader uses it, counting the bytes that
    came from a call with no input (what the old reader took for an error)."""

    def __init__(self, module):
        self.module, self.held_back = module, 0
        self.error, self.crc32 = module.error, module.crc32

    def decompressobj(self, *args):
        inner, outer = self.module.decompressobj(*args), self

        class Obj:
            def decompress(self, data, limit=0):
                out = inner.decompress(data, limit)
                if not len(data):
                    outer.held_back += len(out)
                return out

            def __getattr__(self, name):
                return getattr(inner, name)

        return Obj()


def _inflater(name: str):
    if name == "isal":
        from isal import isal_zlib
        return isal_zlib
    return zlib


def _write_members(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, arr in arrays.items():
            write_npz_member(zf, name, arr, compress=True)  # the converter's own encoder


@pytest.mark.parametrize("inflater", INFLATERS)
def test_npz_member_whose_last_bytes_come_from_a_further_inflate_call_reads_whole(inflater, tmp_path, monkeypatch):
    # 16 street-scene masks of 512x512 (4 MiB + a 128-byte header): at deflate level 1, ISA-L
    # returns exactly 4 MiB while the input lasts and the last 128 bytes only when asked again.
    rng = np.random.default_rng(0)
    masks = np.stack([synth.random_mask(512, 512, 5, rng) for _ in range(16)])
    path = tmp_path / "train-00000.npz"
    _write_members(path, {"masks": masks})
    recording = _Recording(_inflater(inflater))
    monkeypatch.setattr(npz_reader, "_inflater", recording)
    got = npz_reader.read_npz(str(path), ["masks"], check_crc=True)["masks"]
    np.testing.assert_array_equal(got, np.load(path)["masks"])
    if inflater == "isal":
        assert recording.held_back == 128, "the data no longer reproduces ISA-L's held-back bytes"


@pytest.mark.parametrize("inflater", INFLATERS)
def test_npz_members_inflate_whole_at_any_chunk_size(inflater, tmp_path, monkeypatch):
    # Chunk sizes that make output limits fall on every kind of boundary.
    rng = np.random.default_rng(1)
    masks = np.stack([synth.random_mask(96, 128, 7, rng) for _ in range(6)])
    images = np.stack([synth.textured_image(96, 128, rng) for _ in range(6)])
    path = tmp_path / "s.npz"
    _write_members(path, {"images": images, "masks": masks})
    monkeypatch.setattr(npz_reader, "_inflater", _Recording(_inflater(inflater)))
    reference = np.load(path)
    for chunk in (1, 7, 64, 333, 1024, 4096, 16384, 65536):
        monkeypatch.setattr(npz_reader, "INFLATE_CHUNK_BYTES", chunk)
        got = npz_reader.read_npz(str(path), ["images", "masks"], check_crc=True)
        np.testing.assert_array_equal(got["images"], reference["images"])
        np.testing.assert_array_equal(got["masks"], reference["masks"])


@pytest.mark.slow
def test_512x512_deflated_npz_conversion_reads_back_whole(tmp_path, monkeypatch):
    """The issue's case: a dataset converted at 512x512 to the default deflated NPZ reads back
    whole through records() (equal to np.load) and passes verify --deep."""
    src = synth.make_camvid(tmp_path / "src", splits={"train": 8, "val": 4}, size=[(512, 512)], seed=3)
    out = tmp_path / "out"
    assert run_cli(convert_args(src.root, out, "--format", "npz", size="512x512", workers=2)) == 0
    recording = _Recording(_inflater("isal"))
    monkeypatch.setattr(npz_reader, "_inflater", recording)
    assert_whole(out)
    assert recording.held_back > 0, "no member of this dataset had bytes held back: the case is not covered"
    ds = readers.open(out)
    for split in ds.splits:
        for ref in ds.shards(split):
            with np.load(ref.path) as ref_arrays:
                images, masks, keys = ref_arrays["images"], ref_arrays["masks"], ref_arrays["keys"]
            records = list(ds._adapter.iter_shard(ref, ds._spec))
            assert [r.key for r in records] == [str(k) for k in keys]
            np.testing.assert_array_equal(np.stack([r.image for r in records]), images)
            np.testing.assert_array_equal(np.stack([r.mask for r in records]), masks)


def _relist(path: Path) -> None:
    """Update the manifest's size and digest of shard `path` after the test rewrote it, so
    that only the damage the test planted is wrong (as if a faulty writer published it)."""
    def edit(doc):
        for split in doc["splits"].values():
            for shard in split["shards"]:
                if shard["file"] == path.name:
                    shard["bytes"] = path.stat().st_size
                    shard["digest"] = "xxh3_128:" + xxhash.xxh3_128(path.read_bytes()).hexdigest()
    _edit_manifest(path.parent, edit)


# -- item 3: sizes from the zip directory are checked before allocating ----------------------------

def _patch_central_size(path: Path, member: str, *, file_size: int | None = None,
                        compress_size: int | None = None) -> None:
    """Rewrite the sizes the zip central directory claims for `member` (32-bit fields)."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_len = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46:at + 46 + name_len].decode() == member:
            if compress_size is not None:
                struct.pack_into("<I", data, at + 20, compress_size)
            if file_size is not None:
                struct.pack_into("<I", data, at + 24, file_size)
            path.write_bytes(bytes(data))
            _relist(path)
            return
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"{member} not in {path}")


def test_npz_directory_claiming_a_4gb_member_is_a_named_error_not_an_allocation(tmp_path):
    out = _npz_dataset(tmp_path / "ds")
    _patch_central_size(out / "train-00000.npz", "masks.npy", file_size=0xFFFFFFF0)
    needles = ("train-00000.npz", "masks.npy", "4294967280")
    _assert_refused_everywhere(out, *needles, inspect=False)  # inspect reads no shard


def test_npz_directory_claiming_compressed_bytes_past_the_end_is_a_named_error(tmp_path):
    out = _npz_dataset(tmp_path / "ds")
    _patch_central_size(out / "val-00000.npz", "images.npy", compress_size=0x7FFFFFF0)
    assert_named_error(run_hostile(code=_read_all_code(out)), "val-00000.npz", "images.npy", "past the end")
    assert_named_error(run_hostile(["verify", "--deep", str(out)]), "val-00000.npz")


def test_npz_claim_within_deflate_bounds_but_beyond_the_manifest_shape_is_refused(tmp_path):
    out = _npz_dataset(tmp_path / "ds")
    path = out / "train-00001.npz"
    with zipfile.ZipFile(path) as zf:
        compressed = zf.getinfo("images.npy").compress_size
    _patch_central_size(path, "images.npy", file_size=compressed * 500)
    with pytest.raises(readers.ShardError, match="manifest's record count and shape allow"):
        list(readers.open(out).records("train"))


# -- items 4 and 11: damaged manifests -------------------------------------------------------------

DAMAGED_MANIFESTS = {
    "deeply_nested_json": lambda doc: "[" * 200_000 + "]" * 200_000,
    "float_1e400": _raw("splits.train.shards.0.bytes", "1e400"),
    "nan": _raw("image.height", "NaN"),
    "integer_of_5000_digits": _raw("splits.train.shards.0.records", "9" * 5000),
    "splits_is_a_list_of_numbers": _set("splits", [1]),
    "shards_is_a_number": _set("splits.train.shards", 7),
    "records_is_a_string": _set("splits.train.shards.0.records", "3"),
    "records_is_a_fraction": _set("splits.train.shards.0.records", 2.5),
    "records_is_negative": _set("splits.train.shards.0.records", -1),
    "records_is_boolean": _set("splits.train.shards.0.records", True),
    "image_of_1e9_by_1e9_pixels": _set("image", {"height": 10**9, "width": 10**9, "channels": 3, "dtype": "uint8"}),
    # 1..16 channels are legal since images beyond 8-bit RGB (issue 28): 17 is past the schema
    "image_with_17_channels": _set("image.channels", 17),
    "image_of_float_dtype": _set("image.dtype", "float64"),
    "class_colour_out_of_range": _set("classes.0.color", [0, 300, 0]),
    "version_is_boolean": _set("imgshard_manifest", True),
    "not_an_object": lambda doc: "[1, 2, 3]",
}


@pytest.mark.parametrize("case", sorted(DAMAGED_MANIFESTS) + ["not_utf8"])
def test_damaged_manifest_is_a_manifest_error_in_readers_verify_and_inspect(case, tmp_path):
    out = _npz_dataset(tmp_path / "ds")
    if case == "not_utf8":
        (out / MANIFEST_NAME).write_bytes(b'{"imgshard_manifest": 2, "task": "\xff"}')
    else:
        _edit_manifest(out, DAMAGED_MANIFESTS[case])
    proc = run_hostile(code=_read_all_code(out))
    assert_named_error(proc, "ManifestError", MANIFEST_NAME)
    for args in (["verify", str(out)], ["inspect", str(out)]):
        text = assert_named_error(run_hostile(args), MANIFEST_NAME, codes=[1])
        assert len(text.strip().splitlines()) == 1, text


def test_manifest_that_is_a_folder_is_a_manifest_error(tmp_path):
    out = tmp_path / "ds"
    (out / MANIFEST_NAME).mkdir(parents=True)
    _assert_refused_everywhere(out, MANIFEST_NAME, "folder")


def test_manifest_that_is_a_fifo_is_refused_without_hanging(tmp_path):
    out = tmp_path / "ds"
    out.mkdir()
    os.mkfifo(out / MANIFEST_NAME)
    _assert_refused_everywhere(out, MANIFEST_NAME, "FIFO")


def test_manifest_schema_error_names_the_field_and_what_was_received(tmp_path):
    out = _npz_dataset(tmp_path / "ds")
    _edit_manifest(out, _set("splits.train.shards.0.records", "3"))
    with pytest.raises(readers.ManifestError, match=r"splits\.train\.shards\[0\]\.records must be an integer.*'3'"):
        readers.open(out)


def _rewrite_npz_with_header(path: Path, member: str, old: bytes, new: bytes) -> None:
    """Rewrite shard `path` with `member`'s .npy header text changed from `old` to `new`
    (same length; CRCs recomputed, so only the header is wrong), and the manifest's size
    and digest of it updated."""
    with zipfile.ZipFile(path) as zf:
        members = {info.filename: zf.read(info) for info in zf.infolist()}
    assert members[member].count(old) == 1 and len(old) == len(new)
    members[member] = members[member].replace(old, new)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    _relist(path)


def test_npz_header_shape_with_minus_one_is_refused_by_readers_and_verify(tmp_path):
    out = _npz_dataset(tmp_path / "ds", compression="none")
    _rewrite_npz_with_header(out / "train-00000.npz", "images.npy", b"'shape': (3, 24, 20, 3), } ",
                             b"'shape': (-1, 24, 20, 3), }")  # one padding space less
    assert verify(out).errors, "verify must refuse it"
    assert_named_error(run_hostile(code=_read_all_code(out)), "train-00000.npz", "negative dimension")
    assert_named_error(run_hostile(["verify", str(out)]), "train-00000.npz", "negative dimension")


# -- item 5: FIFOs and other non-regular shard files ----------------------------------------------

@pytest.mark.parametrize("fmt", ["npz", "tfrecord"])
def test_shard_that_is_a_fifo_is_refused_without_hanging(fmt, tmp_path):
    out = tmp_path / "ds"
    write_dataset(out, fmt, splits={"train": 4}, records_per_shard=2)
    shard = sorted(out.glob("train-00001.*"))[0]
    shard.unlink()
    os.mkfifo(shard)
    _assert_refused_everywhere(out, shard.name, "FIFO", inspect=False)
    assert any("FIFO" in p for p in describe(out)["splits"]["train"]["problems"])


def test_shard_that_is_a_character_device_is_refused(tmp_path):
    out = _npz_dataset(tmp_path / "ds")
    (out / "val-00000.npz").unlink()
    (out / "val-00000.npz").symlink_to("/dev/zero")
    assert_named_error(run_hostile(code=_read_all_code(out)), "val-00000.npz")
    assert_named_error(run_hostile(["verify", str(out)]), "val-00000.npz")


# -- item 6: symlinks out of the dataset folder ----------------------------------------------------

def test_shard_symlinked_to_a_file_outside_the_dataset_is_refused(tmp_path):
    out = _npz_dataset(tmp_path / "ds")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shard = out / "train-00000.npz"
    shutil.move(shard, elsewhere / shard.name)  # same bytes: only the location is wrong
    shard.symlink_to(elsewhere / shard.name)
    _assert_refused_everywhere(out, "train-00000.npz", "outside the dataset folder", inspect=False)
    assert any("outside the dataset folder" in p for p in describe(out)["splits"]["train"]["problems"])


def test_shard_under_a_symlinked_sub_folder_leading_outside_is_refused(tmp_path):
    out = _npz_dataset(tmp_path / "ds")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(out / "val-00000.npz", elsewhere / "val-00000.npz")
    (out / "sub").symlink_to(elsewhere, target_is_directory=True)

    def edit(doc):
        doc["splits"]["val"]["shards"][0]["file"] = "sub/val-00000.npz"
    _edit_manifest(out, edit)
    _assert_refused_everywhere(out, "sub/val-00000.npz", "outside the dataset folder", inspect=False)


def test_symlinks_that_stay_inside_the_dataset_folder_are_read(tmp_path):
    real = _npz_dataset(tmp_path / "real")
    (real / "data").mkdir()
    shutil.move(real / "train-00000.npz", real / "data" / "train-00000.npz")
    (real / "train-00000.npz").symlink_to(Path("data") / "train-00000.npz")
    link = tmp_path / "current"
    link.symlink_to(real, target_is_directory=True)  # the dataset folder itself is a symlink
    assert sum(1 for _ in readers.open(link).records("train")) == 6
    assert verify(link, deep=True).ok


def test_readers_open_names_one_bad_shard_among_good_ones(tmp_path):
    out = _npz_dataset(tmp_path / "ds")
    os.unlink(out / "val-00000.npz")
    os.mkfifo(out / "val-00000.npz")
    with pytest.raises(readers.ShardError, match=r"val-00000\.npz is a FIFO"):
        readers.open(out)


# -- gzip TFRecord shards are inflated within what their records can hold -------------------------

def test_gzip_tfrecord_bomb_is_refused_by_random_access_without_inflating_it(tmp_path):
    out = tmp_path / "ds"
    write_dataset(out, "tfrecord", splits={"train": 4}, records_per_shard=2, compression="gzip")
    shard = out / "train-00000.tfrecord"
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    shard.write_bytes(b"".join(deflater.compress(zeros) for _ in range(256)) + deflater.flush())  # 256 MiB inside
    _relist(shard)
    seq = readers.open(out).keras_dataset("train", 1, shuffle=False)
    with pytest.raises(readers.ShardError, match=r"train-00000\.tfrecord.*inflates past \d+ bytes"):
        seq[0]
    assert seq[2][0].shape == (1, 16, 12, 3)  # the other shard still reads
