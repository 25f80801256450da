"""`keras_dataset` with workers: batches computed ahead on the dataset's own pool
(`readers.batchfeed`, threads or processes writing into shared memory) are the batches a
synchronous read gives, in every order of access, through Keras' own adapter and
`model.fit`; batches the caller holds are never overwritten; a dead worker process is a
named error; worker processes do not outlive a killed parent; no shared memory leaks."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import readers
from readers.augment import Augment
from readers.batchfeed import FeedWorkerError

import _shards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUGMENT = Augment(hflip=0.5, scale=(0.6, 1.6), rotate=10, crop=(18, 14), brightness=0.2)


@pytest.fixture(scope="module", params=["tfrecord", "npz", "npz-uint16"])
def dataset(request, tmp_path_factory):
    """21 samples (batches of 4: a partial last batch) in shards of 3, odd sizes, 5 classes;
    and 200 classes in uint16 class maps (255: ignore), under a split not named "train", beside a decoy split."""
    root = tmp_path_factory.mktemp("feed") / request.param
    fmt = request.param.split("-")[0]
    if request.param.endswith("uint16"):
        _, written = _shards.write_dataset(root, fmt, splits={"trn": 21, "train_old": 3}, height=22, width=17,
                                           records_per_shard=3, num_classes=200, mask_dtype="uint16",
                                           compression="none", seed=9)
    else:
        _, written = _shards.write_dataset(root, fmt, splits={"train": 21}, height=22, width=17,
                                           records_per_shard=3, num_classes=5, compression="none", seed=4)
    ds = readers.open(root)
    ds.written = written  # the arrays the test wrote: the independent reference
    return ds


def _split(ds) -> str:
    return max(ds.splits, key=ds.splits.get)  # the 21-sample split


def _copy(batch):
    return tuple(np.array(a, copy=True) for a in batch)


def _synchronous(ds, epochs, **kw):
    seq = ds.keras_dataset(_split(ds), 4, seed=5, **kw)
    out = []
    for _ in range(epochs):
        out.append([_copy(seq[i]) for i in range(len(seq))])
        seq.on_epoch_end()
    return out


def _through_keras(seq, epochs):
    """Epochs as `model.fit` reads them: Keras' `PyDatasetAdapter` (its first `on_epoch_end`
    before any `on_epoch_begin` included, as `fit`'s `EpochIterator.reset` does)."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    adapter = PyDatasetAdapter(seq)
    assert adapter.enqueuer is None  # the dataset feeds itself: Keras calls it in order on one thread
    seq.on_epoch_end()
    out = []
    for _ in range(epochs):
        adapter.on_epoch_begin()
        out.append([_copy(b) for b in adapter.get_numpy_iterator()])
        adapter.on_epoch_end()
    return out


def _same(a, b):
    assert len(a) == len(b)
    for ea, eb in zip(a, b):
        assert len(ea) == len(eb)
        for (xa, ya), (xb, yb) in zip(ea, eb):
            assert xa.dtype == xb.dtype and ya.dtype == yb.dtype
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
@pytest.mark.parametrize("mode", ["float", "compact", "augment"])
def test_fed_batches_are_the_synchronous_batches(dataset, processes, mode):
    kw = {"float": {}, "compact": dict(one_hot=False, normalize=False), "augment": dict(augment=AUGMENT)}[mode]
    expected = _synchronous(dataset, 2, **kw)
    assert len({e[0][0].tobytes() for e in expected}) == 2  # the epochs differ
    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=processes, **kw)
    assert (seq.feed_workers, seq.feed_processes) == (2, processes)
    _same(_through_keras(seq, 2), expected)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_fed_compact_batches_hold_the_arrays_written(dataset, processes):
    """Unshuffled compact batches from the pool, against the arrays the test wrote (not imgshard code)."""
    split = _split(dataset)
    seq = dataset.keras_dataset(split, 4, shuffle=False, one_hot=False, normalize=False, workers=2,
                                use_multiprocessing=processes)
    x = np.concatenate([seq[i][0] for i in range(len(seq))])
    y = np.concatenate([seq[i][1] for i in range(len(seq))])
    np.testing.assert_array_equal(x, np.stack([s.image for s in dataset.written[split]]))
    np.testing.assert_array_equal(y, np.stack([s.mask for s in dataset.written[split]]))
    assert y.dtype == dataset.written[split][0].mask.dtype and y.max() > 4


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_random_access_in_any_order_gives_the_same_batches(dataset, processes):
    expected = _synchronous(dataset, 2)
    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=processes)
    rng = np.random.default_rng(0)
    with pytest.warns(UserWarning, match="asked for out of order.*pass shuffle=False to model.fit"):
        for _ in range(2):  # each epoch twice over: once shuffled, once backwards
            for i in list(rng.permutation(len(seq))) + list(range(len(seq)))[::-1]:
                np.testing.assert_array_equal(seq[int(i)][0], expected[0][int(i)][0])
    seq.on_epoch_end()
    np.testing.assert_array_equal(seq[3][1], expected[1][3][1])
    np.testing.assert_array_equal(seq[-1][0], expected[1][-1][0])
    with pytest.raises(IndexError, match=r"batch index must be in \[0, 6\)"):
        seq[6]


def test_batches_held_by_the_caller_are_never_overwritten(dataset):
    """Shared-memory slots are reused only once nothing holds their arrays: hold every
    batch of three epochs (more than the slots there are), then compare them all."""
    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=True)
    held, copies = [], []
    for _ in range(3):
        for i in range(len(seq)):
            batch = seq[i]
            held.append(batch)
            copies.append(_copy(batch))
        seq.on_epoch_end()
    feed = seq._feed
    assert 0 < len(feed._own.slots) <= feed._max_slots
    for (x, y), (cx, cy) in zip(held, copies):
        np.testing.assert_array_equal(x, cx)
        np.testing.assert_array_equal(y, cy)
    # released: the slots are reused (no new ones), and the batches stay right
    del held, x, y, batch
    gc.collect()
    count = len(feed._own.slots)
    _same([[_copy(seq[i]) for i in range(len(seq))]], _synchronous(dataset, 4)[3:])
    assert len(feed._own.slots) == count


def test_a_dead_worker_process_is_a_named_error(dataset):
    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=True)
    seq[0]
    for pid in list(seq._feed._own.pool.pids):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    with pytest.raises(FeedWorkerError, match="worker process died.*use_multiprocessing=False"):
        for i in (4, 2, 5):  # out of order: new work for the dead pool
            seq[i]
    # the feed is done: every later read says so at once (no hang on the broken pool)
    for i in (0, 3):
        with pytest.raises(FeedWorkerError, match="make a new keras_dataset"):
            seq[i]


def _shm_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("psm_")} if os.path.isdir("/dev/shm") else set()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory listed in /dev/shm")
def test_shared_memory_is_released_with_the_dataset(dataset):
    before = _shm_names()
    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=True)
    for i in range(len(seq)):
        seq[i]
    assert _shm_names() - before  # the slots exist while the dataset does
    del seq
    gc.collect()
    assert not _shm_names() - before


def test_worker_processes_exit_when_the_parent_is_killed(dataset, tmp_path):
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {ROOT!r})
        import readers
        seq = readers.open({dataset.path!r}).keras_dataset({_split(dataset)!r}, 4, seed=5, workers=2, use_multiprocessing=True)
        seq[0]; seq[1]
        print(" ".join(str(p) for p in seq._feed._own.pool.pids), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == -9, run.stderr[-2000:]
    pids = [int(p) for p in run.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_model_fit_trains_on_every_batch_in_order(dataset, processes):
    from _logged_fit import digest_x, logged_model

    seen = []
    model = logged_model(dataset, seen)
    train = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=processes)
    history = model.fit(train, epochs=2, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    expected = [digest_x(x) for epoch in _synchronous(dataset, 2) for x, _ in epoch]
    assert seen == expected


def test_tensorflow_augmentation_is_fed_on_threads_with_a_warning(dataset, monkeypatch):
    """The TensorFlow fallback of the augmentation (no C kernel for these images) is not
    fork-safe: use_multiprocessing=True computes those batches on threads, and says so."""
    import readers.pydataset as pydataset

    monkeypatch.setattr(pydataset, "host_kernel_takes", lambda *a: False)
    expected = _synchronous(dataset, 1, augment=AUGMENT)
    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=True, augment=AUGMENT)
    with pytest.warns(UserWarning, match="not fork-safe; the batches are computed on threads"):
        first = _copy(seq[0])
    assert not seq.feed_processes
    _same([[first] + [_copy(seq[i]) for i in range(1, len(seq))]], expected)


def _counting(seq):
    """`seq` with a list that `batch_at` appends each computed batch index to (before the
    feed starts: threads call it, forked workers inherit it)."""
    calls, compute = [], seq.batch_at

    def batch_at(epoch, index):
        calls.append(index)
        return compute(epoch, index)

    seq.batch_at = batch_at
    return calls


def test_shuffled_requests_compute_each_batch_once_and_warn(dataset):
    """model.fit(shuffle=True) (Keras' default) permutes the batch indices: nothing can be
    computed ahead, so nothing is, and a warning names shuffle=False."""
    import random

    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2)
    calls = _counting(seq)
    random.seed(3)
    adapter = PyDatasetAdapter(seq, shuffle=True)
    seq.on_epoch_end()  # as fit does before the first epoch
    got = []
    with pytest.warns(UserWarning, match="out of order"):
        for _ in range(2):
            adapter.on_epoch_begin()
            got.append(sorted(_copy(b)[0].tobytes() for b in adapter.get_numpy_iterator()))
            adapter.on_epoch_end()
    expected = [sorted(x.tobytes() for x, _ in epoch) for epoch in _synchronous(dataset, 2)]
    assert got == expected
    assert len(calls) <= 2 * len(seq) + 2 * 4  # each batch once, plus at most one look-ahead per in-order start


def test_a_jump_drops_the_batches_it_skips(dataset):
    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=True)
    for i in (0, 2, 4):
        seq[i]
        assert all(index > i for _, index in seq._feed._pending)
    expected = _synchronous(dataset, 1)[0]
    np.testing.assert_array_equal(seq[5][0], expected[5][0])


def test_an_idle_pool_is_stopped_with_its_slots_and_starts_again(dataset, monkeypatch):
    """TensorFlow keeps a dataset given to model.fit alive after fit returns: the feed stops
    its pool and frees its shared memory once idle, and a later read starts them again."""
    import readers.batchfeed as batchfeed

    monkeypatch.setattr(batchfeed, "IDLE_SECONDS", 0.4)
    before = _shm_names()
    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=True)
    first = [_copy(seq[i]) for i in range(len(seq))]
    pids = list(seq._feed._own.pool.pids)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (seq._feed._own.pool is not None or _shm_names() - before):
        time.sleep(0.2)
    assert seq._feed._own.pool is None and not seq._feed._own.slots
    assert not _shm_names() - before
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)
    _same([[_copy(seq[i]) for i in range(len(seq))]], [first])
    seq.close()
    assert seq._feed._own.pool is None


def test_a_batch_that_fails_in_a_worker_frees_its_slot(dataset, monkeypatch):
    from readers.pydataset import BatchReader

    expected = _synchronous(dataset, 1)[0][3][0]
    compute = BatchReader.batch_at

    def failing(self, epoch, index):
        if index == 2:
            raise OSError("disk read failed")
        return compute(self, epoch, index)

    monkeypatch.setattr(BatchReader, "batch_at", failing)  # before the fork: the workers inherit it
    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=True)
    seq[0]
    seq[1]
    for _ in range(3):
        with pytest.raises(OSError, match="disk read failed"):
            seq[2]
    owned = {id(f.slot) for f in seq._feed._pending.values() if f.slot is not None}  # batches computed ahead
    assert all(id(slot) in owned for slot in seq._feed._own.slots if slot.busy)
    np.testing.assert_array_equal(seq[3][0], expected)


def test_no_room_for_shared_memory_falls_back_to_pickled_batches(dataset, monkeypatch):
    import errno

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    seq = dataset.keras_dataset(_split(dataset), 4, seed=5, workers=2, use_multiprocessing=True)
    with pytest.warns(UserWarning, match=r"/dev/shm\) has no room.*--shm-size"):
        got = [_copy(seq[i]) for i in range(len(seq))]
    assert not seq._feed._own.slots
    _same([got], _synchronous(dataset, 1))


def test_dropping_a_dataset_while_holding_a_batch_is_quiet(dataset):
    """A batch still held when its dataset goes (and at exit): no BufferError, no leaked
    shared memory reported by the resource tracker."""
    code = textwrap.dedent(f"""
        import gc, sys
        sys.path.insert(0, {ROOT!r})
        import readers
        seq = readers.open({dataset.path!r}).keras_dataset({_split(dataset)!r}, 4, seed=5, workers=2, use_multiprocessing=True)
        held = [seq[i] for i in range(len(seq))]
        del seq
        gc.collect()
        print(int(held[-1][1].sum()))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout.split()[-1]) > 0
    for noise in ("BufferError", "leaked shared_memory", "Exception ignored", "resource_tracker"):
        assert noise not in run.stderr, run.stderr[-2000:]
