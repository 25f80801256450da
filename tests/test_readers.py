"""Tests of `readers`: records, tf.data and PyDataset pipelines, device expansion, errors.

Every dataset is written here, in tmp_path, by `tests/_shards.py` (TFRecord through
`tf.io.TFRecordWriter`, NPZ through `np.savez[_compressed]`), with random textured data.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import warnings
from collections import Counter

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import _shards  # noqa: E402

import readers  # noqa: E402
from readers.errors import ShardError  # noqa: E402
from readers.manifest import MANIFEST_NAME, ManifestError  # noqa: E402

tf = pytest.importorskip("tensorflow")

FORMATS = [("tfrecord", "none"), ("tfrecord", "gzip"), ("npz", "deflate"), ("npz", "none")]
FORMAT_IDS = [f"{f}-{c}" for f, c in FORMATS]
NUM_CLASSES = 4


def _write(tmp_path, fmt="tfrecord", compression=None, **kwargs):
    root = tmp_path / f"ds-{fmt}-{compression}"
    manifest, samples = _shards.write_dataset(root, fmt, compression=compression, num_classes=NUM_CLASSES, **kwargs)
    return root, manifest, samples


@pytest.fixture(params=FORMATS, ids=FORMAT_IDS)
def dataset(request, tmp_path):
    fmt, compression = request.param
    root, manifest, samples = _write(tmp_path, fmt, compression, splits={"train": 10, "val": 3})
    return readers.open(root), samples


def _image_keys(samples):
    return {s.image.tobytes(): s.key for s in samples}


def _keys_of_batches(batches, samples):
    lookup = _image_keys(samples)
    return [lookup[np.asarray(img).tobytes()] for x, _ in batches for img in np.asarray(x)]


# -- open / description ------------------------------------------------------------------------

def test_open_describes_dataset(dataset):
    ds, samples = dataset
    assert ds.splits == {"train": 10, "val": 3}
    assert ds.num_classes == NUM_CLASSES
    assert ds.classes[1] == ("class1", _shards.COLORS[1])
    assert ds.image_shape == (16, 12, 3)
    assert ds.task == "segmentation"
    assert ds.manifest.num_classes == NUM_CLASSES
    assert os.path.isabs(ds.path)


def test_open_accepts_manifest_file(tmp_path):
    root, _, _ = _write(tmp_path)
    assert readers.open(root / MANIFEST_NAME).splits == readers.open(root).splits


def test_class_pixel_counts_sum_of_shards(tmp_path):
    root, manifest, samples = _write(tmp_path, splits={"train": 9})
    counts = readers.open(root).class_pixel_counts("train")
    masks = np.stack([s.mask for s in samples["train"]])
    assert counts.dtype == np.int64
    assert counts.tolist() == [int((masks == c).sum()) for c in range(NUM_CLASSES)]


def test_open_missing_shard_names_file(tmp_path):
    root, _, _ = _write(tmp_path)
    os.remove(root / "train-00001.tfrecord")
    with pytest.raises(FileNotFoundError, match="train-00001.tfrecord") as info:
        readers.open(root)
    assert "imgshard verify" in str(info.value)


def test_open_wrong_size_shard_names_file_and_sizes(tmp_path):
    root, manifest, _ = _write(tmp_path)
    path = root / "train-00000.tfrecord"
    expected = manifest.splits["train"].shards[0].bytes
    with open(path, "ab") as f:
        f.write(b"xx")
    with pytest.raises(ShardError) as info:
        readers.open(root)
    message = str(info.value)
    assert "train-00000.tfrecord" in message
    assert f"expected {expected} bytes" in message and f"Received: {expected + 2} bytes" in message
    assert "imgshard verify" in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("hostile", ["../x.tfrecord", "/etc/passwd", "sub/../../x.tfrecord"])
def test_hostile_manifest_shard_path_refused(tmp_path, hostile):
    root, _, _ = _write(tmp_path)
    doc = json.loads((root / MANIFEST_NAME).read_text())
    doc["splits"]["train"]["shards"][0]["file"] = hostile
    (root / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="outside the dataset folder"):
        readers.open(root)


def test_unknown_split_lists_valid_ones(dataset):
    ds, _ = dataset
    with pytest.raises(KeyError, match="train"):
        list(ds.records("test"))


def test_unknown_format_lists_valid_ones(tmp_path):
    from readers.formats.registry import get_adapter

    with pytest.raises(ValueError, match="tfrecord.*npz"):
        get_adapter("parquet")
    root, _, _ = _write(tmp_path)
    doc = json.loads((root / MANIFEST_NAME).read_text())
    doc["format"] = "parquet"
    (root / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="parquet"):
        readers.open(root)


# -- records() ---------------------------------------------------------------------------------

def test_records_round_trip_bit_exact(dataset):
    ds, samples = dataset
    for split in ("train", "val"):
        records = list(ds.records(split))
        assert [r.key for r in records] == [s.key for s in samples[split]]
        for r, s in zip(records, samples[split]):
            assert r.image.dtype == np.uint8 and r.image.shape == (16, 12, 3)
            np.testing.assert_array_equal(r.image, s.image)
            assert r.mask.dtype == np.uint8
            np.testing.assert_array_equal(r.mask, s.mask)
            assert r.label is None


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_records_uint16_and_onehot_masks(tmp_path, fmt):
    root, _, samples = _write(tmp_path, fmt, mask_dtype="uint16", splits={"train": 5})
    for r, s in zip(readers.open(root).records("train"), samples["train"]):
        assert r.mask.dtype == np.uint16
        np.testing.assert_array_equal(r.mask, s.mask)
    root2 = tmp_path / f"onehot-{fmt}"
    _, samples = _shards.write_dataset(root2, fmt, mask_encoding="onehot", splits={"train": 5},
                                       num_classes=NUM_CLASSES)
    for r, s in zip(readers.open(root2).records("train"), samples["train"]):
        assert r.mask.shape == (16, 12, NUM_CLASSES)
        np.testing.assert_array_equal(r.mask, s.mask)


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_records_classification(tmp_path, fmt):
    root, _, samples = _write(tmp_path, fmt, task="classification", splits={"train": 7})
    ds = readers.open(root)
    assert ds.classes[0] == ("class0", None)
    records = list(ds.records("train"))
    assert [r.label for r in records] == [s.label for s in samples["train"]]
    assert all(r.mask is None for r in records)
    x, y = next(iter(ds.tf_dataset("train", 7, shuffle=False)))
    np.testing.assert_array_equal(np.asarray(y), np.eye(NUM_CLASSES)[[s.label for s in samples["train"]]])
    _, labels = next(iter(ds.tf_dataset("train", 7, shuffle=False, one_hot=False)))
    assert np.asarray(labels).tolist() == [s.label for s in samples["train"]]


def test_records_num_shards_disjoint_and_complete(dataset):
    ds, samples = dataset
    parts = [[r.key for r in ds.records("train", num_shards=3, shard_index=i)] for i in range(3)]
    flat = [k for p in parts for k in p]
    assert sorted(flat) == sorted(s.key for s in samples["train"])
    assert len(flat) == len(set(flat))
    assert parts[1] == [s.key for s in samples["train"][4:8]]  # shard 1 of 3 (4 records per shard)


@pytest.mark.parametrize("bad", [dict(num_shards=0), dict(num_shards=2, shard_index=2), dict(shard_index=-1)])
def test_records_bad_sharding_arguments(dataset, bad):
    ds, _ = dataset
    with pytest.raises(ValueError, match="Received"):
        ds.records("train", **bad)


def test_records_without_tensorflow_joblib_pillow(tmp_path):
    for fmt, compression in FORMATS:
        root, _, _ = _write(tmp_path, fmt, compression)
        code = (
            "import sys\n"
            "for name in ('tensorflow', 'keras', 'joblib', 'PIL'): sys.modules[name] = None\n"
            "import readers\n"
            f"ds = readers.open({str(root)!r})\n"
            "n = sum(1 for r in ds.records('train'))\n"
            "assert n == 10, n\n"
            "loaded = [m for m in sys.modules if sys.modules[m] is not None]\n"
            "assert not any(m.startswith(('tensorflow', 'keras')) for m in loaded), 'TF imported'\n"
        )
        env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(readers.__file__)))}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]


def _flip_byte(path, offset_from_end=None):
    size = os.path.getsize(path)
    pos = size // 2 if offset_from_end is None else size - offset_from_end
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("fmt,compression", FORMATS, ids=FORMAT_IDS)
def test_flipped_byte_read_via_records_names_file(tmp_path, fmt, compression):
    root, _, _ = _write(tmp_path, fmt, compression)
    name = f"train-00001.{fmt}"
    _flip_byte(root / name)
    ds = readers.open(root)  # same size: opens
    with pytest.raises(ShardError, match=name) as info:
        list(ds.records("train"))
    assert info.value.path.endswith(name)
    assert info.value.__cause__ is not None or "CRC" in str(info.value)


@pytest.mark.parametrize("fmt,compression", FORMATS, ids=FORMAT_IDS)
def test_truncated_shard_read_via_records_names_file(tmp_path, fmt, compression):
    root, _, _ = _write(tmp_path, fmt, compression)
    ds = readers.open(root)
    name = f"train-00002.{fmt}"
    path = root / name
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    with pytest.raises(ShardError, match=name):
        list(ds.records("train"))


def test_tfrecord_flipped_byte_names_record(tmp_path):
    root, _, _ = _write(tmp_path, "tfrecord", "none")
    _flip_byte(root / "train-00000.tfrecord")
    with pytest.raises(ShardError, match=r"record \d") as info:
        list(readers.open(root).records("train"))
    assert info.value.record is not None


def test_npz_with_object_array_never_unpickled(tmp_path, monkeypatch):
    root, manifest, samples = _write(tmp_path, "npz", "none", splits={"train": 4})
    path = root / "train-00000.npz"
    chunk = samples["train"]
    with open(path, "wb") as f:
        np.savez(f, images=np.stack([s.image for s in chunk]), masks=np.stack([s.mask for s in chunk]),
                 keys=np.array([s.key for s in chunk], dtype=object))
    doc = json.loads((root / MANIFEST_NAME).read_text())
    doc["splits"]["train"]["shards"][0]["bytes"] = os.path.getsize(path)
    (root / MANIFEST_NAME).write_text(json.dumps(doc))

    def no_unpickling(*args, **kwargs):
        raise AssertionError("the reader unpickled data")

    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    with pytest.raises(ShardError, match="objects"):
        list(readers.open(root).records("train"))


def test_records_key_mismatch_with_manifest_names_file(tmp_path):
    root, _, _ = _write(tmp_path, "npz", "none", splits={"train": 4})
    doc = json.loads((root / MANIFEST_NAME).read_text())
    doc["splits"]["train"]["shards"][0]["samples"][2]["key"] = "train/other.png"
    (root / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(ShardError, match=r"train-00000.npz, record 2"):
        list(readers.open(root).records("train"))


# -- tf_dataset --------------------------------------------------------------------------------

def test_tf_dataset_one_hot_equals_colour_equality(dataset):
    ds, samples = dataset
    batches = list(ds.tf_dataset("train", 4, shuffle=False))
    x = np.concatenate([np.asarray(b[0]) for b in batches])
    y = np.concatenate([np.asarray(b[1]) for b in batches])
    masks = np.stack([s.mask for s in samples["train"]])
    images = np.stack([s.image for s in samples["train"]])
    assert x.dtype == np.float32 and y.dtype == np.float32
    assert y.shape == (10, 16, 12, NUM_CLASSES)
    expected = np.stack([(masks == c) for c in range(NUM_CLASSES)], axis=-1).astype(np.float32)
    np.testing.assert_array_equal(y, expected)
    ignored = masks == 255
    assert ignored.any() and not y[ignored].any()  # ignore index -> all-zero row
    np.testing.assert_allclose(x, images.astype(np.float32) / 255, rtol=1e-6)
    assert 0.0 <= x.min() and x.max() <= 1.0


def test_tf_dataset_compact_mode_uint8(dataset):
    ds, samples = dataset
    x, y = next(iter(ds.tf_dataset("train", 10, shuffle=False, normalize=False, one_hot=False)))
    assert x.dtype == tf.uint8 and y.dtype == tf.uint8
    assert tuple(y.shape) == (10, 16, 12)
    np.testing.assert_array_equal(np.asarray(x), np.stack([s.image for s in samples["train"]]))
    np.testing.assert_array_equal(np.asarray(y), np.stack([s.mask for s in samples["train"]]))


def test_tf_dataset_unshuffled_order_equals_records(dataset):
    ds, samples = dataset
    batches = list(ds.tf_dataset("train", 3, shuffle=False, normalize=False))
    assert _keys_of_batches(batches, samples["train"]) == [r.key for r in ds.records("train")]


def test_tf_dataset_shuffle_with_seed_is_reproducible_permutation(dataset):
    ds, samples = dataset
    keys = [s.key for s in samples["train"]]
    def order():
        return _keys_of_batches(list(ds.tf_dataset("train", 3, seed=7, normalize=False, shuffle_buffer=4)),
                                samples["train"])

    first, again = order(), order()
    assert sorted(first) == sorted(keys) and len(set(first)) == len(keys)
    assert first == again
    assert first != keys


def test_tf_dataset_reshuffles_each_epoch(dataset):
    ds, samples = dataset
    tfds = ds.tf_dataset("train", 10, seed=3, normalize=False)
    epochs = [_keys_of_batches(list(tfds), samples["train"]) for _ in range(3)]
    assert all(sorted(e) == sorted(s.key for s in samples["train"]) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1


def test_tf_dataset_cardinality_known(dataset):
    ds, _ = dataset
    assert int(ds.tf_dataset("train", 4).cardinality()) == 3
    assert int(ds.tf_dataset("train", 4, drop_remainder=True).cardinality()) == 2
    assert int(ds.tf_dataset("train", 4, repeat=True).cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    batches = list(ds.tf_dataset("train", 4, drop_remainder=True))
    assert len(batches) == 2 and all(b[0].shape[0] == 4 for b in batches)
    assert ds.tf_dataset("train", 4, drop_remainder=True).element_spec[0].shape[0] == 4


def test_tf_dataset_input_context_two_pipelines_cover_once(dataset):
    ds, samples = dataset
    seen = []
    for pipeline in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
        part = ds.tf_dataset("train", 2, seed=1, normalize=False, input_context=ctx)
        keys = _keys_of_batches(list(part), samples["train"])
        assert int(part.cardinality()) == len(list(part))
        seen.extend(keys)
    assert Counter(seen) == Counter(s.key for s in samples["train"])


def test_tf_dataset_input_context_more_pipelines_than_shards_warns(dataset):
    ds, samples = dataset  # 3 val shards? val has 1 shard
    seen = []
    for pipeline in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline)
        with pytest.warns(UserWarning, match="input pipelines"):
            part = ds.tf_dataset("val", 1, normalize=False, input_context=ctx)
        batches = list(part)
        assert int(part.cardinality()) == len(batches)
        seen.extend(_keys_of_batches(batches, samples["val"]))
    assert Counter(seen) == Counter(s.key for s in samples["val"])


@pytest.mark.parametrize("bad", [dict(batch_size=0), dict(batch_size=2.5), dict(shuffle_buffer=0), dict(seed="x")])
def test_tf_dataset_bad_arguments_name_the_argument(dataset, bad):
    ds, _ = dataset
    args = {"batch_size": 2, **bad}
    with pytest.raises((ValueError, TypeError), match=next(iter(bad))):
        ds.tf_dataset("train", **args)


def test_tf_dataset_uint16_masks(tmp_path):
    for fmt in ("tfrecord", "npz"):
        root, _, samples = _write(tmp_path, fmt, mask_dtype="uint16", splits={"train": 5})
        ds = readers.open(root)
        x, y = next(iter(ds.tf_dataset("train", 5, shuffle=False)))
        masks = np.stack([s.mask for s in samples["train"]])
        np.testing.assert_array_equal(np.asarray(y), (masks[..., None] == np.arange(NUM_CLASSES)).astype(np.float32))
        _, cmap = next(iter(ds.tf_dataset("train", 5, shuffle=False, one_hot=False)))
        assert cmap.dtype == tf.uint16
        np.testing.assert_array_equal(np.asarray(cmap), masks)


def test_tf_dataset_onehot_encoded_masks(tmp_path):
    for fmt in ("tfrecord", "npz"):
        root = tmp_path / f"onehot-{fmt}"
        _, samples = _shards.write_dataset(root, fmt, mask_encoding="onehot", splits={"train": 5},
                                           num_classes=NUM_CLASSES)
        ds = readers.open(root)
        planes = np.stack([s.mask for s in samples["train"]])
        _, y = next(iter(ds.tf_dataset("train", 5, shuffle=False)))
        np.testing.assert_array_equal(np.asarray(y), planes.astype(np.float32))
        _, cmap = next(iter(ds.tf_dataset("train", 5, shuffle=False, one_hot=False)))
        expected = np.where(planes.max(-1) == 0, 255, planes.argmax(-1)).astype(np.uint8)
        np.testing.assert_array_equal(np.asarray(cmap), expected)


@pytest.mark.parametrize("fmt,compression", [("tfrecord", "none"), ("npz", "none"), ("npz", "deflate")])
def test_damage_after_a_clean_epoch_is_still_caught(tmp_path, fmt, compression):
    root, _, _ = _write(tmp_path, fmt, compression)
    ds = readers.open(root)
    assert len(list(ds.tf_dataset("train", 2, shuffle=False))) == 5  # checksums verified once
    _flip_byte(root / f"train-00001.{fmt}")  # same size, new mtime: checked again
    with pytest.raises(tf.errors.OpError, match=f"train-00001.{fmt}"):
        list(ds.tf_dataset("train", 2, shuffle=False))


def test_tf_dataset_npz_error_names_file(tmp_path):
    root, _, _ = _write(tmp_path, "npz", "deflate")
    ds = readers.open(root)
    _flip_byte(root / "train-00001.npz")
    with pytest.raises(tf.errors.OpError, match="train-00001.npz"):
        list(ds.tf_dataset("train", 2, shuffle=False))


@pytest.mark.parametrize("compression", ["none", "gzip"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_tf_dataset_tfrecord_damage_names_file(tmp_path, compression, shuffle):
    root, _, _ = _write(tmp_path, "tfrecord", compression)
    ds = readers.open(root)
    _flip_byte(root / "train-00001.tfrecord")
    with pytest.raises(tf.errors.OpError, match="train-00001.tfrecord"):
        list(ds.tf_dataset("train", 2, shuffle=shuffle, seed=0))


@pytest.mark.parametrize("compression", ["none", "gzip"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_tf_reader_engine_damage_names_file_and_counts(tmp_path, monkeypatch, compression, shuffle):
    import readers.formats.tfrecord.reader as tfrecord_adapter

    monkeypatch.setattr(tfrecord_adapter, "ENGINE", "tf")
    root, _, _ = _write(tmp_path, "tfrecord", compression)
    ds = readers.open(root)
    _flip_byte(root / "train-00001.tfrecord")
    pattern = r"train-00001.tfrecord.*could read only\] \[\d\] \[of its\] \[4\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        list(ds.tf_dataset("train", 2, shuffle=shuffle, seed=0))


@pytest.mark.parametrize("engine", ["mapped", "tf"])
def test_tf_dataset_tfrecord_shard_deleted_after_open_names_file(tmp_path, monkeypatch, engine):
    import readers.formats.tfrecord.reader as tfrecord_adapter

    monkeypatch.setattr(tfrecord_adapter, "ENGINE", engine)
    root, _, _ = _write(tmp_path, "tfrecord", "none")
    ds = readers.open(root)
    os.remove(root / "train-00002.tfrecord")
    with pytest.raises(tf.errors.OpError, match="train-00002.tfrecord"):
        list(ds.tf_dataset("train", 2, shuffle=False))


@pytest.mark.parametrize("engine", ["mapped", "tf"])
def test_tfrecord_engines_give_the_same_batches(tmp_path, monkeypatch, engine):
    import readers.formats.tfrecord.reader as tfrecord_adapter

    root, _, samples = _write(tmp_path, "tfrecord", "none")
    ds = readers.open(root)
    monkeypatch.setattr(tfrecord_adapter, "ENGINE", engine)
    got = list(ds.tf_dataset("train", 3, shuffle=False))
    masks = np.stack([s.mask for s in samples["train"]])
    np.testing.assert_array_equal(np.concatenate([np.asarray(y) for _, y in got]),
                                  (masks[..., None] == np.arange(NUM_CLASSES)).astype(np.float32))
    assert _keys_of_batches(list(ds.tf_dataset("train", 3, shuffle=False, normalize=False)),
                            samples["train"]) == [s.key for s in samples["train"]]


# -- keras_dataset -----------------------------------------------------------------------------

def test_keras_dataset_matches_tf_dataset(dataset):
    ds, samples = dataset
    kd = ds.keras_dataset("train", 4, shuffle=False)
    td = list(ds.tf_dataset("train", 4, shuffle=False))
    assert len(kd) == 3
    for i, (tx, ty) in enumerate(td):
        kx, ky = kd[i]
        assert isinstance(kx, np.ndarray) and kx.dtype == np.float32 and ky.dtype == np.float32
        np.testing.assert_array_equal(kx, np.asarray(tx))
        np.testing.assert_array_equal(ky, np.asarray(ty))
    kx, ky = ds.keras_dataset("train", 4, shuffle=False, normalize=False, one_hot=False)[2]
    assert kx.dtype == np.uint8 and ky.dtype == np.uint8 and kx.shape[0] == 2
    with pytest.raises(IndexError):
        kd[3]


def test_keras_dataset_shuffles_per_epoch(dataset):
    ds, samples = dataset
    kd = ds.keras_dataset("train", 3, seed=5, normalize=False)
    epochs = []
    for _ in range(3):
        epochs.append(_keys_of_batches([kd[i] for i in range(len(kd))], samples["train"]))
        kd.on_epoch_end()
    assert all(sorted(e) == sorted(s.key for s in samples["train"]) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1
    again = ds.keras_dataset("train", 3, seed=5, normalize=False)
    assert _keys_of_batches([again[i] for i in range(len(again))], samples["train"]) == epochs[0]


def test_keras_dataset_num_shards_disjoint_and_complete(dataset):
    ds, samples = dataset
    seen = []
    for i in range(2):
        kd = ds.keras_dataset("train", 2, normalize=False, num_shards=2, shard_index=i, seed=0)
        seen.extend(_keys_of_batches([kd[j] for j in range(len(kd))], samples["train"]))
    assert Counter(seen) == Counter(s.key for s in samples["train"])


def test_keras_dataset_pickles_for_multiprocessing(tmp_path):
    root, _, samples = _write(tmp_path, "tfrecord", "none")
    kd = readers.open(root).keras_dataset("train", 4, shuffle=False)
    _ = kd[0]  # opens files and builds the index
    clone = pickle.loads(pickle.dumps(kd))
    np.testing.assert_array_equal(clone[1][0], kd[1][0])


def test_keras_dataset_flipped_byte_names_file(tmp_path):
    root, _, _ = _write(tmp_path, "tfrecord", "none")
    _flip_byte(root / "train-00000.tfrecord")
    kd = readers.open(root).keras_dataset("train", 4, shuffle=False)
    with pytest.raises(ShardError, match="train-00000.tfrecord"):
        kd[0]


# -- training ----------------------------------------------------------------------------------

def _tiny_model(num_classes, *, compact=False):
    import keras

    from readers.device import ExpandOnDevice

    inputs = keras.Input((32, 32, 3), dtype="uint8" if compact else "float32")
    x = ExpandOnDevice(num_classes)(inputs) if compact else inputs
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    outputs = keras.layers.Conv2D(num_classes, 1, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    return model


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_model_fit_from_tf_dataset(tmp_path, fmt):
    root, _, _ = _write(tmp_path, fmt, splits={"train": 6}, height=32, width=32, records_per_shard=3)
    ds = readers.open(root)
    history = _tiny_model(ds.num_classes).fit(ds.tf_dataset("train", 2, seed=0), epochs=1, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 1
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_model_fit_from_keras_dataset(tmp_path, fmt):
    root, _, _ = _write(tmp_path, fmt, splits={"train": 6}, height=32, width=32, records_per_shard=3)
    ds = readers.open(root)
    history = _tiny_model(ds.num_classes).fit(ds.keras_dataset("train", 2, seed=0), epochs=1, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 1
    assert np.isfinite(history.history["loss"][0])


def test_model_fit_compact_mode_expands_on_device(tmp_path):
    import keras

    from readers.device import expand_batch

    root, _, _ = _write(tmp_path, "tfrecord", splits={"train": 6}, height=32, width=32, records_per_shard=3)
    ds = readers.open(root)
    model = _tiny_model(ds.num_classes, compact=True)
    compact = ds.tf_dataset("train", 2, seed=0, normalize=False, one_hot=False)
    # y expanded in the pipeline's last step here; in a custom train_step call expand_batch there.
    train = compact.map(lambda x, y: (x, expand_batch(None, y, ds.num_classes, normalize=False)[1]))
    history = model.fit(train, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])
    assert isinstance(model.layers[1], keras.layers.Layer)


# -- device ------------------------------------------------------------------------------------

def test_expand_on_device_equals_tf_one_hot():
    from readers.device import ExpandOnDevice, expand_batch

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    y = rng.integers(0, 5, (2, 8, 8)).astype(np.uint8)
    y[0, 0, :4] = 255
    layer = ExpandOnDevice(5)
    fx, fy = layer(x, y)
    np.testing.assert_array_equal(np.asarray(fy), tf.one_hot(y, 5, dtype=tf.float32).numpy())
    assert not np.asarray(fy)[0, 0, :4].any()
    np.testing.assert_allclose(np.asarray(fx), x.astype(np.float32) / 255, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(layer(x)), np.asarray(fx))
    ex, ey = expand_batch(tf.constant(x), tf.constant(y), 5)
    np.testing.assert_array_equal(np.asarray(ey), tf.one_hot(y, 5).numpy())
    clone = ExpandOnDevice.from_config(layer.get_config())
    assert clone.num_classes == 5 and clone.ignore_index == 255
    with pytest.raises(ValueError, match="num_classes"):
        ExpandOnDevice(0)


def test_device_docstring_example_runs():
    import doctest

    import readers.device

    result = doctest.testmod(readers.device, extraglobs={"ExpandOnDevice": readers.device.ExpandOnDevice})
    assert result.attempted > 0 and result.failed == 0


def test_import_does_not_import_tensorflow():
    code = (
        "import sys, readers, readers.device, readers.pydataset\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'joblib', 'PIL')]\n"
        "assert not bad, bad\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(readers.__file__)))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_allocator_tuning_can_be_turned_off():
    code = (
        "import readers.formats._allocator as b\n"
        "assert b.tune_allocator() is False\n"
    )
    env = {**os.environ, "IMGSHARD_TUNE_MALLOC": "0",
           "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(readers.__file__)))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_warnings_module_quiet_on_normal_use(dataset):
    ds, _ = dataset
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        list(ds.tf_dataset("train", 4))
