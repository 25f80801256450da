"""Issue 25, item 10: readers after `compact` (or `--prune`, `--on-change replace`) removed
the shards they were opened on.

Decision (docs/READERS.md, "When the dataset is rewritten under a reader"): a pipeline
does not switch to the new manifest on its own; the first read of a removed shard fails
with `DatasetChangedError` (a `ShardError`) saying the dataset was rewritten after it was
opened and to open it again, never "rewrite it with --rebuild". Shards a pipeline still
holds open or in memory keep giving the records they held. A shard deleted by hand while
the manifest still lists it is damage and says so.

The compaction is real (`imgshard compact` between two epochs of a real `model.fit`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import readers
from converter.testing import synth
from readers.errors import DatasetChangedError, ShardError
from tests._cron import convert_args, run_cli

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

REWRITTEN = "was rewritten after it was opened"
FORMATS = (("tfrecord", "none"), ("tfrecord", "gzip"), ("npz", "deflate"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    src = synth.make_camvid(tmp_path_factory.mktemp("after_compact") / "src", splits={"train": 12},
                            size=[(40, 56)], seed=8)
    return Path(src.root)


def _small_shards(sources: Path, out: Path, fmt: str, compression: str) -> None:
    assert run_cli(convert_args(sources, out, "--shard-size", "8KB", "--format", fmt,
                                "--compression", compression)) == 0
    assert len(readers.open(out).shards("train")) > 2


def _compact(out: Path) -> None:
    assert run_cli(["compact", str(out), "--target-shard-size", "1MB", "-q"]) == 0


class CompactAfterFirstEpoch(keras.callbacks.Callback):
    def __init__(self, out: Path):
        super().__init__()
        self.out = out
        self.epochs_done = 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_done += 1
        if epoch == 0:
            _compact(self.out)


@pytest.mark.parametrize(("fmt", "compression"), FORMATS, ids=["-".join(f) for f in FORMATS])
@pytest.mark.parametrize("seed", [None, 5], ids=["unseeded", "seeded"])
def test_model_fit_across_a_real_compaction_says_open_it_again(sources, tmp_path, fmt, compression, seed):
    out = tmp_path / "out"
    _small_shards(sources, out, fmt, compression)
    ds = readers.open(out)
    before = {r.key: (r.image, r.mask) for r in ds.records("train")}
    classes = len(ds.classes)
    inputs = keras.Input((32, 32, 3))
    model = keras.Model(inputs, keras.layers.Conv2D(classes, 1, activation="softmax")(inputs))
    model.compile("sgd", "categorical_crossentropy")
    pipeline = ds.tf_dataset("train", 4, shuffle=seed is not None, seed=seed)
    callback = CompactAfterFirstEpoch(out)
    if (fmt, compression) == ("tfrecord", "gzip") and seed is not None:
        # gzip shards read whole are kept inflated in memory (`GZIP_CACHE_BYTES`): the
        # pipeline goes on with the records it was opened on, which are the same records
        model.fit(pipeline, epochs=3, callbacks=[callback], verbose=0)
        assert callback.epochs_done == 3
    else:
        with pytest.raises(tf.errors.OpError) as e:
            model.fit(pipeline, epochs=3, callbacks=[callback], verbose=0)
        assert callback.epochs_done == 1
        text = str(e.value)
        assert REWRITTEN in text and "readers.open(OUT)" in text, text[-1500:]
        assert "train-000" in text and "--rebuild" not in text.split(REWRITTEN)[1].split("If it still does")[0]
    with pytest.raises(DatasetChangedError, match=REWRITTEN):
        list(ds.records("train"))
    again = readers.open(out)  # the fix the message gives: the same records, in fewer shards
    assert len(again.shards("train")) < len(ds.shards("train"))
    after = {r.key: (r.image, r.mask) for r in again.records("train")}
    assert after.keys() == before.keys()
    for key, (image, mask) in before.items():
        np.testing.assert_array_equal(after[key][0], image)
        np.testing.assert_array_equal(after[key][1], mask)
    model.fit(again.tf_dataset("train", 4, shuffle=seed is not None, seed=seed), epochs=2, verbose=0)


@pytest.mark.parametrize(("fmt", "compression"), FORMATS, ids=["-".join(f) for f in FORMATS])
def test_keras_dataset_in_a_fresh_reader_process_names_the_rewrite(sources, tmp_path, fmt, compression):
    """A PyDataset whose shard is not open yet (a new worker, an evicted cache) opens the
    removed file: the same `DatasetChangedError`; shards it already holds keep reading."""
    out = tmp_path / "out"
    _small_shards(sources, out, fmt, compression)
    ds = readers.open(out)
    seq = ds.keras_dataset("train", 2, shuffle=False)
    first = seq[0]
    _compact(out)
    np.testing.assert_array_equal(seq[0][0], first[0])  # held open: the records it was opened on
    fresh = ds.keras_dataset("train", 2, shuffle=False)
    with pytest.raises(DatasetChangedError, match=REWRITTEN):
        for i in range(len(fresh)):
            fresh[i]


def test_a_shard_deleted_by_hand_is_damage_not_a_rewrite(sources, tmp_path):
    out = tmp_path / "out"
    _small_shards(sources, out, "tfrecord", "none")
    ds = readers.open(out)
    victim = ds.shards("train")[1].path
    Path(victim).unlink()
    with pytest.raises(ShardError, match="is missing, though the dataset's manifest lists it") as e:
        list(ds.records("train"))
    assert not isinstance(e.value, DatasetChangedError)
    assert e.value.path == victim and "imgshard verify" in str(e.value)
    with pytest.raises(tf.errors.OpError, match="is missing, though the dataset's manifest lists it"):
        for _ in ds.tf_dataset("train", 4, shuffle=False):
            pass


def test_a_removed_dataset_folder_is_named(sources, tmp_path):
    out = tmp_path / "out"
    _small_shards(sources, out, "npz", "deflate")
    ds = readers.open(out)
    shutil.rmtree(out)
    with pytest.raises(ShardError, match="is gone, and so is the dataset's manifest"):
        list(ds.records("train"))
