"""A converted class-folder dataset trains exactly like a segmentation one: real tf.data, real model.fit."""

from __future__ import annotations

import numpy as np
import pytest

import readers
from converter.convert import convert
from converter.options import OutputOptions, RunOptions, SourceSpec



@pytest.fixture(params=["tfrecord", "npz"])
def converted(classification_src, tmp_path, request):
    out = tmp_path / "out"
    convert(SourceSpec(root=str(classification_src.root)), str(out),
            OutputOptions(size=(16, 16), task="classification", format=request.param),
            RunOptions(workers=1, shard_size_bytes=2048))
    return readers.open(out)


def test_tf_dataset_yields_one_hot_and_int_labels_in_record_order(converted):
    labels = [r.label for r in converted.records("train")]
    images = np.stack([r.image for r in converted.records("train")])
    xs, ys = [], []
    for x, y in converted.tf_dataset("train", 4, shuffle=False):
        assert x.dtype.name == "float32" and tuple(x.shape[1:]) == (16, 16, 3)
        assert y.dtype.name == "float32" and tuple(y.shape[1:]) == (3,)
        xs.append(x.numpy())
        ys.append(y.numpy())
    np.testing.assert_array_equal(np.concatenate(ys), np.eye(3, dtype=np.float32)[labels])
    np.testing.assert_allclose(np.concatenate(xs), images.astype(np.float32) / 255.0, rtol=0, atol=1e-6)
    ints = np.concatenate([y.numpy() for _, y in converted.tf_dataset("train", 4, shuffle=False, one_hot=False)])
    assert ints.dtype == np.int64 and ints.tolist() == labels


def test_keras_dataset_matches_records(converted):
    labels = [r.label for r in converted.records("val")]
    seq = converted.keras_dataset("val", 2, shuffle=False, one_hot=False)
    got = np.concatenate([seq[i][1] for i in range(len(seq))])
    assert got.tolist() == labels


def test_model_fit_one_epoch_on_class_folders(converted):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(converted.num_classes, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(converted.tf_dataset("train", 4, seed=0), epochs=1, verbose=0,
                        validation_data=converted.tf_dataset("val", 4, shuffle=False))
    assert np.isfinite(history.history["loss"][0]) and np.isfinite(history.history["val_loss"][0])
    assert 0.0 <= history.history["val_accuracy"][0] <= 1.0
    probs = model.predict(converted.tf_dataset("val", 4, shuffle=False), verbose=0)
    assert probs.shape == (converted.splits["val"], 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
