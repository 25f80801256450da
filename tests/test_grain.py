"""Grain: `Dataset.grain_source` (a `RandomAccessDataSource`), `grain_batch_map` (imgshard's
augmentation and expansion in a Grain `MapDataset`), and `model.fit` on it with Keras on
JAX (CPU, in a subprocess)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import readers
from readers.augment import Augment, augment_sample

import _shards

grain = pytest.importorskip("grain")


@pytest.fixture(params=["tfrecord", "npz"])
def seg(request, tmp_path):
    root = tmp_path / request.param
    _, samples = _shards.write_dataset(root, request.param, splits={"train": 10, "val": 3}, height=20, width=18,
                                       records_per_shard=3, num_classes=5)
    return readers.open(root), samples


def test_items_are_the_stored_records_with_their_keys(seg):
    ds, samples = seg
    src = ds.grain_source("train")
    assert len(src) == 10
    for i, sample in enumerate(samples["train"]):
        item = src[i]
        assert set(item) == {"image", "mask", "key"}
        assert item["key"] == sample.key
        np.testing.assert_array_equal(item["image"], sample.image)
        np.testing.assert_array_equal(item["mask"], sample.mask)
    assert src[-1]["key"] == samples["train"][-1].key
    with pytest.raises(IndexError, match=r"index must be in \[0, 10\)"):
        src[10]
    with pytest.raises(TypeError, match="index must be an int"):
        src["0"]


def test_classification_items_carry_the_label(tmp_path):
    _, samples = _shards.write_dataset(tmp_path / "c", "npz", task="classification", splits={"train": 7},
                                       num_classes=3)
    src = readers.open(tmp_path / "c").grain_source("train")
    assert [(src[i]["label"], src[i]["key"]) for i in range(7)] == [(s.label, s.key) for s in samples["train"]]
    assert set(src[0]) == {"image", "label", "key"}


def test_source_pickles_for_worker_processes(seg):
    ds, samples = seg
    clone = pickle.loads(pickle.dumps(ds.grain_source("val")))
    assert [clone[i]["key"] for i in range(3)] == [s.key for s in samples["val"]]
    np.testing.assert_array_equal(clone[2]["image"], samples["val"][2].image)


def test_num_shards_selects_shard_files(seg):
    ds, samples = seg
    src = ds.grain_source("train", num_shards=2, shard_index=1)  # shards 1 and 3: records 3-5 and 9
    assert [src[i]["key"] for i in range(len(src))] == [samples["train"][i].key for i in (3, 4, 5, 9)]


def test_map_dataset_pipeline_expands_like_tf_dataset(seg):
    ds, samples = seg
    src = ds.grain_source("train")
    pipeline = grain.MapDataset.source(src).batch(4, drop_remainder=True).map_with_index(ds.grain_batch_map())
    x, y = pipeline[1]
    expected = samples["train"][4:8]
    np.testing.assert_array_equal(x, np.stack([s.image for s in expected]).astype(np.float32) * np.float32(1 / 255))
    masks = np.stack([s.mask for s in expected]).astype(np.int64)
    one_hot = (masks[..., None] == np.arange(5)).astype(np.float32)  # the ignore index (255): all zeros
    np.testing.assert_array_equal(y, one_hot)
    assert len(pipeline) == 2


def test_augmented_batches_equal_the_per_sample_reference(seg):
    ds, samples = seg
    aug = Augment(hflip=0.5, scale=(0.7, 1.4), crop=(16, 16), brightness=0.2)
    src = ds.grain_source("train")
    order = grain.MapDataset.source(src).shuffle(seed=3)
    pipeline = order.batch(5).repeat(2).map_with_index(
        ds.grain_batch_map(augment=aug, seed=11, normalize=False, one_hot=False, batches_per_epoch=2))
    by_key = {s.key: s for s in samples["train"]}
    for b in (0, 3):  # epoch 0 and epoch 1
        x, y = pipeline[b]
        keys = \
            [str(k) for k in order.batch(5).repeat(2)[b]["key"]]
        for j, key in enumerate(keys):
            image, mask = augment_sample(aug, by_key[key].image, by_key[key].mask, key=key, seed=11, epoch=b // 2)
            np.testing.assert_array_equal(x[j], image)
            np.testing.assert_array_equal(y[j], mask)
    x0, _ = pipeline[0]
    assert not np.array_equal(x0, pipeline[2][0])  # epoch 1 is shuffled and drawn anew


def test_batch_map_arguments_are_checked(seg):
    ds, _ = seg
    with pytest.raises(ValueError, match="batches_per_epoch must be a positive integer"):
        ds.grain_batch_map(batches_per_epoch=0)
    with pytest.raises(ValueError, match="seed must be an int when augment is set"):
        ds.grain_batch_map(augment=Augment(hflip=0.5))


FIT_ON_JAX = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import grain, keras, numpy as np, readers
    from readers.augment import Augment
    assert keras.backend.backend() == "jax"
    ds = readers.open(sys.argv[1])
    src = ds.grain_source("train")
    steps = len(src) // 4
    pipeline = (grain.MapDataset.source(src).shuffle(seed=0).batch(4, drop_remainder=True).repeat(2)
                .map_with_index(ds.grain_batch_map(augment=Augment(hflip=0.5, crop=(16, 16)), seed=0,
                                                   batches_per_epoch=steps)))
    inputs = keras.Input((16, 16, 3))
    hidden = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Conv2D(ds.num_classes, 1, activation="softmax")(hidden))
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    history = model.fit(pipeline, epochs=2, steps_per_epoch=steps, verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 2 and all(np.isfinite(losses)), losses
    print("fit-ok", int(model.optimizer.iterations.numpy()), losses)
""")


def test_model_fit_on_the_jax_backend(seg, tmp_path):
    pytest.importorskip("jax")
    ds, _ = seg
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", FIT_ON_JAX, ds.path, root], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fit-ok 4 " in done.stdout  # 10 samples, batches of 4: 2 steps per epoch, 2 epochs
