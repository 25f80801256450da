"""Differential tests: every reader path against an independent reference, on random datasets.

Shards are written by the converter's own encoders (`converter.write`), with random
sizes (1x1 up to 1024x2048), 1 to 300 records per shard, very or barely compressible
content, every format and compression, and mask kinds (uint8 and uint16 class maps,
one-hot planes, classification labels). The reference reads the files without imgshard:
`np.load` for NPZ, `tf.data.TFRecordDataset` + `tf.io.parse_example` for TFRecord, and
must give back exactly what was generated. Then every reader path must equal it:
`records()`, `tf_dataset()` (float32 + one-hot, and compact uint8), `keras_dataset()`
and `verify --deep`. NPZ shards are read with both inflaters the reader can use (ISA-L
and zlib: `readers.formats.npz._inflater`).

The unmarked tests are a fast random subset (small images); the sweep up to 1024x2048
is marked `slow`.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import readers
from converter.inspect.verify import verify
from converter.write.base import ShardWriter
from readers.formats.encoder import SampleArrays
from readers.formats.registry import encoder_for
from readers.formats.npz import reader as npz_reader
from readers.manifest import MANIFEST_NAME, ClassInfo, Manifest, SampleEntry, ShardEntry, SourceFingerprint, SplitEntry

tf = pytest.importorskip("tensorflow")

IGNORE8, IGNORE16 = 255, 65535
FORMATS = [("tfrecord", "none"), ("tfrecord", "gzip"), ("npz", "none"), ("npz", "deflate")]


@dataclass(frozen=True)
class Case:
    fmt: str
    compression: str
    height: int
    width: int
    records: tuple[int, ...]  # records per shard
    content: str  # "noise" (barely compressible) or "smooth" (very compressible)
    kind: str  # "class_map", "uint16", "onehot" or "classification"
    num_classes: int
    seed: int

    @property
    def id(self) -> str:
        return (f"{self.fmt}-{self.compression}-{self.height}x{self.width}-{'+'.join(map(str, self.records))}-"
                f"{self.content}-{self.kind}")


# -- generated truth ------------------------------------------------------------------------------

def _image(case: Case, rng: np.random.Generator) -> np.ndarray:
    h, w = case.height, case.width
    if case.content == "noise":
        return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:h, 0:w]
    base = xx[..., None] * rng.uniform(0, 3, 3) + yy[..., None] * rng.uniform(0, 3, 3) + rng.uniform(0, 255, 3)
    return (base.astype(np.int64) % 256).astype(np.uint8)


def _class_map(case: Case, rng: np.random.Generator) -> np.ndarray:
    h, w, c = case.height, case.width, case.num_classes
    dtype, ignore = (np.uint16, IGNORE16) if case.kind == "uint16" else (np.uint8, IGNORE8)
    if case.content == "noise":
        cmap = rng.integers(0, c, (h, w))
    else:
        block = int(rng.integers(1, max(2, min(h, w) // 2 + 1)))
        coarse = rng.integers(0, c, (h // block + 1, w // block + 1))
        cmap = np.kron(coarse, np.ones((block, block), np.int64))[:h, :w]
    cmap[rng.random((h, w)) < 0.03] = ignore
    return cmap.astype(dtype)


def _samples(case: Case, count: int, start: int, rng: np.random.Generator) -> list[SampleArrays]:
    out = []
    for i in range(start, start + count):
        key = f"train/{case.seed}-{i:06d}.png"
        image = _image(case, rng)
        if case.kind == "classification":
            out.append(SampleArrays(key, image, None, int(rng.integers(case.num_classes))))
            continue
        cmap = _class_map(case, rng)
        if case.kind == "onehot":
            mask = (cmap[..., None] == np.arange(case.num_classes)).astype(np.uint8)
        else:
            mask = cmap.astype(cmap.dtype.newbyteorder("<"))
        out.append(SampleArrays(key, image, mask, None))
    return out


def _class_counts(case: Case, samples: list[SampleArrays]) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    c = case.num_classes
    if case.kind == "classification":
        labels = np.bincount([s.label for s in samples], minlength=c)
        return tuple(int(v) for v in labels), 0, tuple(int(v) for v in labels)
    pixels, images, ignore = np.zeros(c, np.int64), np.zeros(c, np.int64), 0
    ignore_index = IGNORE16 if case.kind == "uint16" else IGNORE8
    for s in samples:
        cmap = s.mask.astype(np.int64)
        if case.kind == "onehot":
            cmap = np.where(s.mask.max(-1) == 0, IGNORE8, s.mask.argmax(-1))
        counts = np.bincount(cmap.ravel(), minlength=ignore_index + 1)
        pixels += counts[:c]
        images += counts[:c] > 0
        ignore += int(counts[ignore_index])
    return tuple(int(v) for v in pixels), ignore, tuple(int(v) for v in images)


def write_case(root: Path, case: Case, edit=None) -> list[SampleArrays]:
    """Write `case` with the converter's encoders and a manifest; returns the samples in order.
    `edit(shard_index, samples)`: damage a shard's samples before they are written."""
    rng = np.random.default_rng(case.seed)
    root.mkdir(parents=True)
    encoder = encoder_for(case.fmt)
    fingerprint = SourceFingerprint("x.png", 1, 1, "xxh3_128:" + "0" * 32)
    shards, truth = [], []
    for index, count in enumerate(case.records):
        samples = _samples(case, count, len(truth), rng)
        if edit is not None:
            samples = edit(index, samples)
        name = f"train-{index:05d}{encoder.suffix}"
        with ShardWriter(str(root), name, encoder, compression=case.compression, capacity=count) as writer:
            for sample in samples:
                writer.add(sample)
        pixels, ignore, images = _class_counts(case, samples)
        entries = tuple(SampleEntry(s.key, fingerprint, None if s.mask is None else fingerprint, s.label)
                        for s in samples)
        shards.append(ShardEntry(name, count, writer.result.bytes, writer.result.digest, pixels, ignore, entries,
                                 images))
        truth += samples
    segmentation = case.kind != "classification"
    manifest = Manifest(
        tool_version="test", task="segmentation" if segmentation else "classification", format=case.fmt,
        compression=case.compression, options={},
        image={"height": case.height, "width": case.width, "channels": 3, "dtype": "uint8"},
        mask={"dtype": "uint16" if case.kind == "uint16" else "uint8",
              "encoding": "onehot" if case.kind == "onehot" else "class_map",
              "ignore_index": IGNORE16 if case.kind == "uint16" else IGNORE8} if segmentation else None,
        classes=tuple(ClassInfo(f"c{i}", (i % 256, i // 256, 7) if segmentation else None)
                      for i in range(case.num_classes)),
        splits={"train": SplitEntry(tuple(shards), len(shards))},
    )
    (root / MANIFEST_NAME).write_text(manifest.dumps())
    return truth


# -- independent references -----------------------------------------------------------------------

def reference_records(root: Path, case: Case) -> list[tuple[str, np.ndarray, np.ndarray | int]]:
    """(key, image, mask or label) of every record, read without imgshard."""
    files = sorted(p for p in root.iterdir() if p.name.startswith("train-"))
    out = []
    if case.fmt == "npz":
        for path in files:
            with np.load(path, allow_pickle=False) as z:
                targets = z["labels"] if case.kind == "classification" else z["masks"]
                out += [(str(k), im, t if t.ndim else int(t)) for k, im, t in zip(z["keys"], z["images"], targets)]
        return out
    string, int64 = tf.io.FixedLenFeature([], tf.string), tf.io.FixedLenFeature([], tf.int64)
    features = {"image": string, "key": string, "height": int64, "width": int64,
                **({"label": int64} if case.kind == "classification" else {"mask": string})}
    mask_dtype = np.dtype("<u2") if case.kind == "uint16" else np.uint8
    mask_shape = (case.height, case.width) + ((case.num_classes,) if case.kind == "onehot" else ())
    compression = "GZIP" if case.compression == "gzip" else ""
    for batch in tf.data.TFRecordDataset([str(p) for p in files], compression_type=compression).batch(64):
        ex = {k: v.numpy() for k, v in tf.io.parse_example(batch, features).items()}
        for i in range(len(ex["key"])):
            assert (ex["height"][i], ex["width"][i]) == (case.height, case.width)
            image = np.frombuffer(ex["image"][i], np.uint8).reshape(case.height, case.width, 3)
            target = (int(ex["label"][i]) if case.kind == "classification"
                      else np.frombuffer(ex["mask"][i], mask_dtype).reshape(mask_shape))
            out.append((ex["key"][i].decode(), image, target))
    return out


def expected_xy(case: Case, images: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 x in [0, 1] and one-hot y (ignore index: an all-zero row), computed here."""
    x = images.astype(np.float32) * np.float32(1 / 255)
    c = case.num_classes
    if case.kind == "onehot":
        return x, targets.astype(np.float32)
    return x, (targets[..., None].astype(np.int64) == np.arange(c)).astype(np.float32)


# -- the comparison -------------------------------------------------------------------------------

def check_every_path(root: Path, case: Case, truth: list[SampleArrays], batch_size: int) -> None:
    ref = reference_records(root, case)
    assert [k for k, _, _ in ref] == [s.key for s in truth]
    for (_, image, target), sample in zip(ref, truth):
        np.testing.assert_array_equal(image, sample.image)
        np.testing.assert_array_equal(target, sample.label if sample.mask is None else sample.mask)
    images = np.stack([im for _, im, _ in ref])
    targets = np.stack([np.asarray(t) for _, _, t in ref])
    ds = readers.open(root)

    got = list(ds.records("train"))  # 1. records()
    assert [r.key for r in got] == [k for k, _, _ in ref]
    np.testing.assert_array_equal(np.stack([r.image for r in got]), images)
    np.testing.assert_array_equal(np.stack([np.asarray(r.label if r.mask is None else r.mask) for r in got]), targets)

    x_ref, y_ref = expected_xy(case, images, targets)
    for one_hot, normalize in ((True, True), (False, False)):  # 2. tf_dataset, both modes
        batches = list(ds.tf_dataset("train", batch_size, shuffle=False, one_hot=one_hot, normalize=normalize))
        assert len(batches) == -(-len(ref) // batch_size)
        x = np.concatenate([b[0].numpy() for b in batches])
        y = np.concatenate([b[1].numpy() for b in batches])
        np.testing.assert_array_equal(x, x_ref if normalize else images)
        np.testing.assert_array_equal(y, y_ref if one_hot else _compact(case, targets))

    seq = ds.keras_dataset("train", batch_size, shuffle=False)  # 3. keras_dataset (float32 + one-hot)
    x = np.concatenate([seq[i][0] for i in range(len(seq))])
    y = np.concatenate([seq[i][1] for i in range(len(seq))])
    np.testing.assert_array_equal(x, x_ref)
    np.testing.assert_array_equal(y, y_ref)

    report = verify(root, deep=True)  # 4. verify --deep
    assert report.ok, [str(p) for p in report.errors]
    assert report.records == len(ref)


def _compact(case: Case, targets: np.ndarray) -> np.ndarray:
    """What compact mode gives as y: the class map (one-hot planes folded back), or the label."""
    if case.kind != "onehot":
        return targets
    return np.where(targets.max(-1) == 0, IGNORE8, targets.argmax(-1)).astype(np.uint8)


def use_inflater(name: str, monkeypatch) -> None:
    """Force the NPZ reader's inflater: ISA-L (the default when installed) or zlib."""
    if name == "isal":
        from isal import isal_zlib
        monkeypatch.setattr(npz_reader, "_inflater", isal_zlib)
    else:
        monkeypatch.setattr(npz_reader, "_inflater", zlib)
    npz_reader.NpzRandomAccess._cache.clear()


def with_inflaters(cases: list[Case]) -> list:
    """(case, inflater) parameters: deflated NPZ cases once per inflater, the others once."""
    return [pytest.param(c, inf, id=f"{c.id}-{inf}") for c in cases
            for inf in (("isal", "zlib") if c.compression == "deflate" else ("isal",))]


def random_cases(seed: int, count: int, *, max_side: int, max_bytes: int) -> list[Case]:
    """`count` random cases over every format, compression, content and mask kind."""
    rng = np.random.default_rng(seed)
    kinds = ["class_map", "uint16", "onehot", "classification", "class_map"]
    out = []
    for i in range(count):
        fmt, compression = FORMATS[i % len(FORMATS)]
        h = int(rng.choice([1, 2, 3, int(rng.integers(1, max_side + 1))]))
        w = int(rng.choice([1, 5, int(rng.integers(1, 2 * max_side + 1))]))
        kind = kinds[i % len(kinds)]
        classes = {"uint16": 300, "onehot": int(rng.integers(2, 6))}.get(kind, int(rng.integers(1, 20)))
        while h * w * 4 * (3 + classes) > max_bytes and h * w > 1:  # float32 x + one-hot y of one record
            h, w = max(1, h // 2), max(1, w // 2)
        most = max(1, min(300, max_bytes // (h * w * 4 * (3 + classes))))
        records = tuple(int(rng.integers(1, most + 1)) for _ in range(int(rng.integers(1, 4))))
        out.append(Case(fmt, compression, h, w, records, str(rng.choice(["noise", "smooth"])), kind, classes,
                        seed * 1000 + i))
    return out


FAST_CASES = random_cases(12, 8, max_side=40, max_bytes=8 << 20)


@pytest.mark.parametrize(("case", "inflater"), with_inflaters(FAST_CASES))
def test_every_reader_path_equals_the_reference_on_a_random_dataset(case, inflater, tmp_path, monkeypatch):
    use_inflater(inflater, monkeypatch)
    truth = write_case(tmp_path / "ds", case)
    check_every_path(tmp_path / "ds", case, truth, batch_size=int(np.random.default_rng(case.seed).integers(1, 9)))


def test_random_fast_cases_cover_every_format_content_and_kind():
    assert {(c.fmt, c.compression) for c in FAST_CASES} == set(FORMATS)
    assert {c.content for c in FAST_CASES} == {"noise", "smooth"}
    assert {c.kind for c in FAST_CASES} == {"class_map", "uint16", "onehot", "classification"}


SLOW_CASES = [
    Case("npz", "deflate", 1024, 2048, (2,), "smooth", "class_map", 12, 1),
    Case("npz", "deflate", 1024, 2048, (1, 2), "noise", "class_map", 5, 2),
    Case("tfrecord", "none", 1024, 2048, (2,), "noise", "class_map", 5, 3),
    Case("tfrecord", "gzip", 1024, 2048, (1,), "smooth", "class_map", 6, 4),
    Case("tfrecord", "gzip", 96, 160, (3, 2), "smooth", "uint16", 300, 10),
    Case("npz", "none", 1024, 2048, (2,), "smooth", "onehot", 3, 5),
    Case("npz", "deflate", 512, 512, (16, 8), "smooth", "class_map", 5, 6),
    Case("npz", "deflate", 1, 1, (300, 1, 299), "noise", "class_map", 3, 7),
    Case("tfrecord", "none", 1, 2048, (300,), "smooth", "class_map", 4, 8),
    Case("tfrecord", "gzip", 2048, 1, (150,), "noise", "classification", 7, 9),
] + random_cases(99, 8, max_side=1024, max_bytes=256 << 20)


@pytest.mark.slow
@pytest.mark.parametrize(("case", "inflater"), with_inflaters(SLOW_CASES))
def test_every_reader_path_equals_the_reference_up_to_1024x2048(case, inflater, tmp_path, monkeypatch):
    use_inflater(inflater, monkeypatch)
    truth = write_case(tmp_path / "ds", case)
    check_every_path(tmp_path / "ds", case, truth, batch_size=2 if case.height * case.width > 1 << 18 else 16)


# -- damaged input: the same named error on every path --------------------------------------------

def _out_of_range(case: Case, shard: int, record: int, pos: tuple[int, int]):
    """An `edit` putting a value that is neither a class nor the ignore index into one record
    (a class map pixel, or the label)."""
    def edit(index: int, samples: list[SampleArrays]) -> list[SampleArrays]:
        if index != shard:
            return samples
        s = samples[record]
        if case.kind == "classification":
            samples[record] = SampleArrays(s.key, s.image, None, case.num_classes + 2)
        else:
            mask = s.mask.copy()
            mask[pos] = case.num_classes + 1
            samples[record] = SampleArrays(s.key, s.image, mask, None)
        return samples
    return edit


def check_same_error_on_every_path(root: Path, needle: str) -> None:
    """`records()`, `keras_dataset()`, `tf_dataset()` (ordered/shuffled/seeded, one-hot and
    compact) and `verify --deep` all refuse the dataset, each error holding `needle`."""
    ds = readers.open(root)
    with pytest.raises(readers.ShardError) as e:
        list(ds.records("train"))
    assert needle in str(e.value), str(e.value)
    seq = ds.keras_dataset("train", 2, shuffle=False)
    with pytest.raises(readers.ShardError) as e:
        for i in range(len(seq)):
            seq[i]
    assert needle in str(e.value), str(e.value)
    for kwargs in ({"shuffle": False}, {"shuffle": True}, {"shuffle": True, "seed": 4},
                   {"shuffle": False, "one_hot": False, "normalize": False}):
        with pytest.raises((readers.ShardError, tf.errors.OpError)) as e:
            for _ in ds.tf_dataset("train", 2, **kwargs):
                pass
        assert needle in str(e.value), (kwargs, str(e.value)[-800:])
    report = verify(root, deep=True)
    assert not report.ok and any(p.record == int(needle.rsplit(" ", 1)[1]) for p in report.errors)


@pytest.mark.parametrize("kind", ["class_map", "uint16", "classification"])
@pytest.mark.parametrize(("fmt", "compression"), FORMATS, ids=["-".join(f) for f in FORMATS])
def test_a_class_value_out_of_range_is_the_same_named_error_on_every_path(kind, fmt, compression, tmp_path):
    """A value that is neither a class nor the ignore index used to become an all-zero
    one-hot row (an ignored pixel) silently; now every path names shard and record."""
    case = Case(fmt, compression, 9, 13, (3, 4), "smooth", kind, 300 if kind == "uint16" else 6, 31)
    write_case(tmp_path / "ds", case, _out_of_range(case, 1, 2, (4, 7)))
    shard = tmp_path / "ds" / f"train-00001.{'tfrecord' if fmt == 'tfrecord' else 'npz'}"
    check_same_error_on_every_path(tmp_path / "ds", f"shard {shard}, record 2")
    text = "is not a class" if kind == "classification" else f"class value {case.num_classes + 1} at (row 4, column 7)"
    with pytest.raises(readers.ShardError, match=text.replace("(", r"\(").replace(")", r"\)")):
        list(readers.open(tmp_path / "ds").records("train"))
