"""Multi-worker reading: each input pipeline / process reads a disjoint part of a split,
and the parts together are the whole split, every record exactly once.

`tf_dataset(input_context=...)` shards by file (`tf.distribute.InputContext`), falling
back to record-level sharding with a warning when there are fewer files than
pipelines; `records` and `keras_dataset` take `num_shards`/`shard_index`. A real
`tf.distribute.MirroredStrategy` over two logical CPU devices consumes the dataset
through `distribute_datasets_from_function` and trains a Keras model on it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import readers
from converter.testing import synth
from converter.convert import convert
from converter.options import OutputOptions, RunOptions, SourceSpec

REPO = Path(__file__).resolve().parents[1]
SAMPLE_BYTES = 32 * 48 * 4


def _digest(image: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest()


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> synth.SynthDataset:
    return synth.make_camvid(tmp_path_factory.mktemp("mw") / "src", splits={"train": 14, "val": 3},
                             size=[(64, 96), (48, 64)], seed=21)


def _convert(sources, out: Path, fmt: str, per_shard: int) -> readers.Dataset:
    convert(SourceSpec(root=str(sources.root)), str(out), OutputOptions(size=(32, 48), format=fmt),
            RunOptions(workers=1, shard_size_bytes=per_shard * SAMPLE_BYTES))
    return readers.open(out)


@pytest.fixture(scope="module", params=["tfrecord", "npz"])
def dataset(request, sources, tmp_path_factory) -> readers.Dataset:
    """train: 14 records in 5 shards (3,3,3,3,2); val: 3 records in 1 shard."""
    return _convert(sources, tmp_path_factory.mktemp("mw") / request.param, request.param, per_shard=3)


def _all_digests(ds: readers.Dataset, split: str) -> Counter:
    return Counter(_digest(r.image) for r in ds.records(split))


def _pipeline_digests(ds: readers.Dataset, split: str, num: int, index: int, **kw) -> Counter:
    import tensorflow as tf

    ctx = tf.distribute.InputContext(num_input_pipelines=num, input_pipeline_id=index, num_replicas_in_sync=num)
    pipeline = ds.tf_dataset(split, 2, normalize=False, one_hot=False, input_context=ctx, **kw)
    got = Counter()
    for x, _ in pipeline:
        got.update(_digest(img) for img in x.numpy())
    return got


@pytest.mark.parametrize("shuffle", [False, True])
def test_two_input_pipelines_read_disjoint_files_covering_the_split_once(dataset, shuffle):
    assert len(dataset.shards("train")) == 5
    whole = _all_digests(dataset, "train")
    assert len(whole) == 14  # every image differs
    parts = [_pipeline_digests(dataset, "train", 2, i, shuffle=shuffle, seed=3) for i in range(2)]
    assert not set(parts[0]) & set(parts[1])
    assert parts[0] + parts[1] == whole
    # File-level: pipeline i reads exactly the records of shard files i, i+2, ...
    for i, part in enumerate(parts):
        files = dataset.shards("train", num_shards=2, shard_index=i)
        assert part == Counter(_digest(r.image) for r in dataset._iter_records(files))


def test_input_context_cardinality_counts_this_pipelines_batches(dataset):
    import tensorflow as tf

    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    pipeline = dataset.tf_dataset("train", 2, shuffle=False, input_context=ctx)
    # pipeline 1 reads shards 1 and 3: 6 records, 3 batches of 2
    assert int(pipeline.cardinality()) == 3 == sum(1 for _ in pipeline)


def test_fewer_shards_than_pipelines_warns_and_still_covers_each_record_once(dataset):
    whole = _all_digests(dataset, "val")
    assert len(dataset.shards("val")) == 1
    parts = []
    for i in range(3):
        with pytest.warns(UserWarning, match="has 1 shard files for 3 input pipelines"):
            parts.append(_pipeline_digests(dataset, "val", 3, i, shuffle=False))
    assert all(len(p) == 1 for p in parts)
    assert parts[0] + parts[1] + parts[2] == whole


def test_records_num_shards_parts_are_disjoint_and_complete(dataset):
    whole = _all_digests(dataset, "train")
    parts = [Counter(_digest(r.image) for r in dataset.records("train", num_shards=3, shard_index=i))
             for i in range(3)]
    assert sum(parts, Counter()) == whole
    assert sum(len(p) for p in parts) == 14


def test_keras_dataset_num_shards_parts_are_disjoint_and_complete(dataset):
    whole = _all_digests(dataset, "train")
    total = Counter()
    for i in range(2):
        part = dataset.keras_dataset("train", 4, shuffle=True, seed=1, normalize=False, one_hot=False,
                                     num_shards=2, shard_index=i)
        got = Counter(_digest(img) for b in range(len(part)) for img in part[b][0])
        assert not set(got) & set(total)
        total += got
    assert total == whole


@pytest.mark.parametrize("num_shards, shard_index", [(0, 0), (2, 2), (2, -1), (True, 0)])
def test_bad_num_shards_or_shard_index_is_rejected(dataset, num_shards, shard_index):
    with pytest.raises(ValueError, match="Received"):
        list(dataset.records("train", num_shards=num_shards, shard_index=shard_index))


MIRRORED_SCRIPT = textwrap.dedent("""
    import json, hashlib, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import readers

    ds = readers.open(sys.argv[1])
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    GLOBAL_BATCH = 4
    contexts = []

    def make(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return ds.tf_dataset("train", ctx.get_per_replica_batch_size(GLOBAL_BATCH), shuffle=False,
                             normalize=False, one_hot=False, input_context=ctx)

    dist = strategy.distribute_datasets_from_function(make)
    seen, per_replica_shapes = [], set()
    for x, y in dist:
        for part in strategy.experimental_local_results(x):
            per_replica_shapes.add(int(part.shape[0]))
            seen += [hashlib.sha1(img.tobytes()).hexdigest() for img in part.numpy()]

    with strategy.scope():
        inputs = keras.Input(ds.image_shape)
        h = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
        outputs = keras.layers.Conv2D(ds.num_classes, 1, activation="softmax")(h)
        model = keras.Model(inputs, outputs)
        model.compile("adam", "categorical_crossentropy")
    train = strategy.distribute_datasets_from_function(
        lambda ctx: ds.tf_dataset("train", ctx.get_per_replica_batch_size(GLOBAL_BATCH), seed=0,
                                  input_context=ctx, repeat=True, drop_remainder=True))
    history = model.fit(train, epochs=2, steps_per_epoch=3, verbose=0)
    print(json.dumps({"replicas": strategy.num_replicas_in_sync, "contexts": contexts, "seen": seen,
                      "per_replica_batch": sorted(per_replica_shapes), "loss": history.history["loss"]}))
""")


@pytest.mark.slow
def test_mirrored_strategy_distribute_datasets_from_function_reads_every_record_once(sources, tmp_path):
    ds = _convert(sources, tmp_path / "out", "tfrecord", per_shard=3)
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(ds.path)], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["replicas"] == 2
    assert out["contexts"][0] == [1, 0, 2]  # one input pipeline on one host, feeding two replicas
    assert Counter(out["seen"]) == _all_digests(ds, "train")
    assert max(out["per_replica_batch"]) == 2
    assert len(out["loss"]) == 2 and all(np.isfinite(out["loss"]))


def test_more_processes_than_shard_files_warns(dataset):
    with pytest.warns(UserWarning, match=r"has 1 shard files for num_shards=2 processes; shard_index=1 gets 0"):
        got = list(dataset.records("val", num_shards=2, shard_index=1))
    assert got == []
