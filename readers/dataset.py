"""`readers.open()` and `Dataset`: one converted dataset, read three ways.

* `Dataset.records()`: NumPy `Record`s, no TensorFlow (for JAX, PyTorch, checks).
* `Dataset.tf_dataset()`: a `tf.data.Dataset` of (x, y) batches for `model.fit`.
* `Dataset.keras_dataset()`: a `keras.utils.PyDataset` with random access.

Example::

    ds = readers.open("out/")
    print(ds.splits, ds.num_classes)
    model.fit(ds.tf_dataset("train", 16, seed=0), validation_data=ds.tf_dataset("val", 16, shuffle=False))
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Mapping, NamedTuple

import numpy as np

from readers.augment import check_augment, check_start_step, sample_ids
from readers.bandnorm import BandStats, normalize_mode
from readers.order import check_sharding_mode, replica_batch_count
from readers.resume import check_resume, dataset_identity
from readers.errors import FIX_HINT, ShardError, describe, shard_error
from readers.files import NotRegularFileError, OutsideDatasetError, check_inside, open_regular
from readers.formats import FileFormat, check_compression
from readers.formats.classrange import check_record
from readers.formats._allocator import tune_allocator
from readers.formats.pipeline import PipelineOptions
from readers.formats.spec import Record, RecordSpec, ShardRef
from readers.formats.registry import get_adapter
from readers.manifest import MANIFEST_NAME, Manifest, ManifestError
from readers.cache import CACHE_MAX_BYTES, ShardCache
from readers.storage.url import is_remote, local_path

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from readers.augment import Augment

logger = logging.getLogger(__name__)


class SampleLocation(NamedTuple):
    """Where a sample's record is (`Dataset.find`)."""

    split: str
    file: str  # shard file, relative to the dataset folder
    record: int  # record index in the shard


def open(path: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None,  # noqa: A001
         cache_dir: str | os.PathLike | None = None, cache_max_bytes: int = CACHE_MAX_BYTES) -> "Dataset":
    """Open a converted dataset: the folder holding `imgshard.json`, or that file; or a
    bucket prefix (``s3://bucket/out``, ``gs://bucket/out``; ``file://`` is a local path).

    Loads the manifest (shard lists only: per-sample data stays in the index files
    until `Dataset.keys` or `Dataset.find` asks) and checks every shard's size (`os.stat`
    locally; one listing of the prefix for a bucket). A missing shard raises
    `FileNotFoundError`; a shard whose size differs from the manifest raises
    `readers.errors.ShardError` (a `ValueError`); both name the file (or URL) and the fix.

    Bucket datasets (docs/STORAGE.md, "Reading from buckets"): `storage_options` are
    passed to fsspec (``{"endpoint_url": ..., "anon": True}``; credentials come from the
    usual settings, ``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``...). `tf_dataset`
    and `records` read each shard whole (one GET, checked against the manifest's size and
    digest), `keras_dataset` reads single records by ranged GETs. With `cache_dir`, shards
    and index files are kept there (verified, at most `cache_max_bytes`, least recently
    used out): later epochs read local disk (`readers.cache`). Both are ignored for a
    local dataset.
    """
    return Dataset(path, storage_options=storage_options, cache_dir=cache_dir, cache_max_bytes=cache_max_bytes)


class Dataset:
    """A converted dataset opened for reading (see `open`)."""

    def __init__(self, path: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_max_bytes: int = CACHE_MAX_BYTES):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike. Received: {type(path).__name__}")
        location = os.fspath(path)
        self._store: Any = None
        self._cache: ShardCache | None = None
        if is_remote(location):
            where = self._open_remote(location, storage_options, cache_dir, cache_max_bytes)
        else:
            where = self._open_local(local_path(location))
        try:
            fmt = FileFormat.parse(self._manifest.format)
            check_compression(fmt, self._manifest.compression)
        except ValueError as e:
            raise ManifestError(f"{where}: {e}") from e
        self._adapter = get_adapter(fmt)
        self._spec = RecordSpec.from_manifest(self._manifest, where)

    def _open_local(self, location: str) -> str:
        root = location
        if os.path.isfile(root):
            root = os.path.dirname(os.path.abspath(root))
        self._path = os.path.abspath(root)
        self._manifest = Manifest.load(location)
        where = os.path.join(self._path, MANIFEST_NAME)
        self._refs: dict[str, list[ShardRef]] = {}
        real_root = os.path.realpath(self._path)
        for split, split_entry in self._manifest.splits.items():
            refs = []
            for position, entry in enumerate(split_entry.shards):
                shard_path = os.path.normpath(os.path.join(self._path, entry.file))
                if os.path.commonpath([self._path, shard_path]) != self._path:
                    raise ManifestError(f"{where}: shard file {entry.file!r} points outside the dataset folder.")
                _check_shard_file(shard_path, entry.bytes, real_root)
                refs.append(ShardRef(shard_path, entry, position))
            self._refs[split] = refs
        return where

    def _open_remote(self, location: str, storage_options: Mapping[str, Any] | None,
                     cache_dir: str | os.PathLike | None, cache_max_bytes: int) -> str:
        from readers.remote import list_objects, load_manifest, remote_file
        from readers.storage import open_store

        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError("storage_options must be a mapping of fsspec options (e.g. {'endpoint_url': ...}). "
                            f"Received: {type(storage_options).__name__}")
        if location.endswith("/" + MANIFEST_NAME):
            location = location[:-len(MANIFEST_NAME) - 1]
        self._cache = ShardCache(cache_dir, cache_max_bytes) if cache_dir is not None else None
        self._store = open_store(location, dict(storage_options or {}))
        self._path = self._store.url
        self._manifest = load_manifest(self._store)
        objects = list_objects(self._store)
        self._refs = {}
        for split, split_entry in self._manifest.splits.items():
            self._refs[split] = [
                ShardRef(self._store.url_of(entry.file), entry, position,
                         remote_file(self._store, objects, entry.file, entry.bytes, entry.digest,
                                     self._cache, "shard"))
                for position, entry in enumerate(split_entry.shards)]
        return self._store.url_of(MANIFEST_NAME)

    # -- description ----------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The dataset folder (absolute), or its URL for a bucket dataset."""
        return self._path

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def task(self) -> str:
        """"segmentation" or "classification"."""
        return self._manifest.task

    @property
    def splits(self) -> dict[str, int]:
        """Split name -> number of samples."""
        return {name: entry.num_samples for name, entry in sorted(self._manifest.splits.items())}

    @property
    def classes(self) -> list[tuple[str, tuple[int, int, int] | None]]:
        """(name, (r, g, b)) per class, in class-index order; colour None for classification."""
        return [(c.name, c.color) for c in self._manifest.classes]

    @property
    def num_classes(self) -> int:
        return self._manifest.num_classes

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(height, width, channels) of every image."""
        return self._spec.image_shape

    @property
    def format(self) -> str:
        return self._adapter.file_format.value

    def __repr__(self) -> str:
        return (f"readers.Dataset({self._path!r}, format={self.format!r}, task={self.task!r}, "
                f"splits={self.splits}, image_shape={self.image_shape}, num_classes={self.num_classes})")

    def class_pixel_counts(self, split: str) -> np.ndarray:
        """Pixels of each class in `split` (int64, length num_classes): the sum of the shards'
        `class_pixels` in the manifest; no shard is read. Ignored pixels are not counted."""
        return np.asarray(self._manifest.split(split).class_pixels(self.num_classes), np.int64)

    def class_weights(self, split: str, scheme: str = "median-frequency") -> np.ndarray:
        """Per-class loss weights (float32, length num_classes) from the manifest's counts.

        scheme: "median-frequency" (SegNet: median(f) / f_c, f_c = pixels of c / pixels of
        the images where c occurs) or "inverse-frequency" (N / (K * n_c), mean pixel
        weight 1). The ignore index is excluded; a class absent from `split` gets 0.
        Use them per pixel with `readers.stats.with_sample_weights(w)` in a `tf.data` map,
        or as `class_weight=dict(enumerate(w))` for classification. See `readers.stats`.
        """
        from readers.stats import manifest_class_weights

        return manifest_class_weights(self._manifest, split, scheme)

    # -- shard selection ------------------------------------------------------------------------
    def shards(self, split: str, *, num_shards: int = 1, shard_index: int = 0) -> list[ShardRef]:
        """The shards of `split` whose position i satisfies i % num_shards == shard_index.

        With more processes (`num_shards`) than shard files, some processes get no file
        at all: a warning says so (re-convert with a smaller --shard-size for more files).
        """
        _check_sharding(num_shards, shard_index, "num_shards", "shard_index")
        self._manifest.split(split)  # KeyError naming the valid splits
        refs = self._refs[split]
        if num_shards > len(refs):
            message = (
                f"Split {split!r} of {self._path} has {len(refs)} shard files for num_shards={num_shards} "
                f"processes; shard_index={shard_index} gets {1 if shard_index < len(refs) else 0} of them and "
                f"{num_shards - len(refs)} process(es) get none. Re-convert with a smaller --shard-size "
                "(at least one file per process, ideally several)."
            )
            logger.warning(message)
            warnings.warn(message, stacklevel=3)
        return [ref for ref in refs if ref.position % num_shards == shard_index]

    # -- per-sample data (index files, read on demand) -------------------------------------------
    def keys(self, split: str) -> list[str]:
        """The keys of `split` in `records(split)` order.

        Reads the split's index files (one per shard, checked against their digest in the
        manifest; `readers.index`): `open` loads none of them. Versions 1 and 2 keep
        the keys in the manifest itself.
        """
        from readers.index import ref_keys

        out: list[str] = []
        for ref in self.shards(split):
            out += ref_keys(ref)
        return out

    def find(self, key: str) -> SampleLocation:
        """Where the record of `key` is: (split, shard file, record index).

        Reads index files one at a time until the key is found (never all of them at
        once). Raises KeyError naming the dataset when no split holds `key`.
        """
        from readers.index import ref_table

        if not isinstance(key, str):
            raise TypeError(f"key must be a str. Received: {type(key).__name__}")
        wanted = key.encode("utf-8")
        for split in sorted(self._refs):
            for ref in self._refs[split]:
                entry = ref.entry
                if entry.index is None:
                    keys = entry.keys
                    if key in keys:
                        return SampleLocation(split, entry.file, keys.index(key))
                    continue
                hits = np.flatnonzero(ref_table(ref)["key"] == wanted)
                if len(hits):
                    return SampleLocation(split, entry.file, int(hits[0]))
        raise KeyError(f"No sample with key {key!r} in {self._path}. Keys look like "
                       "'train/NAME.png' (split/relative source path); list them with Dataset.keys(split).")

    # -- NumPy ----------------------------------------------------------------------------------
    def records(self, split: str, *, num_shards: int = 1, shard_index: int = 0) -> Iterator[Record]:
        """Iterate the `Record`s of `split` in manifest shard order and record order.

        num_shards/shard_index select shards i with i % num_shards == shard_index (one
        share per process for JAX / PyTorch multi-process loading). NumPy only; arrays
        are read-only views. Any read or decode error is re-raised as `ShardError`
        naming the shard file and record index, and so is a shard whose records or keys
        differ from the manifest.
        """
        shards = self.shards(split, num_shards=num_shards, shard_index=shard_index)
        return self._iter_records(shards)

    def _iter_records(self, shards: list[ShardRef]) -> Iterator[Record]:
        for shard in shards:
            keys = shard.entry.keys
            count = 0
            for record in self._adapter.iter_shard(shard, self._spec):
                if count >= shard.records:
                    raise shard_error(shard.path, f"holds more records than the {shard.records} in the manifest",
                                      record=count)
                if keys and record.key != keys[count]:
                    raise shard_error(
                        shard.path, f"record key {record.key!r} differs from the manifest's {keys[count]!r}",
                        record=count,
                    )
                check_record(record.mask if self._spec.segmentation else record.label, self._spec, shard.path, count)
                count += 1
                yield record
            if count != shard.records:
                raise shard_error(shard.path, f"holds {count} records, the manifest says {shard.records}")

    # -- tf.data --------------------------------------------------------------------------------
    def tf_dataset(
        self,
        split: str,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int | None = None,
        one_hot: bool = True,
        normalize: bool | str = True,
        repeat: bool = False,
        drop_remainder: bool = False,
        input_context: "tf.distribute.InputContext | None" = None,
        shuffle_buffer: int | None = None,
        augment: "Augment | None" = None,
        epoch: int = 0,
        start_step: int = 0,
        augment_on: str = "host",
        resume: Any = None,
        sharding: str = "files",
        sampling: str = "uniform",
        repeat_threshold: float | None = None,
    ) -> "tf.data.Dataset":
        """A `tf.data.Dataset` of (x, y) batches for `model.fit`.

        Args:
            split: split name (see `splits`).
            batch_size: records per batch (per replica when `input_context` is given:
                pass `input_context.get_per_replica_batch_size(global_batch_size)`).
            shuffle: shuffle shards and records (bounded buffer); False: `records(split)` order.
            seed: makes the shuffle (the order of the output) reproducible; else it varies.
            one_hot: y as float32 one-hot (H, W, C) (or (C,) for classification) where
                the ignore index is an all-zero row; False: the class map as stored
                ((H, W) uint8/uint16) or the int64 label.
            normalize: x as float32 in [0, 1] (divided by the dtype's range: 255 or 65535);
                "stats": float32 (x - mean) / std per band, with the statistics `convert`
                stored (`readers.bandnorm`); False: the image as stored, uint8 or uint16
                (compact mode: expand on the accelerator with `readers.device.ExpandOnDevice`).
            repeat: repeat forever (infinite cardinality; give `steps_per_epoch`).
            drop_remainder: drop the last partial batch (static batch dimension).
            input_context: a `tf.distribute.InputContext`: this pipeline reads the shard files
                i % num_input_pipelines == input_pipeline_id (fewer files than pipelines: a
                warning, and each keeps every num_input_pipelines-th record).
            shuffle_buffer: records in the shuffle buffer. Default: as many as fit in 256 MB
                (`SHUFFLE_BUFFER_BYTES`), at least one batch, at most the whole split.
            augment: a `readers.augment.Augment` for every batch (docs/AUGMENT.md).
            epoch, start_step: the first pass is epoch `epoch` from batch `start_step`, later
                ones the next epochs; the stream is a pure function of (seed, epoch, step).
            augment_on: "host", or "device" for `readers.device.augment_batch` (compact mode).
            resume: a `readers.ResumableInput`, also in `fit`'s callbacks (docs/READERS.md).
            sharding: with `input_context`, "files" (above) or "global": the order of an epoch
                is fixed by (seed, epoch) alone, pipeline r reads slice r of each global step
                (`readers.order`; every pipeline reads all files).
            sampling, repeat_threshold: "repeat-factor" with threshold t: LVIS repeat-factor
                sampling from the class presence in the index files (`readers.sampling`).

        The cardinality is known (batches per epoch), so Keras shows the epoch length.
        Read errors name the shard file and record (`ShardError`, inside TensorFlow's
        `OpError` message; gzip TFRecord read by TensorFlow: checked per file against its
        manifest count, `readers.formats.tfrecord.reader._checked_reader`).

        Speed: docs/READERS.md, "How a batch is built" (`readers.formats.batching`).
        """
        normalize, standardize = normalize_mode(normalize)
        stats = BandStats.from_manifest(self._manifest.image, self._path) if standardize else None
        options = PipelineOptions(batch_size, shuffle=bool(shuffle), seed=seed, one_hot=bool(one_hot),
                                  normalize=bool(normalize), drop_remainder=bool(drop_remainder),
                                  shuffle_buffer=shuffle_buffer, augment=check_augment(augment), epoch=epoch,
                                  start_step=start_step, augment_on=augment_on)
        tune_allocator()
        shards, options, total = self._pipeline_share(split, options, input_context, check_sharding_mode(sharding))
        options, total = self._sampled(split, shards, options, total, sampling, repeat_threshold)
        batches = _batch_count(total, options)
        check_start_step(options.start_step, batches)
        options = resumed_options(resume, options, batches, shards)
        ids = sample_ids(shards) if options.augment is not None else None
        ds = self._adapter.tf_dataset(shards, self._spec, options, ids)
        if stats is not None:
            ds = _standardized(ds, stats, options)
        return finish_pipeline(ds, options, batches, repeat=repeat, distributed=input_context is not None,
                                resumed=resume is not None)

    def _sampled(self, split: str, shards: list[ShardRef], options: PipelineOptions, total: int, sampling: str,
                 threshold: float | None) -> tuple[PipelineOptions, int]:
        """`options` with the repeat factors of `shards` (sampling="repeat-factor") and the
        draws per epoch; unchanged for "uniform"."""
        from readers.sampling import check_sampling, epoch_length, repeat_factors

        check_sampling(sampling, threshold)
        if sampling == "uniform":
            return options, total
        if options.record_shard is not None:
            raise ValueError("sampling='repeat-factor' with fewer shard files than input pipelines needs "
                             "sharding='global'. Received: sharding='files'")
        factors = repeat_factors(self._class_presence(split), float(threshold))  # type: ignore[arg-type]
        starts = np.concatenate([[0], np.cumsum([r.records for r in self.shards(split)])])
        mine = np.concatenate([factors[starts[r.position]:starts[r.position + 1]] for r in shards]) if shards \
            else np.zeros(0)
        return PipelineOptions(**{**_fields(options), "repeat_factors": mine}), epoch_length(mine)

    def _class_presence(self, split: str) -> np.ndarray:
        """(samples, classes) bool: the classes in each sample of `split`, from the index files."""
        from readers.index import ref_classes

        parts = [ref_classes(ref, self.num_classes) for ref in self.shards(split)]
        if any(p is None for p in parts):
            raise ValueError(f"sampling='repeat-factor' needs each sample's classes, stored in the index files at "
                             f"conversion; split {split!r} of {self._path} was converted before imgshard stored them. "
                             "Re-convert it with `imgshard convert ... --rebuild`. Received: index files without "
                             "'classes'")
        return np.concatenate(parts) if parts else np.zeros((0, self.num_classes), bool)

    def _pipeline_share(self, split: str, options: PipelineOptions, input_context: "tf.distribute.InputContext | None",
                        sharding: str = "files") -> tuple[list[ShardRef], PipelineOptions, int]:
        """What one input pipeline of `input_context` reads: (its shards, its options, its
        records; for sharding="global" all of them, `options.replicas` picks its batches)."""
        shards = self.shards(split)
        total = sum(s.records for s in shards)
        if input_context is None:
            return shards, options, total
        num = int(input_context.num_input_pipelines)
        index = int(input_context.input_pipeline_id)
        _check_sharding(num, index, "input_context.num_input_pipelines", "input_context.input_pipeline_id")
        if sharding == "global":
            return shards, PipelineOptions(**{**_fields(options), "replicas": (num, index)}), total
        if len(shards) >= num:
            shards = [s for s in shards if s.position % num == index]
            total = sum(s.records for s in shards)
        else:
            message = (
                f"Split {split!r} of {self._path} has {len(shards)} shard files for {num} input pipelines; "
                "every pipeline will read all files and keep every "
                f"{num}-th record (slower). Re-convert with more shards for file-level sharding."
            )
            logger.warning(message)
            warnings.warn(message, stacklevel=3)
            options = PipelineOptions(**{**_fields(options), "record_shard": (num, index)})
            total = len(range(index, total, num))
        return shards, options, total

    # -- Keras PyDataset ------------------------------------------------------------------------
    def keras_dataset(
        self,
        split: str,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int | None = None,
        one_hot: bool = True,
        normalize: bool | str = True,
        workers: int = 1,
        use_multiprocessing: bool = False,
        max_queue_size: int = 10,
        num_shards: int = 1,
        shard_index: int = 0,
        augment: "Augment | None" = None,
        epoch: int = 0,
        resume: Any = None,
        sharding: str = "files",
        sampling: str = "uniform",
        repeat_threshold: float | None = None,
    ) -> Any:
        """A `keras.utils.PyDataset` of (x, y) NumPy batches with random access.

        Same (x, y) conventions as `tf_dataset`. `__getitem__(i)` reads batch i of the
        current order; `on_epoch_end` reshuffles (with `seed`, reproducibly).
        num_shards/shard_index select shard files as in `records`. TFRecord shards are
        indexed by their record headers and read record by record; gzip TFRecord and
        deflated NPZ shards are decompressed whole and cached per worker (see
        `readers.pydataset`). `augment` and `epoch` as in `tf_dataset` (the same
        TensorFlow batch function, so batch i of epoch e holds the same pixels when the
        two see the same samples); the order is a pure function of (seed, epoch).
        `resume`: a `readers.ResumableInput`, as in `tf_dataset` (the first epoch after a
        restart is the rest of the interrupted one). `sharding="global"`: every process
        reads all files and takes slice `shard_index` of each global step of the order
        fixed by (seed, epoch) (`readers.order`). `sampling`, `repeat_threshold`: as in `tf_dataset`.
        `normalize`: True, False or "stats" (per-band mean/std of the train split), as in `tf_dataset`.
        `workers`, `use_multiprocessing`, `max_queue_size`: the dataset's own pool of threads or
        processes computing batches ahead (`readers.batchfeed`; Keras' enqueuer is not used).
        """
        from readers.pydataset import batches_per_epoch, make_pydataset

        normalize, standardize = normalize_mode(normalize)
        stats = BandStats.from_manifest(self._manifest.image, self._path) if standardize else None
        options = PipelineOptions(batch_size, shuffle=bool(shuffle), seed=seed, one_hot=bool(one_hot),
                                  normalize=bool(normalize), augment=check_augment(augment), epoch=epoch)
        tune_allocator()
        if check_sharding_mode(sharding) == "global":
            _check_sharding(num_shards, shard_index, "num_shards", "shard_index")
            options = PipelineOptions(**{**_fields(options), "replicas": (num_shards, shard_index)})
            num_shards, shard_index = 1, 0
        shards = self.shards(split, num_shards=num_shards, shard_index=shard_index)
        options, total = self._sampled(split, shards, options, sum(s.records for s in shards), sampling,
                                       repeat_threshold)
        options = resumed_options(resume, options, batches_per_epoch(total, options), shards)
        readers = [self._adapter.random_access(s, self._spec) for s in shards]
        ids = sample_ids(shards) if options.augment is not None else None
        seq = make_pydataset(readers, [s.records for s in shards], self._spec, options, workers=workers,
                             use_multiprocessing=use_multiprocessing, max_queue_size=max_queue_size, ids=ids)
        seq.band_stats = stats  # normalize="stats": the numbers of tf_dataset
        if resume is not None:
            resume.attach(seq)
        return seq

    def pipeline_parts(self) -> tuple[Any, RecordSpec]:
        """(format adapter, record layout): what a pipeline over this dataset's shards needs
        (`readers.mix`)."""
        return self._adapter, self._spec

    # -- Grain ----------------------------------------------------------------------------------
    def grain_source(self, split: str, *, num_shards: int = 1, shard_index: int = 0) -> Any:
        """A Grain `RandomAccessDataSource` over `split` (`readers.grain_source.GrainSource`):
        item i is record i of `records(split)` as ``{"image", "mask" | "label", "key"}``,
        the arrays as stored. num_shards/shard_index select shard files as in `records`.
        Grain itself is not imported (install the `grain` extra to use it). Recipe:
        docs/READERS.md, "Grain"."""
        from readers.grain_source import make_source

        return make_source(self, split, num_shards, shard_index, _grain_source_at)

    def grain_batch_map(self, *, augment: "Augment | None" = None, seed: int | None = None, one_hot: bool = True,
                        normalize: bool = True, epoch: int = 0, batches_per_epoch: int | None = None) -> Any:
        """The (index, batch) -> (x, y) map for a batched Grain pipeline over `grain_source`:
        `augment` drawn from (seed, epoch + index // batches_per_epoch, key), then the
        expansion of `tf_dataset` (`readers.grain_source.GrainBatchMap`)."""
        from readers.grain_source import GrainBatchMap

        options = PipelineOptions(1, seed=seed, one_hot=bool(one_hot), normalize=bool(normalize),
                                  augment=check_augment(augment), epoch=epoch)
        return GrainBatchMap(self._spec, options, batches_per_epoch)


def _grain_source_at(path: str, split: str, num_shards: int, shard_index: int) -> Any:
    """`Dataset(path).grain_source(...)`: how a pickled `GrainSource` reopens its dataset."""
    return Dataset(path).grain_source(split, num_shards=num_shards, shard_index=shard_index)


def finish_pipeline(ds: "tf.data.Dataset", options: PipelineOptions, batches: int, *, repeat: bool,
                     distributed: bool, resumed: bool = False) -> "tf.data.Dataset":
    """Cardinality (unless resumed: the first pass is shorter), repeat, prefetch, options."""
    import tensorflow as tf

    if options.start_step == 0:
        ds = ds.apply(tf.data.experimental.assert_cardinality(batches))
    if repeat:
        ds = ds.repeat()
    ds = ds.prefetch(tf.data.AUTOTUNE)
    tf_options = tf.data.Options()
    tf_options.autotune.enabled = True
    tf_options.deterministic = (not options.shuffle) or options.seed is not None
    if distributed:
        tf_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.with_options(tf_options)
    if resumed and options.start_step > 0 and not repeat:
        _report_cardinality(ds, batches)
    return ds


def _standardized(ds: "tf.data.Dataset", stats: BandStats, options: PipelineOptions) -> "tf.data.Dataset":
    """`ds` with normalize='stats' applied on the host."""
    if options.augment_on == "device":
        raise ValueError("normalize='stats' standardises on the host; with augment_on='device' use "
                         "normalize=False and standardise after readers.device.augment_batch. "
                         "Received: normalize='stats', augment_on='device'")
    return ds.map(stats.tf_map(), num_parallel_calls=-1, deterministic=True)  # -1: tf.data.AUTOTUNE


def _batch_count(total: int, options: PipelineOptions) -> int:
    """Batches per epoch of a pipeline reading `total` records (its share with `options.replicas`)."""
    if options.replicas is not None:
        return replica_batch_count(total, options.batch_size, *options.replicas, options.drop_remainder)
    return total // options.batch_size if options.drop_remainder else math.ceil(total / options.batch_size)


def resumed_options(resume: Any, options: PipelineOptions, batches: int,
                    shards: list[ShardRef]) -> PipelineOptions:
    """`options` with the seed, epoch and start step that `resume` gives (`readers.resume`);
    `shards`, what the input reads, in order, must be what the backup's input read."""
    if resume is None:
        return options
    seed, epoch, step = check_resume(resume).claim(options.seed, options.epoch, options.start_step, batches,
                                                   options.effective_seed(), dataset_identity(shards))
    return PipelineOptions(**{**_fields(options), "seed": seed, "epoch": epoch, "start_step": step})


def _report_cardinality(ds: "tf.data.Dataset", batches: int) -> None:
    """Make Keras see a whole epoch's batches (`cardinality`) although the first pass is
    the rest of a resumed epoch: Keras then ends that epoch when the pass ends and runs
    the later ones whole (with an unknown cardinality it would cut every later epoch to
    the first pass's length)."""
    import tensorflow as tf

    ds.cardinality = lambda: tf.constant(batches, tf.int64)  # type: ignore[method-assign]


def _fields(options: PipelineOptions) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


def _check_sharding(num: Any, index: Any, num_name: str, index_name: str) -> None:
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num < 1:
        raise ValueError(f"{num_name} must be an integer >= 1. Received: {num_name}={num!r}")
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < num:
        raise ValueError(f"{index_name} must be an integer in [0, {num}). Received: {index_name}={index!r}")


def _check_shard_file(path: str, expected: int, real_root: str) -> None:
    """The shard exists, is a regular file inside the dataset folder (symlinks resolved),
    can be opened and has the manifest's size."""
    try:
        check_inside(real_root, path)
        fd = open_regular(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"Shard file {path} is missing (the manifest lists it with {expected} bytes). {FIX_HINT}"
        ) from None
    except PermissionError:
        raise PermissionError(f"Shard file {path} is not readable by this process. Fix its permissions.") from None
    except (NotRegularFileError, OutsideDatasetError) as e:
        raise ShardError(f"Shard file {e}. {FIX_HINT}", path=path) from e
    except OSError as e:
        raise ShardError(f"Shard file {path} cannot be opened ({describe(e)}). {FIX_HINT}", path=path) from e
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size != expected:
        raise ShardError(
            f"Shard file {path} has the wrong size: expected {expected} bytes (from the manifest). "
            f"Received: {size} bytes. The file is truncated or was rewritten. {FIX_HINT}",
            path=path,
        )


__all__ = ["Dataset", "SampleLocation", "open"]
