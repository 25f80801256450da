"""Stored class values are classes or the ignore index: anything else is a named error.

A class map value v is valid when v < num_classes or v is the ignore index; a label when
0 <= label < num_classes. The one-hot expansion (`readers.formats.expand`) turns any
other value into an all-zero row, exactly what an ignored pixel gives, so a damaged or
mis-written mask would train silently as "ignore"; the readers refuse it instead, naming
the shard, the record, the value and where it is:

* `check_record` per record: `Dataset.records()`, the random-access readers
  (`keras_dataset`), and every decoded PNG mask (`readers.formats.encoding.decode_mask`,
  so every path over encoded records);
* `checked_load` once per shard and process for the generator pipeline (`tf_dataset`):
  a shard's raw class maps are checked when it is first loaded (like the CRC policy
  "once", `readers.formats.base.crc_due`); shards are immutable, named by digest in the
  manifest, so a shard checked once stays checked.

Cost: one ``max`` over the class map (no allocation); only maps holding values at or
above `num_classes` (the ignore index, usually) take a second look.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import numpy as np

from readers.errors import shard_error

_checked: set[tuple[str, str]] = set()
_lock = threading.Lock()


def out_of_range(cmap: Any, num_classes: int, ignore_index: int | None) -> tuple[int, tuple[int, ...]] | None:
    """(value, position) of the first value of `cmap` that is neither a class nor the ignore
    index; None when every value is valid."""
    cmap = np.asarray(cmap)
    if cmap.size == 0 or int(cmap.max()) < num_classes:
        return None
    bad = cmap >= num_classes
    if ignore_index is not None and ignore_index >= num_classes:
        bad &= cmap != ignore_index
    if not bad.any():
        return None
    pos = np.unravel_index(int(np.argmax(bad)), cmap.shape)
    return int(cmap[pos]), tuple(int(p) for p in pos)


def _where(pos: tuple[int, ...]) -> str:
    return f" at (row {pos[0]}, column {pos[1]})" if len(pos) >= 2 else ""


def problem(target: Any, spec: Any) -> str | None:
    """Why `target` (a class map or a label) is not valid for `spec`; None when it is."""
    if not spec.segmentation:
        label = int(target)
        return None if 0 <= label < spec.num_classes else f"label {label} is not a class (0..{spec.num_classes - 1})"
    if spec.mask_encoding == "onehot" or target is None:
        return None
    found = out_of_range(target, spec.num_classes, spec.ignore_index)
    if found is None:
        return None
    value, pos = found
    ignore = f" nor the ignore index {spec.ignore_index}" if spec.ignore_index is not None else ""
    return (f"mask holds class value {value}{_where(pos)}, which is neither a class (0..{spec.num_classes - 1})"
            f"{ignore}; one-hot would make it an all-zero (ignored) row")


def check_record(target: Any, spec: Any, path: str, record: int | None) -> None:
    """Raise `ShardError` naming `path` and `record` when `problem(target, spec)` finds one."""
    why = problem(target, spec)
    if why is not None:
        raise shard_error(path, why, record=record)


def check_targets(targets: Any, spec: Any, path: str) -> None:
    """Every record of a shard's targets (an (N, ...) array or a sequence of records)."""
    if isinstance(targets, np.ndarray):
        if spec.segmentation and out_of_range(targets, spec.num_classes, spec.ignore_index) is None:
            return
        if not spec.segmentation and not ((targets < 0) | (targets >= spec.num_classes)).any():
            return
    for j in range(len(targets)):
        check_record(targets[j], spec, path, j)


def checked_load(load: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """`load(shard, spec)` that checks a shard's raw targets the first time this process
    loads it. Encoded masks are checked as they are decoded (`check_record` in
    `decode_mask`), so their lazy columns are left alone."""

    def load_checked(shard: Any, spec: Any) -> Any:
        arrays = load(shard, spec)
        if spec.segmentation and (spec.mask_codec != "raw" or spec.mask_encoding == "onehot"):
            return arrays
        key = (shard.path, shard.entry.digest)
        with _lock:
            if key in _checked:
                return arrays
        check_targets(arrays.targets, spec, shard.path)
        with _lock:
            _checked.add(key)
        return arrays

    return load_checked




def tf_checked_targets(targets: Any, paths: Any, indices: Any, spec: Any) -> Any:
    """In a graph (TensorFlow's reader path): `targets` of a batch, after asserting that
    every value is a class (or the ignore index in maps). A failure names the shard and
    record of the first bad one as `check_record` does ("shard S, record R: mask holds class
    value V at (row r, column c), ..."), so every read path gives the same words."""
    import tensorflow as tf

    c = spec.num_classes
    if spec.segmentation and spec.mask_encoding == "onehot":
        return targets
    values = tf.cast(targets, tf.int64)
    bad = (values >= c) | (values < 0)
    if spec.segmentation and spec.ignore_index is not None:
        bad &= values != spec.ignore_index
    flat = tf.reshape(bad, [tf.shape(bad)[0], -1])
    row = tf.argmax(tf.cast(tf.reduce_any(flat, axis=1), tf.int32), output_type=tf.int32)
    value = tf.gather(tf.reshape(values, [tf.shape(values)[0], -1]), row)
    at = tf.argmax(tf.cast(flat[row], tf.int32), output_type=tf.int32)
    where = tf.strings.join(["shard ", paths[row], ", record ", tf.strings.as_string(indices[row])])
    if spec.segmentation:
        problem = tf.strings.join([
            ": mask holds class value ", tf.strings.as_string(value[at]), " at (row ",
            tf.strings.as_string(at // spec.width), ", column ", tf.strings.as_string(at % spec.width),
            f"), which is neither a class (0..{c - 1})",
            f" nor the ignore index {spec.ignore_index}" if spec.ignore_index is not None else "",
            "; one-hot would make it an all-zero (ignored) row"])
    else:
        problem = tf.strings.join([": label ", tf.strings.as_string(value[0]), f" is not a class (0..{c - 1})"])
    from readers.errors import FIX_HINT

    check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [
        tf.strings.join([where, problem, f". {FIX_HINT}"])])
    with tf.control_dependencies([check]):
        return tf.identity(targets)


def _new_locks() -> None:  # a forked child (keras_dataset workers) must not inherit a lock a thread held
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_locks)


__all__ = ["check_record", "check_targets", "checked_load", "out_of_range", "problem", "tf_checked_targets"]
