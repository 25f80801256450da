"""Encoded storage (--image-encoding png|jpeg|webp): round trips through every format,
task and mask encoding against independent references (Pillow on the stored bytes,
`np.load`, `tf.io.parse_example`), determinism, lossless masks, TFDS, option changes
and damage inside a shard."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import readers
from converter.testing import synth
from converter.convert import convert
from converter.plan.fingerprint import digest_file
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.plan.shards import PlanError
from readers.errors import ShardError
from readers.manifest import MANIFEST_NAME, Manifest

SIZE = (32, 48)
ENCODINGS = ("raw", "png", "jpeg", "webp")
#: (task, mask encoding) cases
TASKS = (("segmentation", "class_map"), ("segmentation", "onehot"), ("classification", "class_map"))
PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("encoding_sources")
    seg = synth.make_camvid(root / "camvid", splits={"train": 7, "val": 3}, size=[(64, 96), (48, 64)], seed=11)
    cls = synth.make_classification(root / "classes", seed=12)
    return {"segmentation": Path(seg.root), "classification": Path(cls.root)}


def _convert(src: Path, out: Path, *, workers: int = 1, shard_size: int = 16 << 10, **options):
    opts = OutputOptions(**{"size": SIZE, **options})
    return convert(SourceSpec(root=str(src)), str(out), opts, RunOptions(workers=workers, shard_size_bytes=shard_size))


@pytest.fixture(scope="module")
def raw_reference(sources, tmp_path_factory) -> dict:
    """records() of the raw conversion per (task, mask encoding): what every encoding must match."""
    out: dict = {}
    for task, mask_encoding in TASKS:
        folder = tmp_path_factory.mktemp(f"raw_{task}_{mask_encoding}")
        _convert(sources[task], folder, task=task, mask_encoding=mask_encoding)
        ds = readers.open(folder)
        out[(task, mask_encoding)] = {s: {r.key: r for r in ds.records(s)} for s in ds.splits}
    return out


def _stored_tfrecord(ds) -> dict[str, tuple[bytes, bytes | None]]:
    """key -> (image bytes, mask bytes) parsed by TensorFlow itself from every shard."""
    import tensorflow as tf

    spec = {"image": tf.io.FixedLenFeature([], tf.string), "key": tf.io.FixedLenFeature([], tf.string)}
    if ds.task == "segmentation":
        spec["mask"] = tf.io.FixedLenFeature([], tf.string)
    out = {}
    for split in ds.splits:
        for ref in ds.shards(split):
            for serialized in tf.data.TFRecordDataset(ref.path).batch(64):
                parsed = tf.io.parse_example(serialized, spec)
                for i, key in enumerate(parsed["key"].numpy()):
                    mask = parsed["mask"].numpy()[i] if "mask" in parsed else None
                    out[key.decode()] = (parsed["image"].numpy()[i], mask)
    return out


def _stored_npz(ds) -> dict[str, tuple[bytes, bytes | None]]:
    """key -> (image bytes, mask bytes) cut from the object-free NPZ members by np.load."""
    out = {}
    for split in ds.splits:
        for ref in ds.shards(split):
            with np.load(ref.path, allow_pickle=False) as z:
                data, offsets, keys = z["image_bytes"], z["image_offsets"], z["keys"]
                assert data.dtype == np.uint8 and offsets.dtype == np.int64 and offsets.shape == (len(keys) + 1,)
                masks = (z["mask_bytes"], z["mask_offsets"]) if "mask_bytes" in z.files else None
                for i, key in enumerate(keys):
                    mask = masks[0][masks[1][i]:masks[1][i + 1]].tobytes() if masks else None
                    out[str(key)] = (data[offsets[i]:offsets[i + 1]].tobytes(), mask)
    return out


def _pillow(data: bytes, fmt: str) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        assert im.format == fmt
        return np.asarray(im)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def _check_stored_bytes(ds, fmt: str, encoding: str, records: dict) -> None:
    """Every record equals Pillow's decode of its stored bytes; masks are PNG class maps."""
    stored = _stored_tfrecord(ds) if fmt == "tfrecord" else _stored_npz(ds)
    assert sorted(stored) == sorted(records)
    onehot = ds.manifest.mask is not None and ds.manifest.mask["encoding"] == "onehot"
    for key, (image_bytes, mask_bytes) in stored.items():
        rec = records[key]
        np.testing.assert_array_equal(_pillow(image_bytes, PIL_FORMATS[encoding]), rec.image)
        if ds.task == "segmentation":
            cmap = _pillow(mask_bytes, "PNG")
            expected = np.argmax(rec.mask, -1) if onehot else rec.mask
            if onehot:
                expected = np.where(rec.mask.max(-1) == 0, 255, expected)
            np.testing.assert_array_equal(cmap, expected)


def _check_pipelines(ds, split: str) -> None:
    """tf_dataset (compact and float/one-hot) and keras_dataset give records() in order."""
    from readers.formats.expand import expand_numpy

    recs = list(ds.records(split))
    images = np.stack([r.image for r in recs])
    targets = np.stack([r.mask for r in recs]) if ds.task == "segmentation" else np.array([r.label for r in recs])
    spec = ds._spec
    x, y = expand_numpy(images, targets, spec, one_hot=True, normalize=True)
    cx, cy = expand_numpy(images, targets, spec, one_hot=False, normalize=False)
    n = len(recs)
    got = [tuple(t.numpy() for t in b) for b in ds.tf_dataset(split, 4, shuffle=False)]
    np.testing.assert_allclose(np.concatenate([g[0] for g in got]), x, atol=1e-7)
    np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), y)
    got = [tuple(t.numpy() for t in b) for b in ds.tf_dataset(split, 4, shuffle=False, one_hot=False, normalize=False)]
    np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), cx)
    np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), cy)
    seq = ds.keras_dataset(split, 4, shuffle=False)
    kx = np.concatenate([seq[i][0] for i in range(len(seq))])
    ky = np.concatenate([seq[i][1] for i in range(len(seq))])
    assert kx.shape[0] == n
    np.testing.assert_allclose(kx, x, atol=1e-7)
    np.testing.assert_array_equal(ky, y)
    shuffled = sum(int(b[0].shape[0]) for b in ds.tf_dataset(split, 3, seed=1))
    assert shuffled == n


@pytest.mark.parametrize("task, mask_encoding", TASKS)
@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_round_trip_of_every_encoding_format_task_and_mask_encoding(sources, raw_reference, tmp_path, encoding, fmt,
                                                                    task, mask_encoding):
    out = tmp_path / "out"
    _convert(sources[task], out, task=task, mask_encoding=mask_encoding, format=fmt, image_encoding=encoding)
    ds = readers.open(out)
    m = ds.manifest
    assert m.image["codec"] == encoding and (m.image.get("quality") == (90 if encoding in ("jpeg", "webp") else None))
    if task == "segmentation":
        assert m.mask["codec"] == ("raw" if encoding == "raw" else "png")
    reference = raw_reference[(task, mask_encoding)]
    every: dict = {}
    for split in ds.splits:
        records = {r.key: r for r in ds.records(split)}
        every.update(records)
        assert sorted(records) == sorted(reference[split])
        for key, rec in records.items():
            ref = reference[split][key]
            assert rec.image.shape == (*SIZE, 3) and rec.image.dtype == np.uint8
            if encoding in ("raw", "png"):
                np.testing.assert_array_equal(rec.image, ref.image)  # lossless: bit-exact
            else:
                assert _psnr(rec.image, ref.image) > 24  # tiny textured synthetic images, q90
            if task == "segmentation":
                assert rec.mask.dtype == ref.mask.dtype
                np.testing.assert_array_equal(rec.mask, ref.mask)  # masks lossless in every encoding
            else:
                assert rec.label == ref.label
    if encoding != "raw":
        _check_stored_bytes(ds, fmt, encoding, every)
    _check_pipelines(ds, "train")


@pytest.mark.parametrize("encoding", ["png", "jpeg", "webp"])
@pytest.mark.parametrize("mask_encoding", ["class_map", "onehot"])
def test_gzip_tfrecords_decode_through_tensorflow_equal_to_records(sources, tmp_path, encoding, mask_encoding):
    """Gzip shards go through TensorFlow's reader and decoders (tf.io.decode_jpeg with the
    accurate IDCT, decode_png, decode_image): the same pixels as Pillow."""
    out = tmp_path / "out"
    _convert(sources["segmentation"], out, compression="gzip", image_encoding=encoding, mask_encoding=mask_encoding)
    _check_pipelines(readers.open(out), "train")


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
@pytest.mark.parametrize("encoding", ["png", "jpeg", "webp"])
def test_encoded_shards_are_identical_with_one_and_two_workers(sources, tmp_path, fmt, encoding):
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        _convert(sources["segmentation"], out, workers=workers, shard_size=1500, format=fmt,
                 image_encoding=encoding, quality=95 if encoding != "png" else None)
        outs.append(out)
    a, b = (Manifest.load(o) for o in outs)
    assert a.splits == b.splits and sum(len(s.shards) for s in a.splits.values()) > 2
    for _, shard in a.iter_shards():
        assert (outs[0] / shard.file).read_bytes() == (outs[1] / shard.file).read_bytes()


def test_uint16_class_maps_are_stored_as_16_bit_png_and_read_back_exactly(tmp_path):
    from tests._shards import write_many_class_source  # noqa: I001

    src = tmp_path / "src"
    write_many_class_source(src, samples=3, height=32, width=48, seed=5)
    raw, jpeg = tmp_path / "raw", tmp_path / "jpeg"
    _convert(src, raw)
    _convert(src, jpeg, image_encoding="jpeg", format="npz")
    stored = _stored_npz(readers.open(jpeg))
    ref = {r.key: r for r in readers.open(raw).records("train")}
    for rec in readers.open(jpeg).records("train"):
        assert rec.mask.dtype == np.uint16 and rec.mask.max() > 255
        np.testing.assert_array_equal(rec.mask, ref[rec.key].mask)
        with Image.open(io.BytesIO(stored[rec.key][1])) as im:
            assert im.mode == "I;16"
    _check_pipelines(readers.open(jpeg), "train")


def test_changing_the_image_encoding_or_quality_is_refused_without_rebuild(sources, tmp_path):
    out = tmp_path / "out"
    src = sources["segmentation"]
    _convert(src, out)
    with pytest.raises(PlanError, match="image_encoding: dataset has 'raw', this run asks for 'jpeg'"):
        _convert(src, out, image_encoding="jpeg")
    assert Manifest.load(out).image["codec"] == "raw"  # refused: nothing changed
    convert(SourceSpec(root=str(src)), str(out), OutputOptions(size=SIZE, image_encoding="jpeg"),
            RunOptions(workers=1, rebuild=True))
    assert Manifest.load(out).image["codec"] == "jpeg"
    with pytest.raises(PlanError, match="quality: dataset has 90, this run asks for 80"):
        _convert(src, out, image_encoding="jpeg", quality=80)
    _convert(src, out, image_encoding="jpeg")  # same options: nothing new, accepted


def test_quality_is_checked_and_only_for_lossy_encodings():
    with pytest.raises(ValueError, match="--quality applies to --image-encoding jpeg or webp"):
        OutputOptions(size=SIZE, image_encoding="png", quality=90)
    with pytest.raises(ValueError, match=r"--quality must be an integer in 1\.\.100. Received: 0"):
        OutputOptions(size=SIZE, image_encoding="jpeg", quality=0)
    with pytest.raises(ValueError, match="--image-encoding must be one of"):
        OutputOptions(size=SIZE, image_encoding="gif")
    assert OutputOptions(size=SIZE, image_encoding="webp").quality == 90
    old = OutputOptions(size=SIZE).to_json()
    del old["image_encoding"], old["quality"]  # a manifest written before encodings existed
    assert OutputOptions.from_json(old) == OutputOptions(size=SIZE)


def test_rewrite_copies_jpeg_records_without_encoding_them_again(sources, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(sources["segmentation"], src)
    out = tmp_path / "out"
    _convert(src, out, image_encoding="jpeg", shard_size=1 << 20)
    before = _stored_tfrecord(readers.open(out))
    changed = sorted((src / "train").iterdir())[0]
    Image.fromarray(synth.textured_image(64, 96, np.random.default_rng(99))).save(changed)
    convert(SourceSpec(root=str(src)), str(out), OutputOptions(size=SIZE, image_encoding="jpeg"),
            RunOptions(workers=1, shard_size_bytes=1 << 20, on_change="replace"))
    after = _stored_tfrecord(readers.open(out))
    changed_key = f"train/{changed.name}"
    assert after[changed_key][0] != before[changed_key][0]
    for key in before:
        if key != changed_key:
            assert after[key] == before[key]  # same JPEG bytes: no second lossy pass


def _rewrite_tfrecord_with(out: Path, split: str, index: int, image: bytes) -> str:
    """Replace record `index`'s image bytes in the first shard of `split` (valid framing and
    CRCs) and update the manifest's size and digest: damage only the decoder can find."""
    from readers.formats.tfrecord import wire as tfrecord_wire

    m = Manifest.load(out)
    shard = m.shards(split)[0]
    path = out / shard.file
    payloads = list(tfrecord_wire.iter_records(str(path)))
    examples = [tfrecord_wire.decode_example(p) for p in payloads]
    with open(path, "wb") as f:
        writer = tfrecord_wire.TFRecordWriter(f, "none")
        for i, ex in enumerate(examples):
            features = {k: v[0] for k, v in ex.items()}
            if i == index:
                features["image"] = image
            writer.write(tfrecord_wire.encode_example(features))
        writer.close()
    _update_manifest(out, m, split, shard.file, path)
    return str(path)


def _update_manifest(out: Path, m: Manifest, split: str, file: str, path: Path) -> None:
    import dataclasses

    from readers.manifest import SplitEntry

    shards = tuple(dataclasses.replace(s, bytes=os.path.getsize(path), digest=digest_file(str(path)))
                   if s.file == file else s for s in m.shards(split))
    splits = {**m.splits, split: SplitEntry(shards, m.splits[split].next_shard_index)}
    (out / MANIFEST_NAME).write_text(m.replace(splits=splits).dumps())


@pytest.mark.parametrize("damage", ["truncated", "not_a_jpeg"])
def test_corrupt_jpeg_inside_a_tfrecord_shard_names_the_shard_and_record(sources, tmp_path, damage):
    from converter.inspect.verify import verify

    out = tmp_path / "out"
    _convert(sources["segmentation"], out, image_encoding="jpeg", shard_size=1 << 20)
    good = _stored_tfrecord(readers.open(out))
    first = next(iter(good.values()))[0]
    bad = first[: len(first) // 2] if damage == "truncated" else b"\xff\xd8 this is no JPEG" + bytes(200)
    path = _rewrite_tfrecord_with(out, "train", 2, bad)
    ds = readers.open(out)
    with pytest.raises(ShardError, match="record 2: image is not a valid JPEG") as e:
        list(ds.records("train"))
    assert e.value.path == path and e.value.record == 2
    with pytest.raises(Exception, match=f"shard {path}, record 2: image is not a valid JPEG"):
        for _ in ds.tf_dataset("train", 2, shuffle=False):
            pass
    with pytest.raises(ShardError, match=f"shard {path}, record 2: image is not a valid JPEG"):
        ds.keras_dataset("train", 1, shuffle=False)[2]
    report = verify(str(out), deep=True)
    assert not report.ok
    assert any(p.record == 2 and "image is not a valid JPEG" in str(p) for p in report.errors)


def test_corrupt_jpeg_inside_an_npz_shard_names_the_shard_and_record(sources, tmp_path):
    out = tmp_path / "out"
    _convert(sources["segmentation"], out, image_encoding="jpeg", format="npz", shard_size=1 << 20)
    m = Manifest.load(out)
    shard = m.shards("train")[0]
    path = out / shard.file
    with np.load(path, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    data, offsets = members["image_bytes"], members["image_offsets"]
    parts = [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]
    parts[3] = parts[3][: len(parts[3]) // 3]  # truncated JPEG
    members["image_bytes"] = np.frombuffer(b"".join(parts), np.uint8)
    members["image_offsets"] = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    with open(path, "wb") as f:
        np.savez(f, **members)
    _update_manifest(out, m, "train", shard.file, path)
    with pytest.raises(ShardError, match=f"shard {path}, record 3: image is not a valid JPEG"):
        list(readers.open(out).records("train"))


def test_tfds_reads_png_and_jpeg_datasets_like_records(sources, tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    for encoding, mask_encoding in (("png", "onehot"), ("jpeg", "class_map")):
        out = tmp_path / encoding
        _convert(sources["segmentation"], out, image_encoding=encoding, mask_encoding=mask_encoding)
        builder = tfds.builder_from_directory(str(out))
        assert builder.info.features["image"].encoding_format == encoding
        ds = readers.open(out)
        for split in ds.splits:
            config = tfds.ReadConfig(interleave_cycle_length=1)
            examples = list(tfds.as_numpy(builder.as_dataset(split=split, read_config=config)))
            records = list(ds.records(split))
            assert [e["key"].decode() for e in examples] == [r.key for r in records]
            for e, r in zip(examples, records):
                cmap = r.mask if mask_encoding == "class_map" else np.where(r.mask.max(-1) == 0, 255,
                                                                             np.argmax(r.mask, -1))
                np.testing.assert_array_equal(e["mask"][..., 0], cmap)  # TFDS: the PNG class map (H, W, 1)
                if encoding == "png":
                    np.testing.assert_array_equal(e["image"], r.image)
                else:  # TFDS decodes JPEG with TensorFlow's default (fast) IDCT: a few levels apart
                    diff = np.abs(e["image"].astype(int) - r.image)
                    assert diff.max() <= 8 and diff.mean() < 1.5
    webp = tmp_path / "webp"
    _convert(sources["segmentation"], webp, image_encoding="webp")
    assert not (webp / "features.json").exists()  # TFDS cannot decode WebP images: no TFDS files


def test_tfds_features_json_for_encoded_images_is_what_tfds_writes(sources, tmp_path):
    import json

    tfds = pytest.importorskip("tensorflow_datasets")
    from converter.publish.tfds import features_json

    out = tmp_path / "out"
    _convert(sources["segmentation"], out, image_encoding="jpeg")
    ours = features_json(Manifest.load(out))
    ref = tmp_path / "ref"
    ref.mkdir()
    tfds.features.FeaturesDict.from_json(ours).save_config(str(ref))
    assert json.loads((ref / "features.json").read_text()) == ours


def test_inspect_shows_the_encoding_bytes_per_sample_and_ratio_to_raw(sources, tmp_path):
    from converter.inspect.describe import describe, format_description

    out = tmp_path / "out"
    _convert(sources["segmentation"], out, image_encoding="jpeg", quality=80)
    d = describe(str(out))
    st = d["storage"]
    m = Manifest.load(out)
    total = sum(s.bytes for _, s in m.iter_shards())
    samples = sum(s.records for _, s in m.iter_shards())
    assert st["image_codec"] == "jpeg" and st["quality"] == 80 and st["mask_codec"] == "png"
    assert st["bytes_per_sample"] == round(total / samples, 1)
    assert st["raw_bytes_per_sample"] == 32 * 48 * 3 + 32 * 48
    assert 0 < st["ratio_to_raw"] < 1
    assert "Storage: images jpeg q80, masks png;" in format_description(d)


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_verify_counts_and_decodes_encoded_shards(sources, tmp_path, fmt):
    from converter.inspect.verify import verify

    for task in ("segmentation", "classification"):
        out = tmp_path / task
        _convert(sources[task], out, task=task, format=fmt, image_encoding="jpeg")
        for deep in (False, True):
            report = verify(str(out), deep=deep)
            assert report.ok, [str(p) for p in report.errors]
            assert report.records == sum(readers.open(out).splits.values())


def test_a_keras_model_trains_on_a_jpeg_dataset_with_the_same_code(sources, tmp_path):
    import keras

    out = tmp_path / "out"
    _convert(sources["segmentation"], out, image_encoding="jpeg")
    ds = readers.open(out)
    model = keras.Sequential([keras.Input((*SIZE, 3)), keras.layers.Conv2D(ds.num_classes, 1, activation="softmax")])
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    history = model.fit(ds.tf_dataset("train", 4, seed=0), validation_data=ds.tf_dataset("val", 4, shuffle=False),
                        epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and all(np.isfinite(history.history["val_loss"]))
    history = model.fit(ds.keras_dataset("train", 4, seed=0), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_an_encoded_image_of_the_wrong_size_is_refused_before_decoding(sources, tmp_path):
    out = tmp_path / "out"
    _convert(sources["segmentation"], out, image_encoding="png", shard_size=1 << 20)
    other = io.BytesIO()
    Image.fromarray(synth.textured_image(SIZE[0] * 2, SIZE[1], np.random.default_rng(4))).save(other, format="PNG")
    path = _rewrite_tfrecord_with(out, "train", 1, other.getvalue())
    with pytest.raises(ShardError, match=f"shard {path}, record 1: image is not a valid PNG .*is 48x64, the manifest "
                                         "says 48x32"):
        list(readers.open(out).records("train"))
