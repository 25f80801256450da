"""The one (x, y) expansion (`readers.formats.expand`) gives the same batch on its three
backends (NumPy, `tf`, `keras.ops`), checked against a reference computed here; and the
task strategy / enum parser that the stages ask."""

from __future__ import annotations

import numpy as np
import pytest

from readers.formats.expand import KERAS, NUMPY, TF, expand
from readers.tasks import CLASSIFICATION, SEGMENTATION, Task, task_kind

BACKENDS = {"numpy": NUMPY, "tf": TF, "keras": KERAS}


def _reference_one_hot(idx: np.ndarray, depth: int, ignore: int | None) -> np.ndarray:
    out = np.zeros(idx.shape + (depth,), np.float32)
    for pos in np.ndindex(idx.shape):
        v = int(idx[pos])
        if 0 <= v < depth and v != ignore:
            out[pos + (v,)] = 1.0
    return out


def _batch(rng: np.random.Generator, dtype: str, depth: int, ignore: int):
    b, h, w = (int(v) for v in rng.integers(1, 5, 3))
    images = rng.integers(0, 256, (b, h, w, 3), dtype=np.uint8)
    high = 300 if dtype == "uint16" else 256
    targets = rng.integers(0, depth, (b, h, w)).astype(dtype)
    targets[rng.random((b, h, w)) < 0.2] = ignore
    targets[rng.random((b, h, w)) < 0.05] = min(high - 1, depth + 3)  # out of range, not the ignore index
    return images, targets


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("dtype", ["uint8", "uint16"])
def test_class_map_expansion_matches_reference_on_every_backend(backend, dtype):
    rng = np.random.default_rng(7 + len(backend) + len(dtype))
    depth, ignore = int(rng.integers(2, 9)), 255
    images, targets = _batch(rng, dtype, depth, ignore)
    x, y = expand(images, targets, BACKENDS[backend], num_classes=depth, stored_onehot=False,
                  ignore_index=ignore, one_hot=True, normalize=True)
    np.testing.assert_allclose(np.asarray(x), images.astype(np.float32) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(y), _reference_one_hot(targets, depth, ignore))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_in_range_ignore_index_is_an_all_zero_row_on_every_backend(backend):
    labels = np.array([0, 1, 2, 1, 3], np.int64)
    _, y = expand(np.zeros((5, 1, 1, 3), np.uint8), labels, BACKENDS[backend], num_classes=3, stored_onehot=False,
                  ignore_index=1, one_hot=True, normalize=False)
    np.testing.assert_array_equal(np.asarray(y), _reference_one_hot(labels, 3, 1))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_stored_onehot_planes_back_to_class_map_on_every_backend(backend):
    rng = np.random.default_rng(11)
    cmap = rng.integers(0, 4, (2, 5, 6))
    planes = np.eye(4, dtype=np.uint8)[cmap]
    planes[0, 0, 0] = 0  # an ignored pixel: no plane set
    _, y = expand(np.zeros((2, 5, 6, 3), np.uint8), planes, BACKENDS[backend], num_classes=4, stored_onehot=True,
                  ignore_index=200, one_hot=False, normalize=False)
    want = cmap.astype(np.uint8)
    want[0, 0, 0] = 200
    np.testing.assert_array_equal(np.asarray(y), want)


def test_task_kinds_answer_what_differs():
    assert task_kind("segmentation") is SEGMENTATION and task_kind(Task.CLASSIFICATION) is CLASSIFICATION
    assert (SEGMENTATION.dense, SEGMENTATION.target, SEGMENTATION.npz_member) == (True, "mask", "masks")
    assert (CLASSIFICATION.dense, CLASSIFICATION.target, CLASSIFICATION.npz_member) == (False, "label", "labels")
    assert CLASSIFICATION.target_bytes(4, 5, 3, onehot=False, itemsize=1) == 8
    assert SEGMENTATION.target_bytes(4, 5, 3, onehot=True, itemsize=1) == 60
    assert SEGMENTATION.target_bytes(4, 5, 300, onehot=False, itemsize=2) == 40


def test_unknown_task_error_names_the_argument_and_lists_the_tasks():
    with pytest.raises(ValueError, match=r"task must be one of \['segmentation', 'classification'\]. "
                                         r"Received: 'detection'"):
        task_kind("detection")
    with pytest.raises(ValueError, match=r"--task must be one of .* Received: 'x'"):
        Task.parse("x", "--task")
