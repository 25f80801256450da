"""Order independent of the host count (``sharding="global"``): the order of an epoch is
fixed by (seed, epoch); with R replicas at global batch G, replica r's batch at step g is
slice r of the one-replica batch g; the union per step equals the one-replica stream for
R = 1..4, and a resumed run with another replica count continues the same order."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import readers
from readers.augment import Augment

import _shards

GLOBAL = 12  # global batch: per-replica 12, 6, 4, 3 for 1, 2, 3, 4 replicas


@pytest.fixture
def data(tmp_path):
    _, samples = _shards.write_dataset(tmp_path / "d", "tfrecord", splits={"train": 40}, height=12, width=10,
                                       records_per_shard=7, num_classes=3)
    names = {hashlib.sha256(s.image.tobytes()).hexdigest(): s.key for s in samples["train"]}
    return readers.open(tmp_path / "d"), names


def _keys(names, x):
    return [names[hashlib.sha256(np.ascontiguousarray(img).tobytes()).hexdigest()] for img in np.asarray(x)]


def _tf_stream(ds, names, replicas, index, *, epochs=2, drop=False, start_step=0):
    import tensorflow as tf

    ctx = tf.distribute.InputContext(num_input_pipelines=replicas, input_pipeline_id=index,
                                     num_replicas_in_sync=replicas)
    pipeline = ds.tf_dataset("train", GLOBAL // replicas, seed=4, one_hot=False, normalize=False, input_context=ctx,
                             sharding="global", drop_remainder=drop, start_step=start_step)
    return [[_keys(names, x) for x, _ in pipeline] for _ in range(epochs)]


def _keras_stream(ds, names, replicas, index, *, epochs=2):
    seq = ds.keras_dataset("train", GLOBAL // replicas, seed=4, one_hot=False, normalize=False, num_shards=replicas,
                           shard_index=index, sharding="global")
    out = []
    for _ in range(epochs):
        out.append([_keys(names, seq[i][0]) for i in range(len(seq))])
        seq.on_epoch_end()
    return out


def _union(streams, epoch):
    """Per global step, the replicas' samples in replica order."""
    steps = max(len(s[epoch]) for s in streams)
    return [sum((s[epoch][g] for s in streams if g < len(s[epoch])), []) for g in range(steps)]


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_union_per_step_equals_the_one_replica_stream(data, reader):
    ds, names = data
    stream = _tf_stream if reader == "tf" else _keras_stream
    one = stream(ds, names, 1, 0)
    assert [len(b) for b in one[0]] == [12, 12, 12, 4]
    assert sorted(sum(one[0], [])) == sorted(names.values())  # each sample once per epoch
    assert one[0] != one[1]  # every epoch reshuffles
    for replicas in (2, 3, 4):
        streams = [stream(ds, names, replicas, r) for r in range(replicas)]
        for epoch in (0, 1):
            assert _union(streams, epoch) == one[epoch], (replicas, epoch)
        assert [len(b) for b in streams[0][0]] == [GLOBAL // replicas] * 3 + [len(np.array_split(range(4), replicas)[0])]


def test_order_does_not_depend_on_the_batch_size(data):
    ds, names = data
    flat = [k for x, _ in ds.tf_dataset("train", 12, seed=4, normalize=False, one_hot=False,
                                         input_context=_ctx(1, 0), sharding="global") for k in _keys(names, x)]
    other = [k for x, _ in ds.tf_dataset("train", 5, seed=4, normalize=False, one_hot=False,
                                          input_context=_ctx(1, 0), sharding="global") for k in _keys(names, x)]
    assert flat == other


def _ctx(replicas, index):
    import tensorflow as tf

    return tf.distribute.InputContext(num_input_pipelines=replicas, input_pipeline_id=index,
                                      num_replicas_in_sync=replicas)


def test_resuming_with_another_replica_count_continues_the_same_order(data):
    ds, names = data
    one = _tf_stream(ds, names, 1, 0, epochs=1, drop=True)[0]
    before = _union([_tf_stream(ds, names, 4, r, epochs=1, drop=True) for r in range(4)], 0)[:2]  # 4 replicas, 2 steps
    after = _union([_tf_stream(ds, names, 3, r, epochs=1, drop=True, start_step=2) for r in range(3)], 0)
    assert before + after == one
    assert len(one) == 3 and all(len(b) == GLOBAL for b in one)


def test_augmented_replica_batches_are_slices_of_the_one_replica_batch(data):
    ds, _ = data
    aug = Augment(hflip=0.5, scale=(0.8, 1.25), crop=(8, 8), brightness=0.2)
    one = [np.asarray(x) for x, _ in ds.tf_dataset("train", 12, seed=4, augment=aug, input_context=_ctx(1, 0),
                                                   sharding="global", drop_remainder=True)]
    parts = [[np.asarray(x) for x, _ in ds.tf_dataset("train", 6, seed=4, augment=aug, input_context=_ctx(2, r),
                                                      sharding="global", drop_remainder=True)] for r in range(2)]
    for g in range(3):
        np.testing.assert_array_equal(np.concatenate([parts[0][g], parts[1][g]]), one[g])


def test_global_sharding_needs_a_seed_and_a_known_mode(data):
    ds, _ = data
    with pytest.raises(ValueError, match="seed must be an int with sharding='global'"):
        ds.tf_dataset("train", 4, input_context=_ctx(2, 0), sharding="global")
    with pytest.raises(ValueError, match="sharding must be one of"):
        ds.keras_dataset("train", 4, seed=0, sharding="hosts")
