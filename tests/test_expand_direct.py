"""The expansion written record by record into the batch (`RecordExpander`, the C loops
`readers._warp.to_float` / `one_hot`) against independent NumPy references, and the
generator pipeline that uses it against the reference records and the compact-batch +
`tf.data` map pipeline it replaced (`batching.EXPAND_IN_GENERATOR = False`): the same bits
on random odd sizes, batch remainders, 1 to 300 classes, both formats, stored and deflated
NPZ, gzip TFRecord."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import readers
from readers.formats import batching
from readers.formats.expand import SCALE, RecordExpander, expand_numpy
from readers.formats.spec import RecordSpec
from tests.test_differential import Case, reference_records, write_case

_warp = pytest.importorskip("readers._warp")
tf = pytest.importorskip("tensorflow")


def _reference_one_hot(idx: np.ndarray, classes: int, ignore: int) -> np.ndarray:
    """One-hot by comparison with every class (ignore: -1 for none)."""
    idx = idx.astype(np.int64)
    return ((idx[..., None] == np.arange(classes)) & (idx[..., None] != ignore)).astype(np.float32)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("count", [1, 3, 7, 64, 4095, 4097, 12_345])
def test_to_float_kernel_equals_numpy_multiply_on_odd_sizes(count):
    rng = np.random.default_rng(count)
    src = rng.integers(0, 256, count, dtype=np.uint8)
    src[:2] = (0, 255)[:min(2, count)] if count >= 2 else src[:2]
    for scale in (SCALE, np.float32(1)):
        out = np.full(count, np.nan, np.float32)
        _warp.to_float(src, out, scale)
        ref = np.multiply(src, scale, dtype=np.float32)
        np.testing.assert_array_equal(_bits(out), _bits(ref))
    assert out.max() <= 255 and (count < 2 or out[1] == 255)


@pytest.mark.parametrize("classes", [1, 2, 3, 5, 8, 9, 16, 17, 64, 255, 256, 300])
@pytest.mark.parametrize("itemsize", [1, 2])
def test_one_hot_kernel_equals_reference_for_1_to_300_classes(classes, itemsize):
    rng = np.random.default_rng(classes * 10 + itemsize)
    count = int(rng.integers(1, 3000))
    high = 256 if itemsize == 1 else 65536
    dtype = np.uint8 if itemsize == 1 else np.uint16
    idx = rng.integers(0, min(classes + 3, high), count).astype(dtype)
    idx[rng.random(count) < 0.1] = high - 1  # the usual ignore index, out of range
    for ignore in sorted({-1, 0, classes - 1, classes // 2, high - 1}):
        out = np.full((count, classes), np.nan, np.float32)
        _warp.one_hot(idx, out, classes, ignore, itemsize)
        np.testing.assert_array_equal(out, _reference_one_hot(idx, classes, ignore))


def test_one_hot_kernel_rejects_wrong_sizes_with_a_named_error():
    idx = np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="dst must hold 50 float32"):
        _warp.one_hot(idx, np.zeros((10, 4), np.float32), 5, -1, 1)
    with pytest.raises(ValueError, match="itemsize 1 or 2"):
        _warp.one_hot(idx, np.zeros((10, 5), np.float32), 5, -1, 3)
    with pytest.raises(ValueError, match="4 bytes"):
        _warp.to_float(idx, np.zeros(9, np.float32), SCALE)


def _spec(kind: str, height: int, width: int, classes: int) -> RecordSpec:
    segmentation = kind != "classification"
    return RecordSpec(
        task="segmentation" if segmentation else "classification", height=height, width=width, channels=3,
        num_classes=classes, mask_dtype=("uint16" if kind == "uint16" else "uint8") if segmentation else None,
        mask_encoding=("onehot" if kind == "onehot" else "class_map") if segmentation else None,
        ignore_index=(65535 if kind == "uint16" else 255) if segmentation else None, compression="none")


@pytest.mark.parametrize("kind,classes", [("class_map", 1), ("class_map", 7), ("uint16", 300), ("onehot", 4),
                                          ("classification", 9)])
@pytest.mark.parametrize("one_hot,normalize", [(True, True), (False, True), (True, False)])
def test_record_expander_in_c_and_numpy_equals_expand_numpy(kind, classes, one_hot, normalize):
    rng = np.random.default_rng(classes + 3 * one_hot + normalize)
    h, w, n = int(rng.integers(1, 23)), int(rng.integers(1, 31)), int(rng.integers(1, 6))
    spec = _spec(kind, h, w, classes)
    images = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    if kind == "classification":
        targets = rng.integers(0, classes + 2, n).astype(np.int64)
    else:
        cmap = rng.integers(0, classes + 2, (n, h, w))
        cmap[rng.random((n, h, w)) < 0.1] = spec.ignore_index
        targets = ((cmap[..., None] == np.arange(classes)).astype(np.uint8) if kind == "onehot"
                   else cmap.astype(np.uint16 if kind == "uint16" else np.uint8))
    x_ref, y_ref = expand_numpy(images, targets, spec, one_hot=one_hot, normalize=normalize)
    for use_c in (True, False):
        expander = RecordExpander(spec, one_hot=one_hot, normalize=normalize, use_c=use_c)
        (xs, xd), (ys, yd) = expander.layout(n)
        x, y = np.full(xs, 7, xd), np.full(ys, 7, yd)
        for j in range(n):
            expander.fill(x, y, j, images[j], targets[j])
        np.testing.assert_array_equal(x, x_ref)
        assert x.dtype == x_ref.dtype and y.dtype == np.asarray(y_ref).dtype
        np.testing.assert_array_equal(y, y_ref)


# -- the pipeline -------------------------------------------------------------------------------

PIPELINE_CASES = [
    Case("tfrecord", "none", 13, 7, (5, 4), "noise", "class_map", 5, 1),
    Case("tfrecord", "gzip", 9, 17, (3, 6), "smooth", "uint16", 300, 2),
    Case("npz", "none", 11, 5, (7,), "noise", "onehot", 3, 3),
    Case("npz", "deflate", 6, 19, (4, 5), "smooth", "class_map", 1, 4),
    Case("npz", "deflate", 8, 8, (6, 3), "noise", "classification", 11, 5),
    Case("tfrecord", "none", 5, 3, (2, 9), "smooth", "class_map", 255, 6),
]


def _reference_batch(case: Case, images: np.ndarray, targets: np.ndarray, one_hot: bool, normalize: bool):
    x = images.astype(np.float32) * np.float32(1 / 255) if normalize else images
    if case.kind == "classification":
        return x, (_reference_one_hot(targets, case.num_classes, -1) if one_hot else targets.astype(np.int64))
    if case.kind == "onehot":
        cmap = np.where(targets.max(-1) == 0, 255, targets.argmax(-1)).astype(np.uint8)
        return x, (targets.astype(np.float32) if one_hot else cmap)
    ignore = 65535 if case.kind == "uint16" else 255
    return x, (_reference_one_hot(targets, case.num_classes, ignore) if one_hot else targets)


def _epoch(ds: "readers.Dataset", batch: int, **kwargs) -> tuple[np.ndarray, np.ndarray, list[int]]:
    batches = list(ds.tf_dataset("train", batch, **kwargs))
    return (np.concatenate([b[0].numpy() for b in batches]), np.concatenate([b[1].numpy() for b in batches]),
            [len(b[0]) for b in batches])


@pytest.mark.parametrize("case", PIPELINE_CASES, ids=lambda c: c.id)
def test_tf_dataset_expanded_in_the_generator_equals_the_reference_and_the_map_pipeline(case, tmp_path, monkeypatch):
    write_case(tmp_path / "ds", case)
    ref = reference_records(tmp_path / "ds", case)
    images = np.stack([im for _, im, _ in ref])
    targets = np.stack([np.asarray(t) for _, _, t in ref])
    ds = readers.open(tmp_path / "ds")
    batch = int(np.random.default_rng(case.seed).integers(2, 5))  # never divides the record count
    for one_hot, normalize in ((True, True), (False, True), (True, False), (False, False)):
        x_ref, y_ref = _reference_batch(case, images, targets, one_hot, normalize)
        x, y, sizes = _epoch(ds, batch, shuffle=False, one_hot=one_hot, normalize=normalize,
                             seed=7 if case.compression == "gzip" else None)
        assert sizes[-1] == len(ref) % batch or sizes[-1] == batch
        np.testing.assert_array_equal(x, x_ref)
        assert x.dtype == x_ref.dtype
        np.testing.assert_array_equal(y, y_ref)
        shuffled = _epoch(ds, batch, shuffle=True, seed=3, one_hot=one_hot, normalize=normalize)
        monkeypatch.setattr(batching, "EXPAND_IN_GENERATOR", False)
        before = _epoch(ds, batch, shuffle=True, seed=3, one_hot=one_hot, normalize=normalize)
        monkeypatch.setattr(batching, "EXPAND_IN_GENERATOR", True)
        for got, old in zip(shuffled, before):
            np.testing.assert_array_equal(got, old)


def test_numpy_fallback_gives_the_same_batches_as_the_c_loops(tmp_path, monkeypatch):
    case = Case("npz", "none", 10, 14, (6, 5), "smooth", "class_map", 6, 8)
    write_case(tmp_path / "ds", case)
    ds = readers.open(tmp_path / "ds")
    fast = _epoch(ds, 4, shuffle=True, seed=1)
    monkeypatch.setenv("IMGSHARD_FAST_EXPAND", "0")
    slow = _epoch(ds, 4, shuffle=True, seed=1)
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)
    assert fast[1].sum() > 0 and fast[0].std() > 0


def test_process_exits_promptly_with_a_live_repeating_iterator(tmp_path):
    """A tf.data iterator alive at exit (a module global) is destroyed during finalization;
    the streams are ended first (`batching._quiesce`), so no prefetch thread is inside a
    `numpy_function` waiting for the GIL then (it hung the interpreter before)."""
    case = Case("tfrecord", "none", 64, 48, (12, 12), "noise", "class_map", 5, 9)
    write_case(tmp_path / "ds", case)
    code = ("import readers\n"
            f"ds = readers.open({str(tmp_path / 'ds')!r})\n"
            "it = iter(ds.tf_dataset('train', 2, repeat=True))\n"
            "for _ in range(5):\n    x, y = next(it)\n"
            "assert x.shape == (2, 64, 48, 3) and y.shape == (2, 64, 48, 5)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]  # (TensorFlow's warning that the generator's
    # finalize function could not run during finalization is expected: the stream had ended)
