"""Resume inside Keras (`readers.ResumableInput`): `model.fit` killed with SIGKILL
mid-epoch and restarted trains on exactly the batches an uninterrupted run trains on
from the restored step: nothing skipped, nothing repeated beyond the batches after the
last backup (whose weights were lost)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import readers
from readers.resume import RECORD_NAME, ResumeRecord

import _shards

CHILD = os.path.join(os.path.dirname(__file__), "_resume_child.py")


@pytest.fixture
def train11(tmp_path):
    root = tmp_path / "data"
    _shards.write_dataset(root, "tfrecord", splits={"train": 11}, height=20, width=18, records_per_shard=3,
                          num_classes=4)
    return root


def _run(dataset, backup, log, source, augment, kill_at=-1):
    cmd = [sys.executable, CHILD, str(dataset), str(backup), str(log), "--source", source, "--kill-at", str(kill_at)]
    if augment:
        cmd.append("--augment")
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _log(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    return [line.split() for line in lines if line and line != "done"]


def _uninterrupted(dataset, source, augment):
    """The batches of an uninterrupted run's 3 epochs, read directly (no fit, no resume)."""
    from _resume_child import BATCH, EPOCHS, SEED, AUGMENT, digest

    ds = readers.open(dataset)
    aug = AUGMENT if augment else None
    if source == "tf":
        pipeline = ds.tf_dataset("train", BATCH, seed=SEED, augment=aug)
        return [digest(np.asarray(x), np.asarray(y)) for _ in range(EPOCHS) for x, y in pipeline]
    seq = ds.keras_dataset("train", BATCH, seed=SEED, augment=aug)
    out = []
    for _ in range(EPOCHS):
        out += [digest(*seq[i]) for i in range(len(seq))]
        seq.on_epoch_end()
    return out


@pytest.mark.parametrize("source,augment", [("tf", False), ("tf", True), ("keras", False), ("keras", True),
                                            ("keras-mp", True)])
def test_fit_killed_mid_epoch_resumes_with_the_unseen_batches(train11, tmp_path, source, augment):
    # 11 samples in batches of 2: 6 batches per epoch, 18 in 3 epochs; backups after
    # steps 5, 10, 15; killed before step 13 (epoch 2, its batch 2), restored at step 10.
    backup, log = tmp_path / "backup", tmp_path / "log.txt"
    full = _uninterrupted(train11, source, augment)
    assert len(full) == 18 and len(set(full)) >= 15  # epochs reshuffle (a 1-sample last batch may repeat)
    killed = _run(train11, backup, log, source, augment, kill_at=13)
    assert killed.returncode == -9, killed.stderr[-3000:]
    first = _log(log)
    assert [d for _, d in first] == full[:13]
    record = json.loads((backup / RECORD_NAME).read_text())
    assert record["backup"]["iterations"] == 10 and (record["backup"]["epoch"], record["backup"]["step"]) == (1, 4)
    os.remove(log)
    resumed = _run(train11, backup, log, source, augment)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    second = _log(log)
    assert [int(i) for i, _ in second] == list(range(10, 18))  # the optimizer's steps: weights restored at 10
    assert [d for _, d in second] == full[10:]
    assert "ran out of data" not in resumed.stderr
    assert not backup.exists()  # the completed fit deletes the backup (BackupAndRestore's default)


def test_killed_before_the_first_backup_starts_from_scratch(train11, tmp_path):
    backup, log = tmp_path / "backup", tmp_path / "log.txt"
    full = _uninterrupted(train11, "tf", False)
    assert _run(train11, backup, log, "tf", False, kill_at=3).returncode == -9
    os.remove(log)
    assert _run(train11, backup, log, "tf", False).returncode == 0
    assert [d for _, d in _log(log)] == full


def test_position_is_a_function_of_the_optimizer_steps():
    record = ResumeRecord(seed=3, epoch=2, step=4, iterations=100, batches=6)
    assert record.position(100) == (2, 4)
    assert record.position(101) == (2, 5)
    assert record.position(102) == (3, 0)
    assert record.position(100 + 2 + 6 * 3 + 1) == (6, 1)
    with pytest.raises(ValueError, match="mixes two trainings"):
        record.position(99)


def test_seed_and_epoch_length_must_match_the_backup(train11, tmp_path):
    import keras

    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / RECORD_NAME).write_text(json.dumps({"seed": 7, "epoch": 0, "step": 0, "iterations": 0, "batches": 6}))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.random.default_rng(0).random((8, 4)), np.zeros((8, 2)), batch_size=2, verbose=0)  # 4 steps
    model.save_weights(str(backup / "latest.weights.h5"))
    ds = readers.open(train11)
    resume = readers.ResumableInput(backup)
    assert resume.resumed
    with pytest.raises(ValueError, match="seed must be the one"):
        ds.tf_dataset("train", 2, seed=8, resume=resume)
    with pytest.raises(ValueError, match="batches per epoch"):
        ds.tf_dataset("train", 3, seed=7, resume=resume)
    assert readers.ResumableInput(backup).claim(None, 0, 0, 6, 99) == (7, 0, 4)


def test_a_changed_dataset_with_the_same_batch_count_is_a_named_error(train11, tmp_path):
    # The record of a first run on train11; then a backup after 4 optimizer steps.
    import keras

    backup = tmp_path / "backup"
    first = readers.ResumableInput(backup)
    readers.open(train11).tf_dataset("train", 2, seed=7, resume=first)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.random.default_rng(0).random((8, 4)), np.zeros((8, 2)), batch_size=2, verbose=0,
              callbacks=[first])  # 4 steps
    model.save_weights(str(backup / "latest.weights.h5"))
    record = json.loads((backup / RECORD_NAME).read_text())
    assert record["dataset"]["records"] == 11 and record["dataset"]["shards"].startswith("sha256:")
    # Re-converted between crash and restart: 11 other samples, still 6 batches of 2.
    other = tmp_path / "other"
    _shards.write_dataset(other, "tfrecord", splits={"train": 11}, height=20, width=18, records_per_shard=3,
                          num_classes=4, seed=1)
    for source in ("tf", "keras"):
        resume = readers.ResumableInput(backup)
        with pytest.raises(ValueError, match="dataset changed since the backup.*delete .* to start the training "
                                             "over. Received: 11 records"):
            if source == "tf":
                readers.open(other).tf_dataset("train", 2, seed=7, resume=resume)
            else:
                readers.open(other).keras_dataset("train", 2, seed=7, resume=resume)
    # The unchanged dataset still resumes, at the batch after the backup's 4 steps.
    resume = readers.ResumableInput(backup)
    readers.open(train11).tf_dataset("train", 2, seed=7, resume=resume)
    assert resume.position == (7, 0, 4)
    resume = readers.ResumableInput(backup)
    readers.open(train11).keras_dataset("train", 2, seed=7, resume=resume)
    assert resume.position == (7, 0, 4)


def test_resume_must_be_a_resumable_input(train11):
    with pytest.raises(TypeError, match="resume must be a readers.ResumableInput"):
        readers.open(train11).tf_dataset("train", 2, resume="backup/")


def test_a_corrupt_record_is_a_named_error(tmp_path):
    (tmp_path / RECORD_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="Delete the backup folder"):
        readers.ResumableInput(tmp_path)


@pytest.mark.parametrize("workers", [1, 2])
def test_keras_dataset_under_fit_trains_epoch_0_first_like_tf_dataset(train11, workers):
    """Keras' fit ends an epoch of its input before the first begins; keras_dataset undoes
    that end, so fit sees epochs 0, 1, ... of (seed, epoch), as manual iteration does."""
    from _logged_fit import digest_x, logged_model

    ds = readers.open(train11)
    seen = []
    model = logged_model(ds, seen)
    model.fit(ds.keras_dataset("train", 4, seed=3, workers=workers), epochs=2, shuffle=False, verbose=0)
    seq = ds.keras_dataset("train", 4, seed=3)
    expected = []
    for _ in range(2):
        expected += [digest_x(seq[i][0]) for i in range(len(seq))]
        seq.on_epoch_end()
    assert seen == expected
