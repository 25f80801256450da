"""Issue 25, readers: every read path decodes a stored mask with the same strict rules.

A real conversion with PNG-encoded records (TFRecord none/gzip, NPZ), then one record's
mask bytes replaced inside the shard (framing, CRCs, manifest size and digest made right
again, so only the decoder can see the damage) by a mask no writer stores: 16-bit,
RGB, palette, grey+alpha, JPEG bytes, a PNG whose zlib stream holds 3 of its rows, an
interlaced PNG. Every path (`records()`, `keras_dataset()`, `tf_dataset()` unseeded
ordered and shuffled, seeded, and `verify --deep`) must refuse it with an error naming
the shard and the record, never hand out converted pixels or class 0 padding. A good
replacement (the same class map re-encoded by Pillow) reads back equal to Pillow's
decode of it on every path: the check refuses damage, not data.
"""

from __future__ import annotations

import io
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import readers
from converter.convert import convert
from converter.inspect.verify import verify
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.plan.fingerprint import digest_file
from converter.testing import synth
from readers.errors import ShardError
from readers.formats.tfrecord import wire
from readers.manifest import MANIFEST_NAME, Manifest, SplitEntry

sys.path.insert(0, str(Path(__file__).parent))
from _pngcraft import Png, textured_rows  # noqa: E402

tf = pytest.importorskip("tensorflow")

SIZE = (24, 32)  # (height, width) of every record
BAD = 2  # the record whose mask is replaced


def _class_map(seed: int) -> np.ndarray:
    """A textured class map (blocks of classes 0-4 plus some ignore pixels)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 5, (SIZE[0] // 4 + 1, SIZE[1] // 4 + 1))
    cmap = np.kron(coarse, np.ones((4, 4), np.int64))[: SIZE[0], : SIZE[1]]
    cmap[rng.random(SIZE) < 0.05] = 255
    return cmap.astype(np.uint8)


def _pil_png(array: np.ndarray, mode: str | None = None, **save) -> bytes:
    out = io.BytesIO()
    (Image.fromarray(array, mode) if mode else Image.fromarray(array)).save(out, format="PNG", **save)
    return out.getvalue()


def _bad_mask(kind: str) -> bytes:
    h, w = SIZE
    rng = np.random.default_rng(7)
    cmap = _class_map(3)
    if kind == "16bit":
        return _pil_png((cmap.astype(np.uint16) * 300 + rng.integers(0, 200, SIZE)).astype(np.uint16))
    if kind == "rgb":
        return _pil_png(np.stack([cmap, cmap * 2, rng.integers(0, 256, SIZE, dtype=np.uint8)], -1))
    if kind == "palette":
        pil = Image.fromarray(cmap % 5, "P")
        pil.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0, 0, 0, 128] + [0] * 735)
        out = io.BytesIO()
        pil.save(out, format="PNG")
        return out.getvalue()
    if kind == "grey_alpha":
        return _pil_png(np.stack([cmap, rng.integers(0, 256, SIZE, dtype=np.uint8)], -1), "LA")
    if kind == "jpeg":
        out = io.BytesIO()
        Image.fromarray(cmap, "L").save(out, format="JPEG", quality=95)
        return out.getvalue()
    if kind == "short":  # a complete zlib stream holding 3 of the 24 rows
        return Png(width=w, height=h, color_type=0, rows=textured_rows(w, h, 0, 5)[: 3 * (w + 1)]).bytes()
    if kind == "interlaced":
        return Png(width=w, height=h, color_type=0, interlace=1, seed=4).bytes()
    raise AssertionError(kind)


BAD_KINDS = ("16bit", "rgb", "palette", "grey_alpha", "jpeg", "short", "interlaced")
FORMATS = (("tfrecord", "none"), ("tfrecord", "gzip"), ("npz", "deflate"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """One PNG-encoded conversion per (format, compression), kept pristine (tests copy it)."""
    root = tmp_path_factory.mktemp("strict")
    src = synth.make_camvid(root / "src", splits={"train": 6}, size=[(48, 64)], seed=21)
    out = {}
    for fmt, compression in FORMATS:
        folder = root / f"{fmt}-{compression}"
        convert(SourceSpec(root=str(src.root)), str(folder),
                OutputOptions(size=SIZE, image_encoding="png", format=fmt, compression=compression),
                RunOptions(workers=1, shard_size_bytes=1 << 20))
        out[(fmt, compression)] = folder
    return out


def _copy(folder: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(folder, dest)
    return dest


def _replace_mask(out: Path, index: int, mask: bytes) -> str:
    """Put `mask` as record `index`'s stored mask in the first train shard (valid framing,
    CRCs, manifest size and digest); returns the shard path."""
    m = Manifest.load(out)
    shard = m.shards("train")[0]
    path = out / shard.file
    if m.format == "tfrecord":
        examples = [wire.decode_example(p) for p in wire.iter_records(str(path), compression=m.compression)]
        with open(path, "wb") as f:
            writer = wire.TFRecordWriter(f, m.compression)
            for i, ex in enumerate(examples):
                features = {k: v[0] for k, v in ex.items()}
                if i == index:
                    features["mask"] = mask
                writer.write(wire.encode_example(features))
            writer.close()
    else:
        with np.load(path, allow_pickle=False) as z:
            members = {k: z[k] for k in z.files}
        data, offsets = members["mask_bytes"], members["mask_offsets"]
        parts = [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]
        parts[index] = mask
        members["mask_bytes"] = np.frombuffer(b"".join(parts), np.uint8)
        members["mask_offsets"] = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(offsets.dtype)
        with open(path, "wb") as f:
            np.savez_compressed(f, **members)
    import dataclasses

    shards = tuple(dataclasses.replace(s, bytes=os.path.getsize(path), digest=digest_file(str(path)))
                   if s.file == shard.file else s for s in m.shards("train"))
    splits = {**m.splits, "train": SplitEntry(shards, m.splits["train"].next_shard_index)}
    (out / MANIFEST_NAME).write_text(m.replace(splits=splits).dumps())
    return str(path)


def wire_or_npz_masks(out: Path) -> list[bytes]:
    """The stored mask bytes of the first train shard, read without imgshard's readers."""
    m = Manifest.load(out)
    path = out / m.shards("train")[0].file
    if m.format == "npz":
        with np.load(path, allow_pickle=False) as z:
            data, offsets = z["mask_bytes"], z["mask_offsets"]
            return [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]
    features = {"mask": tf.io.FixedLenFeature([], tf.string)}
    compression = "GZIP" if m.compression == "gzip" else ""
    return [tf.io.parse_single_example(r, features)["mask"].numpy()
            for r in tf.data.TFRecordDataset(str(path), compression_type=compression)]


def _tf_paths(ds):
    """Each tf.data configuration: (name, dataset)."""
    yield "ordered", ds.tf_dataset("train", 2, shuffle=False)
    yield "shuffled-unseeded", ds.tf_dataset("train", 2, shuffle=True)
    yield "seeded", ds.tf_dataset("train", 2, shuffle=True, seed=3)
    yield "compact", ds.tf_dataset("train", 2, shuffle=False, one_hot=False, normalize=False)


@pytest.mark.parametrize("kind", BAD_KINDS)
@pytest.mark.parametrize(("fmt", "compression"), FORMATS, ids=["-".join(f) for f in FORMATS])
def test_bad_stored_mask_is_the_same_named_error_on_every_read_path(converted, fmt, compression, kind, tmp_path):
    out = _copy(converted[(fmt, compression)], tmp_path / "out")
    path = _replace_mask(out, BAD, _bad_mask(kind))
    ds = readers.open(out)
    where = f"shard {path}, record {BAD}: mask"
    with pytest.raises(ShardError, match=f"record {BAD}: mask") as e:
        list(ds.records("train"))
    assert (e.value.path, e.value.record) == (path, BAD)
    message = str(e.value)
    seq = ds.keras_dataset("train", 1, shuffle=False)
    with pytest.raises(ShardError) as e:
        seq[BAD]
    assert str(e.value) == message
    for name, pipeline in _tf_paths(ds):
        with pytest.raises(tf.errors.OpError) as e:
            for _ in pipeline:
                pass
        assert where in str(e.value), (name, str(e.value)[:400])
        assert message.split(": ", 1)[1] in str(e.value), name
    report = verify(str(out), deep=True)
    assert not report.ok
    assert any(p.record == BAD and "mask" in str(p) for p in report.errors), [str(p) for p in report.errors]


@pytest.mark.parametrize(("fmt", "compression"), FORMATS, ids=["-".join(f) for f in FORMATS])
def test_a_good_replacement_mask_reads_back_as_pillow_decodes_it_on_every_path(converted, fmt, compression, tmp_path):
    out = _copy(converted[(fmt, compression)], tmp_path / "out")
    stored = next(r for i, r in enumerate(wire_or_npz_masks(out)) if i == BAD)
    with Image.open(io.BytesIO(stored)) as pil:  # the class map as Pillow decodes the writer's bytes
        cmap = np.asarray(pil).copy()
    assert len(np.unique(cmap)) > 1
    _replace_mask(out, BAD, _pil_png(cmap, "L", compress_level=9, optimize=True))  # other bytes, same pixels
    ds = readers.open(out)
    recs = list(ds.records("train"))
    np.testing.assert_array_equal(recs[BAD].mask, cmap)
    seq = ds.keras_dataset("train", 1, shuffle=False, one_hot=False, normalize=False)
    np.testing.assert_array_equal(seq[BAD][1][0], cmap)
    for name, pipeline in _tf_paths(ds):
        if name != "compact":
            continue
        ys = np.concatenate([y.numpy() for _, y in pipeline])
        np.testing.assert_array_equal(ys[BAD], cmap)
    assert verify(str(out), deep=True).ok


def test_short_png_mask_is_refused_not_padded_with_class_0(tmp_path):
    """The rule itself, on a hand-built PNG: Pillow alone pads rows 3-23 with 0."""
    from readers.formats.pngmask import check_mask_png

    data = _bad_mask("short")
    with Image.open(io.BytesIO(data)) as pil:
        pil.load()
        padded = np.asarray(pil)
    assert padded[3:].max() == 0 and padded[:3].max() > 0  # what the readers used to hand out
    with pytest.raises(ValueError, match=r"truncated PNG: its image data ends after 99 of the 792 bytes"):
        check_mask_png(data, SIZE[0], SIZE[1], 8)
    whole = Png(width=SIZE[1], height=SIZE[0], color_type=0, seed=5).bytes()
    assert check_mask_png(whole, SIZE[0], SIZE[1], 8) is None
    longer = Png(width=SIZE[1], height=SIZE[0], color_type=0, rows=textured_rows(SIZE[1], SIZE[0] + 2, 0, 5)).bytes()
    with pytest.raises(ValueError, match="more image data"):
        check_mask_png(longer, SIZE[0], SIZE[1], 8)
    liar = Png(width=SIZE[1], height=SIZE[0], color_type=0, header_size=(SIZE[1], 4000)).bytes()
    assert struct.unpack(">I", liar[20:24])[0] == 4000
    with pytest.raises(ValueError, match="is 32x4000, the manifest says 32x24"):
        check_mask_png(liar, SIZE[0], SIZE[1], 8)


@pytest.mark.parametrize("kind", [k for k in BAD_KINDS if k != "short"])
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_tensorflow_engine_refuses_the_same_masks_naming_shard_and_record(converted, compression, kind, tmp_path,
                                                                          monkeypatch):
    """`ENGINE = "tf"` (TensorFlow's reader and decoders, a tuning switch) checks the PNG
    header of every mask in the graph: the same refusals, naming shard and record. (A
    short zlib stream fails inside `decode_png` itself, unnamed: that engine cannot
    count inflated bytes; the default engine names it, above.)"""
    from readers.formats.tfrecord import reader as tfrecord_reader

    monkeypatch.setattr(tfrecord_reader, "ENGINE", "tf")
    out = _copy(converted[("tfrecord", compression)], tmp_path / "out")
    path = _replace_mask(out, BAD, _bad_mask(kind))
    ds = readers.open(out)
    for shuffle in (False, True):
        with pytest.raises(tf.errors.OpError) as e:
            for _ in ds.tf_dataset("train", 2, shuffle=shuffle):
                pass
        assert f"shard {path}, record {BAD}: mask is not the 32x24 8-bit greyscale PNG class map" in str(e.value)


def test_tensorflow_engine_reads_good_masks_like_records(converted, monkeypatch):
    from readers.formats.tfrecord import reader as tfrecord_reader

    ds = readers.open(converted[("tfrecord", "gzip")])
    want = np.stack([r.mask for r in ds.records("train")])
    monkeypatch.setattr(tfrecord_reader, "ENGINE", "tf")
    got = np.concatenate([y.numpy() for _, y in ds.tf_dataset("train", 4, shuffle=False, one_hot=False,
                                                                 normalize=False)])
    np.testing.assert_array_equal(got, want)
