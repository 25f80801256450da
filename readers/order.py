"""Sample order independent of the host count (``sharding="global"``).

The order of an epoch is a pure function of (seed, epoch) and the dataset (`epoch_order`):
it does not depend on the batch size or on how many replicas read it. A global step
takes the next `replicas x batch_size` samples of that order, and replica r's batch is
its r-th slice of `batch_size` samples (`replica_batches`): with one replica that is
batch g of the plain stream, so for any replica count the union of the replicas'
batches at step g, in replica order, is the one-replica batch g at the global batch
size. Resuming at global step g with another replica count (same global batch size)
continues the same order. The last, partial global batch (without `drop_remainder`) is
split as evenly as the samples allow (`numpy.array_split`); a replica whose share is
empty has one batch fewer that epoch (use `drop_remainder=True` with several replicas).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Modes of the `sharding` argument of `tf_dataset` / `keras_dataset`.
SHARDING_MODES = ("files", "global")


def check_sharding_mode(sharding: object) -> str:
    if sharding not in SHARDING_MODES:
        raise ValueError(f"sharding must be one of {SHARDING_MODES}. Received: sharding={sharding!r}")
    return str(sharding)


def epoch_order(starts: np.ndarray, seed: int, epoch: int, shuffle: bool, window: int,
                counts: np.ndarray | None = None) -> np.ndarray:
    """Global record numbers of an epoch in order: the shard order shuffled, then the
    records permuted in consecutive windows of `window` records (memory bounded like a
    shuffle buffer: a window spans few shards). `starts`: the shards' first record
    numbers and the total (length shards + 1). `counts`: how often each record appears
    (`readers.sampling.epoch_counts`); its repeats are shuffled within its window."""
    total = int(starts[-1])
    if not shuffle:
        plain = np.arange(total, dtype=np.int64)
        return plain if counts is None else np.repeat(plain, counts)
    rng = np.random.default_rng([int(seed), int(epoch), 0x6F72])
    shards = rng.permutation(len(starts) - 1)
    seq = np.concatenate([np.arange(starts[i], starts[i + 1], dtype=np.int64) for i in shards]) if len(shards) \
        else np.zeros(0, np.int64)
    window = max(1, int(window))
    out = []
    for lo in range(0, total, window):
        block = seq[lo:lo + window]
        if counts is not None:
            block = np.repeat(block, counts[block])
        out.append(block[rng.permutation(len(block))])
    return np.concatenate(out) if out else seq


def replica_batches(order: np.ndarray, batch_size: int, replicas: int, index: int,
                    drop_remainder: bool) -> list[np.ndarray]:
    """Replica `index`'s batches of `order` (see the module doc)."""
    step = batch_size * replicas
    full = len(order) // step
    out = [order[g * step + index * batch_size:g * step + (index + 1) * batch_size] for g in range(full)]
    rest = order[full * step:]
    if len(rest) and not drop_remainder:
        share = np.array_split(rest, replicas)[index]
        if len(share):
            out.append(share)
    return out


def replica_plan(starts: np.ndarray, seed: int, epoch: int, options: Any, window: int) -> list[np.ndarray]:
    """The batches of `options.replicas` (a `PipelineOptions`; one replica when None) in
    `epoch`, with `options.repeat_factors` (repeat-factor sampling) when set."""
    from readers.sampling import epoch_counts

    replicas, index = options.replicas or (1, 0)
    factors = options.repeat_factors
    counts = epoch_counts(factors, seed, epoch) if factors is not None else None
    order = epoch_order(starts, seed, epoch, options.shuffle, window, counts)
    return replica_batches(order, options.batch_size, replicas, index, options.drop_remainder)


def occurrences(order: np.ndarray) -> np.ndarray:
    """int64 per position of `order`: how many times its record came earlier in `order`
    (0 for a first copy). Repeated samples use it to draw their own augmentation."""
    order = np.asarray(order)
    idx = np.argsort(order, kind="stable")
    ranked = order[idx]
    first = np.ones(len(ranked), bool)
    first[1:] = ranked[1:] != ranked[:-1]
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(ranked)), 0)) if len(ranked) else idx
    out = np.empty(len(order), np.int64)
    out[idx] = np.arange(len(ranked)) - group_start
    return out


def replica_occurrences(starts: np.ndarray, seed: int, epoch: int, options: Any, window: int) -> list[np.ndarray]:
    """`occurrences` of the global epoch order, cut like `replica_plan`'s batches (the same
    for any replica count)."""
    from readers.sampling import epoch_counts

    replicas, index = options.replicas or (1, 0)
    factors = options.repeat_factors
    counts = epoch_counts(factors, seed, epoch) if factors is not None else None
    order = epoch_order(starts, seed, epoch, options.shuffle, window, counts)
    return replica_batches(occurrences(order), options.batch_size, replicas, index, options.drop_remainder)


def replica_batch(order: np.ndarray, batch_size: int, replicas: int, index: int, b: int) -> np.ndarray:
    """Batch `b` of `replica_batches(order, ...)` without building the others."""
    step = batch_size * replicas
    full = len(order) // step
    if b < full:
        return order[b * step + index * batch_size:b * step + (index + 1) * batch_size]
    return np.array_split(order[full * step:], replicas)[index]


def replica_batch_count(total: int, batch_size: int, replicas: int, index: int, drop_remainder: bool) -> int:
    """len(replica_batches(...)) for `total` samples, without building them."""
    step = batch_size * replicas
    full, rest = divmod(int(total), step)
    last = not drop_remainder and rest > 0 and len(np.array_split(np.arange(rest), replicas)[index]) > 0
    return full + int(last)


__all__ = ["SHARDING_MODES", "check_sharding_mode", "epoch_order", "occurrences", "replica_occurrences", "replica_batch", "replica_batch_count",
           "replica_batches", "replica_plan"]
