"""Options of one `tf.data` / PyDataset pipeline, checked once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from readers.formats.spec import ShardRef

#: Default bound on the bytes held by a shuffle buffer (serialized or decoded records).
SHUFFLE_BUFFER_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class PipelineOptions:
    """Options of one `tf.data` / PyDataset pipeline, checked once."""

    batch_size: int
    shuffle: bool = True
    seed: int | None = None
    one_hot: bool = True
    normalize: bool = True
    drop_remainder: bool = False
    shuffle_buffer: int | None = None  # records; None = bounded by SHUFFLE_BUFFER_BYTES
    #: (num, index): keep every num-th record starting at index, over all shards in order
    #: (the fallback when there are fewer shards than input pipelines).
    record_shard: tuple[int, int] | None = None
    #: The epoch of the first pass and the batch it starts at (`Dataset.tf_dataset`).
    epoch: int = 0
    start_step: int = 0
    #: A `readers.augment.Augment`, or None; "host": applied in the pipeline, "device":
    #: handed over as ((uint8 images, params), targets) for `readers.device.augment_batch`.
    augment: Any = None
    augment_on: str = "host"
    #: (replicas, index): read batch slice `index` of every global step of the order
    #: that (seed, epoch) alone fixes (``sharding="global"``, `readers.order`).
    replicas: tuple[int, int] | None = None
    #: Repeat-factor sampling: one float per record of the pipeline's shards, in order
    #: (`readers.sampling`); each epoch draws round(sum) records by them.
    repeat_factors: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("epoch", "start_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0. Received: {name}={value!r}")
        if self.replicas is not None and self.shuffle and self.seed is None:
            raise ValueError("seed must be an int with sharding='global' (every replica must draw the same order). "
                             "Received: seed=None")
        if self.augment_on not in ("host", "device"):
            raise ValueError(f"augment_on must be 'host' or 'device'. Received: augment_on={self.augment_on!r}")
        if self.augment_on == "device" and (self.augment is None or self.normalize or self.one_hot):
            raise ValueError("augment_on='device' needs an augment and compact mode (normalize=False, "
                             f"one_hot=False). Received: augment={self.augment!r}, normalize={self.normalize}, "
                             f"one_hot={self.one_hot}")
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"batch_size must be a positive integer. Received: batch_size={self.batch_size!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))):
            raise TypeError(f"seed must be an int or None. Received: seed={self.seed!r}")
        if self.shuffle_buffer is not None and (
            isinstance(self.shuffle_buffer, bool) or not isinstance(self.shuffle_buffer, (int, np.integer))
            or self.shuffle_buffer < 1
        ):
            raise ValueError(
                "shuffle_buffer must be a positive number of records or None. "
                f"Received: shuffle_buffer={self.shuffle_buffer!r}"
            )

    def effective_seed(self) -> int:
        """The seed as a non-negative int; a fresh random one (per call) when None."""
        if self.seed is None:
            return int(np.random.SeedSequence().entropy) % (1 << 63)
        return int(self.seed) % (1 << 64)

    @property
    def planned(self) -> bool:
        """Whether the pipeline must be the planned generator (`readers.formats.batching`),
        whose stream is a pure function of (seed, epoch, step): a seed, augmentation, or a
        start other than the first batch of epoch 0."""
        return self.seed is not None or self.requires_plan

    @property
    def requires_plan(self) -> bool:
        """Augmentation or a resumed start: only the planned generator can do them."""
        return (self.augment is not None or self.epoch != 0 or self.start_step != 0 or self.replicas is not None
                or self.repeat_factors is not None)

    def buffer_records(self, shards: Sequence[ShardRef]) -> int:
        """Shuffle buffer size in records: the explicit value, else as many records as
        fit in `SHUFFLE_BUFFER_BYTES` (by the shards' average record size), never less
        than one batch and never more than the records there are."""
        total = sum(s.records for s in shards)
        if self.shuffle_buffer is not None:
            return int(self.shuffle_buffer)
        nbytes = sum(s.entry.bytes for s in shards)
        per_record = max(1, nbytes // max(1, total))
        return int(max(self.batch_size, min(max(total, 1), SHUFFLE_BUFFER_BYTES // per_record)))


__all__ = ["SHUFFLE_BUFFER_BYTES", "PipelineOptions"]
