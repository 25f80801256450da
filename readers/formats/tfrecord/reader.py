"""TFRecord shards: the reader side (NumPy records, `tf.data` pipeline, random access).

NumPy reading and random access use the pure-Python codec in
`readers.formats.tfrecord.wire` (no TensorFlow); the `tf.data` pipeline uses
TensorFlow's own reader and parses whole batches at once. Shards are opened only through
`readers.sources` (local file, whole object, ranged reads): shards of bucket datasets
never reach TensorFlow's file reader (no tensorflow-io).
"""

from __future__ import annotations

import collections
import functools
import os
import struct
import threading
import zlib
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np

from readers.errors import FIX_HINT, REOPEN_HINT, describe, shard_error
from readers.formats.classrange import check_record, checked_load, tf_checked_targets
from readers.sources import ByteSource, is_ranged, open_source
from readers.formats import (
    FEATURE_HEIGHT,
    FEATURE_IMAGE,
    FEATURE_KEY,
    FEATURE_LABEL,
    FEATURE_MASK,
    FEATURE_WIDTH,
    FileFormat,
)
from readers.formats import layouts
from readers.formats.base import (CountError, FileAdapter, RandomAccessShard, crc_due, file_key, mark_verified,
                                  naming_shard)
from readers.formats.encoding import (decode_record, decode_stored, image_column, mask_column,
                                      tf_checked_mask_strings, tf_decode_batch)
from readers.formats.expand import make_expand_tf
from readers.formats.pipeline import PipelineOptions
from readers.formats.spec import Record, RecordSpec, ShardRef

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from readers.formats.batching import ShardArrays

_HEADER = struct.Struct("<QI")
_HEADER_BYTES = 12
_FOOTER_BYTES = 4

#: Decompressed gzip shards kept per random-access reader (per worker), least recently used out.
GZIP_CACHE_BYTES = 1 << 30

#: Mapped shards kept open per process by the random-access reader.
MAPPED_SHARDS = 1024
#: Files read at once by the shuffled `tf.data` pipeline.
INTERLEAVE_CYCLE = 4
#: "mapped": uncompressed shards are read through `load_mapped` and the generator
#: pipeline; "tf": always TensorFlow's `TFRecordDataset` (a pure graph pipeline).
ENGINE = "mapped"
#: Check in the tf.data pipeline that each file gave all its records, naming the file if
#: not (see `_checked_reader`); False uses TensorFlow's reader alone.
NAME_FILES_IN_ERRORS = True
#: Records per check of the file-naming reader.
CHECK_BLOCK = 32
#: Read buffer of each `TFRecordDataset` file reader: 0 reads each record straight
#: into its string (one copy less than a buffered stream; records are large).
READ_BUFFER_BYTES = 0
#: Files read in parallel by the ordered (shuffle=False) pipeline.
READ_AHEAD_FILES = 2
ORDERED_PARALLEL = True


def record_from_features(features: Mapping[str, list], spec: RecordSpec, path: str, index: int) -> Record:
    """Build a `Record` from a decoded `tf.train.Example` (see `readers.formats`): image
    and mask as arrays when raw, as their stored bytes when encoded."""

    def one(name: str) -> Any:
        values = features.get(name)
        if not values:
            raise shard_error(path, f"feature {name!r} is missing or empty", record=index)
        return values[0]

    h, w = int(one(FEATURE_HEIGHT)), int(one(FEATURE_WIDTH))
    if (h, w) != (spec.height, spec.width):
        raise shard_error(
            path, f"image is {h}x{w} but the manifest says {spec.height}x{spec.width}", record=index
        )
    key = one(FEATURE_KEY)
    key = key.decode("utf-8") if isinstance(key, (bytes, bytearray)) else str(key)
    if spec.image_codec != "raw":
        image: Any = bytes(one(FEATURE_IMAGE))  # stored bytes: decoded by `decode_stored`
    else:
        image = _frombuffer(one(FEATURE_IMAGE), spec.image_np_dtype, spec.image_shape, "image", path, index)
        image = image.astype(image.dtype.newbyteorder("="), copy=False)
    if spec.segmentation:
        if spec.mask_codec != "raw":
            return Record(key, image, mask=bytes(one(FEATURE_MASK)), label=None)
        mask = _frombuffer(one(FEATURE_MASK), spec.mask_np_dtype, spec.mask_shape, "mask", path, index)
        return Record(key, image, mask=mask.astype(mask.dtype.newbyteorder("="), copy=False), label=None)
    return Record(key, image, mask=None, label=int(one(FEATURE_LABEL)))


def _frombuffer(data: bytes, dtype: Any, shape: tuple[int, ...], what: str, path: str, index: int) -> np.ndarray:
    dtype = np.dtype(dtype)
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) != expected:
        raise shard_error(
            path, f"{what} holds {len(data)} bytes, expected {expected} for shape {shape} {dtype.name}",
            record=index,
        )
    return np.frombuffer(data, dtype).reshape(shape)


class TFRecordAdapter(FileAdapter):
    file_format = FileFormat.TFRECORD

    # -- NumPy records -------------------------------------------------------------------------
    def iter_shard(self, shard: ShardRef, spec: RecordSpec) -> Iterator[Record]:
        return decode_stored(self.iter_stored(shard, spec), spec, shard.path)

    def iter_stored(self, shard: ShardRef, spec: RecordSpec) -> Iterator[Record]:
        from readers.formats.tfrecord import wire as tfrecord_wire

        if shard.source is None:  # a local file: the codec opens it (and names it)
            yield from self._iter_stored(tfrecord_wire.iter_records(shard.path, compression=spec.compression,
                                                                    check_crc=True), shard, spec)
            return
        with naming_shard(shard.path):
            source = open_source(shard)
        with source:
            yield from self._iter_stored(tfrecord_wire.iter_records(source.fileobj(), compression=spec.compression,
                                                                    check_crc=True), shard, spec)

    @staticmethod
    def _iter_stored(records: Iterator[bytes], shard: ShardRef, spec: RecordSpec) -> Iterator[Record]:
        from readers.formats.tfrecord import wire as tfrecord_wire

        index = 0
        while True:
            with naming_shard(shard.path, index):
                try:
                    payload = next(records)
                except StopIteration:
                    return
                record = record_from_features(tfrecord_wire.decode_example(payload), spec, shard.path, index)
            yield record
            index += 1

    # -- tf.data --------------------------------------------------------------------------------
    def tf_dataset(self, shards: Sequence[ShardRef], spec: RecordSpec, options: PipelineOptions,
                   ids: "np.ndarray | None" = None) -> "tf.data.Dataset":
        """Batched (x, y) from TFRecord shards.

        Uncompressed shards (with `ENGINE` = "mapped", the default) are memory-mapped and
        cut into batches by the shared generator pipeline (`readers.formats.batching`):
        each record's length and data CRC32C are checked (hardware CRC, ~10 GB/s), the
        image and mask bytes are located in the `tf.train.Example` and gathered straight
        from the page cache into a 64-byte-aligned batch that TensorFlow takes without a
        copy: one copy per byte in all, against three (read, parse, decode) plus a slower
        CRC for TensorFlow's reader. Damage raises `ShardError` naming file and record.
        Gzip shards (and `ENGINE` = "tf") use `tf_reader_dataset`, TensorFlow's reader,
        except for planned pipelines (a seed, augmentation, resume:
        `PipelineOptions.planned`), which read gzip shards whole (`load_whole`) into the
        generator pipeline so that the stream is a pure function of (seed, epoch, step),
        and encoded (PNG/JPEG/WebP) records, which decode there with the strict rules of
        `records()` (`readers.formats.pngmask`) and errors naming shard and record.
        """
        remote = any(s.source is not None for s in shards)  # bucket shards: whole-object reads, no tensorflow-io
        # Encoded records decode in the generator (the strict Pillow rules of every other path,
        # errors naming shard and record), never in TensorFlow's lenient graph decoders.
        encoded = spec.image_codec != "raw" or spec.mask_codec != "raw"
        if options.requires_plan or remote or (ENGINE == "mapped" and (
                spec.compression == "none" or options.planned or encoded)):
            from readers.formats.batching import expands_in_generator, generator_dataset

            load = (functools.partial(load_located, read_into_batches=not expands_in_generator(spec, options))
                    if spec.compression == "none" else load_whole)
            return generator_dataset(shards, spec, options, checked_load(load), ids)
        return self.tf_reader_dataset(shards, spec, options)

    def tf_reader_dataset(self, shards: Sequence[ShardRef], spec: RecordSpec,
                          options: PipelineOptions) -> "tf.data.Dataset":
        """Batched (x, y) from TFRecord shards through TensorFlow's own reader (graph only).

        shuffle=False: the files are read in order, one after another, so the order equals
        `Dataset.records()`. shuffle=True: the file order is shuffled every epoch (with the
        seed), `INTERLEAVE_CYCLE` files are read in parallel, and the serialized records
        (cheap strings) pass through a shuffle buffer of `options.buffer_records()`
        records. Batches are parsed as a whole (`tf.io.parse_example` on a vector of
        strings, `decode_raw`, reshape) and expanded in the same parallel map.
        """
        import tensorflow as tf

        paths = tf.constant([s.path for s in shards], tf.string, shape=[len(shards)])
        counts = tf.constant([s.records for s in shards], tf.int64, shape=[len(shards)])
        read = _checked_reader(spec.compression) if NAME_FILES_IN_ERRORS else _plain_reader(spec.compression)
        files = tf.data.Dataset.from_tensor_slices((paths, counts))
        # Ordered output unless shuffling without a seed (then the fastest file wins).
        deterministic = (not options.shuffle) or options.seed is not None
        if options.record_shard is not None:
            # Every pipeline reads every file in the same order and keeps its share.
            ds = files.flat_map(read).shard(*options.record_shard)
        elif options.shuffle and len(shards) > 1:
            ds = files.shuffle(len(shards), seed=options.seed, reshuffle_each_iteration=True).interleave(
                read,
                cycle_length=min(len(shards), INTERLEAVE_CYCLE),
                block_length=1,
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=deterministic,
            )
        else:
            # Ordered: a whole file per block, so the output order is the sequential one,
            # while the next files are read ahead in parallel.
            ds = files.interleave(
                read,
                cycle_length=min(len(shards), READ_AHEAD_FILES) or 1,
                block_length=max([s.records for s in shards] or [1]),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            ) if ORDERED_PARALLEL else files.flat_map(read)
        if options.shuffle:
            ds = ds.shuffle(options.buffer_records(shards), seed=options.seed, reshuffle_each_iteration=True)
        ds = ds.batch(options.batch_size, drop_remainder=options.drop_remainder)
        parse = make_batch_parser(spec, one_hot=options.one_hot, normalize=options.normalize,
                                  batch_size=options.batch_size if options.drop_remainder else None)
        return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)

    # -- random access ----------------------------------------------------------------------------
    def count_records(self, path: str, spec: RecordSpec, *, check_crc: bool = False) -> int:
        from readers.formats.tfrecord import wire

        try:
            return wire.count_records(path, compression=spec.compression, check_crc=check_crc)
        except wire.TFRecordCorruptError as e:
            raise CountError(str(e).replace(f"Corrupt TFRecord file {path!r}: ", ""), e.record) from e

    def random_access(self, shard: ShardRef, spec: RecordSpec) -> "TFRecordRandomAccess":
        return TFRecordRandomAccess(shard, spec)


_MASK_DELTA = 0xA282EAD8


def _masked_crc32c(data: np.ndarray) -> int:
    import google_crc32c

    crc = google_crc32c.value(data)  # accepts read-only arrays without a copy
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError(f"bad varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def locate_features(buf: Any, start: int, end: int) -> dict[str, tuple[int, int, int]]:
    """Where each feature's first value lies in a serialized `tf.train.Example`.

    Returns {name: (kind, offset, length)}: kind 1 bytes (offset/length of the bytes),
    3 int64 (length holds the value), 2 float (offset/length of the packed floats).
    Walks only the message headers; the values are not copied.
    """
    out: dict[str, tuple[int, int, int]] = {}
    pos = start
    while pos < end:  # Example
        tag, pos = _varint(buf, pos, end)
        if tag & 7 != 2:
            raise ValueError(f"unexpected wire type {tag & 7} in Example at byte {pos}")
        size, pos = _varint(buf, pos, end)
        fend = pos + size
        if tag >> 3 != 1:
            pos = fend
            continue
        while pos < fend:  # Features: map entries
            tag, pos = _varint(buf, pos, fend)
            size, pos = _varint(buf, pos, fend)
            eend = pos + size
            name = None
            value: tuple[int, int, int] | None = None
            while pos < eend:  # entry: key = 1, value = 2
                etag, pos = _varint(buf, pos, eend)
                esize, pos = _varint(buf, pos, eend)
                if etag == 0x0A:
                    name = bytes(buf[pos:pos + esize]).decode("utf-8")
                elif etag == 0x12:
                    value = _locate_feature(buf, pos, pos + esize)
                pos += esize
            if name is not None and value is not None:
                out[name] = value
            pos = eend
    if pos != end:
        raise ValueError("Example runs past its record")
    return out


def _locate_feature(buf: Any, pos: int, end: int) -> tuple[int, int, int] | None:
    while pos < end:  # Feature: oneof bytes_list = 1, float_list = 2, int64_list = 3
        tag, pos = _varint(buf, pos, end)
        size, pos = _varint(buf, pos, end)
        kind, lend = tag >> 3, pos + size
        while pos < lend:  # the list's repeated value = 1
            vtag, pos = _varint(buf, pos, lend)
            if vtag == 0x08 and kind == 3:  # unpacked int64
                value, pos = _varint(buf, pos, lend)
                return 3, 0, value - (1 << 64) if value >= 1 << 63 else value
            vsize, pos = _varint(buf, pos, lend)
            if kind == 3:  # packed int64
                value, _ = _varint(buf, pos, pos + vsize)
                return 3, 0, value - (1 << 64) if value >= 1 << 63 else value
            return kind, pos, vsize
        pos = lend
    return None


def load_mapped(shard: ShardRef, spec: RecordSpec, *, check_crc: "bool | str" = "once") -> "ShardArrays":
    """Map an uncompressed TFRecord shard and view its records' arrays (no copy).

    Checks every record's framing and length CRC, its data CRC32C (always with
    `check_crc=True`, the first time per process with "once", see
    `readers.formats.base.CRC_POLICY`), the features against the manifest, and the
    record count; any problem raises `ShardError` naming the file and the record.
    """
    path = shard.path
    with naming_shard(path):
        with open_source(shard) as source:
            check_crc, verified_key = crc_due(path, source.stat, check_crc)
            mapped = _map(source, path)  # the file mapped, or a bucket object read whole (checked)
    return _walk(mapped, shard, spec, check_crc, verified_key)


def load_located(shard: ShardRef, spec: RecordSpec, *, read_into_batches: bool = False) -> "ShardArrays":
    """`load_mapped` for the `tf.data` generator pipeline: the first load of a local
    shard per process walks and checks it (as `load_mapped`) and remembers where its
    records lie (`readers.formats.layouts`); later loads (later epochs) do not walk it
    again: they map it and view the records at those offsets, or, with
    `read_into_batches` (compact batches: each record's bytes go unchanged into its batch
    row), keep the file open and read each record with `pread` straight into its row (no
    mapping, no page faults). Shards of bucket datasets and of encoded records: `load_mapped`."""
    from readers.formats.batching import ShardArrays
    from readers.sources import FileSource

    encoded = spec.image_codec != "raw" or (spec.segmentation and spec.mask_codec != "raw")
    if encoded or shard.source is not None:
        return load_mapped(shard, spec)
    path = shard.path
    rows = ((spec.image_shape, spec.image_np_dtype), (spec.mask_shape, spec.mask_np_dtype) if spec.segmentation else None)
    with naming_shard(path):
        source = FileSource(path)
        st = source.stat
        key = file_key(path, st)
        layout = layouts.recall(key)
        if layout is not None and read_into_batches:
            return ShardArrays(*layouts.columns(layout, *rows, shard=layouts.OpenShard(source)))
        with source:
            check_crc, verified_key = crc_due(path, st, "once") if layout is None else (False, None)
            mapped = _map(source, path)
    if layout is not None:
        return ShardArrays(*layouts.columns(layout, *rows, buf=np.frombuffer(mapped, np.uint8)))
    walked = _walk(mapped, shard, spec, check_crc, verified_key)
    if not (check_crc and verified_key is None):  # (a policy that checks every load: no reuse)
        base = np.frombuffer(mapped, np.uint8)
        layouts.remember(key, layouts.Layout(
            layouts.offsets_of(walked.images, base),
            layouts.offsets_of(walked.targets, base) if spec.segmentation else None,
            None if spec.segmentation else np.asarray(walked.targets, np.int64)))
    return walked


def _map(source: ByteSource, path: str) -> Any:
    if source.size == 0:
        raise shard_error(path, "the file is empty")
    return source.map()


def _walk(mapped: Any, shard: ShardRef, spec: RecordSpec, check_crc: bool, verified_key: Any) -> "ShardArrays":
    """Check a mapped shard's records and view their arrays (see `load_mapped`)."""
    from readers.formats.batching import ShardArrays

    path, size = shard.path, len(mapped)
    buf = np.frombuffer(mapped, np.uint8)
    images: list[np.ndarray] = []
    targets: list[Any] = []
    image_bytes = spec.image_bytes
    mask_dtype = spec.mask_np_dtype
    mask_bytes = int(np.prod(spec.mask_shape)) * mask_dtype.itemsize
    pos = index = 0
    while pos < size:
        with naming_shard(path, index):
            if pos + _HEADER_BYTES > size:
                raise shard_error(path, "truncated record header", record=index, offset=pos)
            length, length_crc = _HEADER.unpack_from(mapped, pos)
            if _masked_crc32c(buf[pos:pos + 8]) != length_crc:
                raise shard_error(path, "length CRC mismatch", record=index, offset=pos)
            start, end = pos + _HEADER_BYTES, pos + _HEADER_BYTES + length
            if end + _FOOTER_BYTES > size:
                raise shard_error(path, "truncated record", record=index, offset=pos)
            (data_crc,) = struct.unpack_from("<I", mapped, end)
            if check_crc and _masked_crc32c(buf[start:end]) != data_crc:
                raise shard_error(path, "data CRC mismatch", record=index, offset=pos)
            try:
                where = locate_features(mapped, start, end)
            except ValueError as e:
                raise shard_error(path, f"not a valid tf.train.Example ({e})", record=index, offset=pos) from e
            h, w = where.get(FEATURE_HEIGHT, (0, 0, -1))[2], where.get(FEATURE_WIDTH, (0, 0, -1))[2]
            if (h, w) != (spec.height, spec.width):
                raise shard_error(path, f"image is {h}x{w} but the manifest says {spec.height}x{spec.width}",
                                  record=index)
            if spec.image_codec != "raw":
                images.append(_view_stored(buf, where, FEATURE_IMAGE, path, index))
            else:
                images.append(_view(buf, where, FEATURE_IMAGE, image_bytes, spec.image_np_dtype, spec.image_shape,
                                    path, index))
            if spec.segmentation and spec.mask_codec != "raw":
                targets.append(_view_stored(buf, where, FEATURE_MASK, path, index))
            elif spec.segmentation:
                targets.append(_view(buf, where, FEATURE_MASK, mask_bytes, mask_dtype, spec.mask_shape, path, index))
            else:
                label = where.get(FEATURE_LABEL)
                if label is None or label[0] != 3:
                    raise shard_error(path, f"feature {FEATURE_LABEL!r} is missing", record=index)
                targets.append(np.int64(label[2]))
        pos = end + _FOOTER_BYTES
        index += 1
    if index != shard.records:
        raise shard_error(path, f"holds {index} records, the manifest says {shard.records}")
    if check_crc:
        mark_verified(verified_key)
    if spec.image_codec != "raw":
        images = image_column(images, spec, path)  # type: ignore[assignment]
    if spec.segmentation and spec.mask_codec != "raw":
        targets = mask_column(targets, spec, path)  # type: ignore[assignment]
    return ShardArrays(images, targets)


def load_whole(shard: ShardRef, spec: RecordSpec) -> "ShardArrays":
    """Every record of a (gzip) shard through the random-access reader (checked, named errors)."""
    from readers.formats.batching import ShardArrays

    reader = TFRecordRandomAccess(shard, spec)
    try:
        pairs = [reader.read(i) for i in range(shard.records)]
    finally:
        reader.close()
    return ShardArrays([p[0] for p in pairs], [p[1] for p in pairs])


def _view_stored(buf: np.ndarray, where: dict, name: str, path: str, index: int) -> np.ndarray:
    """The stored (encoded) bytes of feature `name`, viewed in place."""
    found = where.get(name)
    if found is None or found[0] != 1 or found[2] == 0:
        raise shard_error(path, f"feature {name!r} is missing, empty or not bytes", record=index)
    _, offset, length = found
    return buf[offset:offset + length]


def _view(buf: np.ndarray, where: dict, name: str, nbytes: int, dtype: Any, shape: tuple[int, ...],
          path: str, index: int) -> np.ndarray:
    found = where.get(name)
    if found is None or found[0] != 1:
        raise shard_error(path, f"feature {name!r} is missing or not bytes", record=index)
    _, offset, length = found
    if length != nbytes:
        raise shard_error(path, f"{name} holds {length} bytes, expected {nbytes} for shape {shape}", record=index)
    return buf[offset:offset + length].view(dtype).reshape(shape)


def _plain_reader(compression: str):
    """(path, count) -> dataset of serialized records, straight from TensorFlow's reader."""
    import tensorflow as tf

    compression_type = "GZIP" if compression == "gzip" else ""

    def read(path: "tf.Tensor", count: "tf.Tensor") -> "tf.data.Dataset":
        return _named(tf.data.TFRecordDataset(path, compression_type=compression_type,
                                              buffer_size=READ_BUFFER_BYTES), path)

    return read


def _named(records: "tf.data.Dataset", path: "tf.Tensor") -> "tf.data.Dataset":
    """(serialized record, shard path, record index): what a batch check needs to name a record."""
    import tensorflow as tf

    # zip, not map: no function call per record
    return tf.data.Dataset.zip((records, tf.data.Dataset.from_tensors(path).repeat(), tf.data.Dataset.range(1 << 62)))


def _checked_reader(compression: str):
    """(path, count) -> dataset of serialized records that names the file on damage.

    TensorFlow's `DataLossError` ("corrupted record at 1770") does not say which file.
    Here each file's read errors are caught (`ignore_errors`, which ends that file), an
    empty sentinel record is appended, and every block of `CHECK_BLOCK` records (batched
    and unbatched again, which moves the strings rather than copying them) a check
    asserts that a sentinel sits exactly at index `count`, the manifest's record count; if not,
    `tf.debugging.Assert` fails with an `InvalidArgumentError` naming the shard file,
    the records read and expected, and the fix. `take(count)` then drops the sentinel.
    A real record is never empty (it holds at least the image bytes), so the sentinel
    cannot be confused with data. Per-record cost: none measurable (one small graph
    function per block instead of one per record).
    """
    import tensorflow as tf

    compression_type = "GZIP" if compression == "gzip" else ""
    sentinel = tf.data.Dataset.from_tensors(tf.constant(b""))

    def read(path: "tf.Tensor", count: "tf.Tensor") -> "tf.data.Dataset":
        # `ignore_errors` retries forever when a file cannot be opened at all, so check that
        # it still exists first (readability was checked by `readers.open`). Paths with glob
        # characters skip this check.
        plain = tf.logical_not(tf.strings.regex_full_match(path, r".*[*?\[\]\\{}].*"))
        exists = tf.logical_or(tf.logical_not(plain), tf.size(tf.io.matching_files(
            tf.where(plain, path, tf.constant("")))) > 0)
        found = tf.debugging.Assert(exists, [
            "imgshard: shard", path, "has disappeared since the dataset was opened. If the dataset's current "
            f"manifest no longer lists it: {REOPEN_HINT} If it still does, the dataset is damaged: {FIX_HINT}"])
        with tf.control_dependencies([found]):
            path = tf.identity(path)
        records = tf.data.TFRecordDataset(path, compression_type=compression_type, buffer_size=READ_BUFFER_BYTES)
        blocks = records.ignore_errors().concatenate(sentinel).batch(CHECK_BLOCK).enumerate()

        def check(block: "tf.Tensor", records: "tf.Tensor") -> "tf.Tensor":
            index = block * CHECK_BLOCK + tf.range(tf.size(records, out_type=tf.int64), dtype=tf.int64)
            end = tf.equal(tf.strings.length(records), 0)
            ok = tf.reduce_all(tf.logical_or(tf.logical_not(end), tf.equal(index, count)))
            read_records = tf.reduce_min(tf.where(end, index, tf.reduce_max(index) + 1))
            assertion = tf.debugging.Assert(ok, [
                "imgshard: shard", path, "is damaged or changed: TensorFlow could read only", read_records,
                "of its", count, f"records (a read error: bad CRC, truncation or missing file). {FIX_HINT} "
                "`Dataset.records(split)` names the damaged record.",
            ])
            with tf.control_dependencies([assertion]):
                return tf.identity(records)

        return _named(blocks.map(check).unbatch().take(count), path)

    return read


def make_batch_parser(spec: RecordSpec, *, one_hot: bool, normalize: bool, batch_size: int | None = None):
    """A function: (vector of serialized Examples, their shard paths, their record indices)
    -> expanded (x, y) batch (of static size `batch_size` when given); a class value out of
    range fails naming the shard and record (`readers.formats.classrange`)."""
    import tensorflow as tf

    features = {FEATURE_IMAGE: tf.io.FixedLenFeature([], tf.string)}
    if spec.segmentation:
        features[FEATURE_MASK] = tf.io.FixedLenFeature([], tf.string)
        mask_dtype = tf.uint16 if spec.mask_dtype == "uint16" else tf.uint8
    else:
        features[FEATURE_LABEL] = tf.io.FixedLenFeature([], tf.int64)
    expand = make_expand_tf(spec, one_hot=one_hot, normalize=normalize)
    lead = -1 if batch_size is None else batch_size
    image_shape = [lead, *spec.image_shape]
    mask_shape = [lead, *spec.mask_shape]

    def parse(serialized: "tf.Tensor", paths: "tf.Tensor", indices: "tf.Tensor") -> tuple["tf.Tensor", "tf.Tensor"]:
        parsed = tf.io.parse_example(serialized, features)
        if spec.image_codec != "raw":  # the decoders give the batch the raw path gives
            images = tf.reshape(tf_decode_batch(parsed[FEATURE_IMAGE], spec, "image"), image_shape)
        else:
            image_dtype = tf.uint16 if spec.image_dtype == "uint16" else tf.uint8
            images = tf.reshape(tf.io.decode_raw(parsed[FEATURE_IMAGE], image_dtype, little_endian=True), image_shape)
        if spec.segmentation and spec.mask_codec != "raw":
            masks = tf_checked_mask_strings(parsed[FEATURE_MASK], paths, indices, spec)
            targets = tf.reshape(tf_decode_batch(masks, spec, "mask"), mask_shape)
        elif spec.segmentation:
            targets = tf.reshape(tf.io.decode_raw(parsed[FEATURE_MASK], mask_dtype, little_endian=True), mask_shape)
        else:
            targets = parsed[FEATURE_LABEL]
        return expand(images, tf_checked_targets(targets, paths, indices, spec))

    return parse


#: Bytes per record beyond the image and mask: framing (16), protobuf tags, lengths and
#: feature names, height, width, label (well under 512).
RECORD_OVERHEAD_BYTES = 512


def gzip_limit(shard: ShardRef, spec: RecordSpec) -> int:
    """The most bytes a gzip shard may inflate to: its manifest records at full size (image,
    mask, the manifest's longest key in UTF-8, or 16 KiB when none is listed, and overhead)."""
    keys = shard.entry.keys
    key_bytes = max((len(k.encode("utf-8")) for k in keys), default=0) if keys else 16 << 10
    mask_bytes = int(np.prod(spec.mask_shape)) * spec.mask_np_dtype.itemsize if spec.segmentation else 0
    return shard.records * (spec.image_bytes + mask_bytes + key_bytes + RECORD_OVERHEAD_BYTES)


def gunzip_bounded(data: bytes, limit: int, path: str) -> bytes:
    """`gzip.decompress(data)` (members concatenated) that refuses to inflate past `limit`
    bytes: a damaged or hostile stream is a `ShardError`, not an unbounded allocation."""
    out: list[bytes] = []
    total = 0
    while data:
        inflater = zlib.decompressobj(31)
        piece = inflater.decompress(data, limit - total + 1)
        total += len(piece)
        if total > limit:
            raise shard_error(path, f"the gzip stream inflates past {limit} bytes, more than its records can hold")
        if not inflater.eof:
            raise shard_error(path, "the gzip stream is truncated")
        out.append(piece)
        data = inflater.unused_data.lstrip(b"\0")  # gzip allows zero padding between members
    return b"".join(out)


#: Bucket shards whose records average at most this many bytes get their offset index
#: from one streamed pass (`_streamed_offsets`: a few large ranged GETs, digest checked)
#: instead of one ranged GET per 12-byte header: a request costs about what transferring
#: a couple of megabytes does (10-50 ms first-byte latency at 100+ MB/s).
HEADER_SCAN_RECORD_BYTES = 2 << 20
#: Bytes per ranged GET of that pass.
SCAN_CHUNK_BYTES = 8 << 20


def _streamed_offsets(remote: Any) -> list[int]:
    """The record offsets of a bucket shard, read in `SCAN_CHUNK_BYTES` ranged GETs whose
    bytes are also checked against the manifest's digest (so the first random access to a
    shard checks all of it). Raises `ShardError` naming the URL for a truncated header or
    record, or a digest that differs."""
    from readers.digest import algorithm_of, hex_of, new_hasher

    algorithm = algorithm_of(remote.digest)
    size, digest = remote.size, new_hasher(algorithm)
    offsets: list[int] = []
    pos, pending = 0, b""
    for start in range(0, size, SCAN_CHUNK_BYTES):
        data = remote.read_range(start, min(size, start + SCAN_CHUNK_BYTES))
        digest.update(data)
        end = start + len(data)
        while True:
            if pending:  # a header cut by the previous chunk's end
                header, pending = pending + data[:_HEADER_BYTES - len(pending)], b""
            elif start <= pos and pos + _HEADER_BYTES <= end:
                header = data[pos - start:pos - start + _HEADER_BYTES]
            elif start <= pos < end:
                pending = data[pos - start:]
                break
            else:
                break
            offsets.append(pos)
            pos += _HEADER_BYTES + _HEADER.unpack(header)[0] + _FOOTER_BYTES
    if pending:
        raise remote.error(f"record {len(offsets)}: truncated record header (byte offset {pos})")
    if pos != size:
        raise remote.error(f"the last record runs past the end of the object ({pos} > {size} bytes)")
    got = hex_of(digest, algorithm)
    if got != remote.digest:
        raise remote.error(f"its digest is {got}, the manifest says {remote.digest} (the object is "
                           "damaged or was rewritten)")
    return offsets


class TFRecordRandomAccess(RandomAccessShard):
    """Records of one TFRecord shard by index.

    Uncompressed shards (`ENGINE` "mapped"): the shard is memory-mapped and checked once
    per process (`load_mapped`) and records are views on the mapping. With `ENGINE`
    "tf" (or through `read_record`): an offset index is built on first use by reading
    only the 12-byte record headers (seeking past the payloads); each read is one
    `pread` of the record, CRC-checked. Gzip shards cannot be seeked into: they are decompressed whole
    on first use and kept in memory (`GZIP_CACHE_BYTES` per process across all shards,
    least recently used dropped), so random access over a large gzip split
    decompresses shards repeatedly -- prefer compression "none" for `keras_dataset`.
    The reader is safe to pickle (files are reopened in each process) and to share
    between threads.

    Bytes come from `readers.sources.open_source`: for a shard of a bucket dataset without
    a local cache, the header index is built by ranged GETs of the 12-byte headers and each
    record is one ranged GET (its length and data CRCs checked); with the cache, the
    verified local copy is mapped as a local shard is.
    """

    _gzip_cache: "collections.OrderedDict[str, bytes]" = collections.OrderedDict()
    _gzip_lock = threading.Lock()

    def __init__(self, shard: ShardRef, spec: RecordSpec):
        self.shard = shard
        self.spec = spec
        self._offsets: list[int] | None = None
        self._source: "ByteSource | None" = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"shard": self.shard, "spec": self.spec}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["shard"], state["spec"])

    # offsets of every record header, in the (decompressed) stream
    def _index(self, data: bytes | None = None) -> list[int]:
        if self._offsets is not None:
            return self._offsets
        path = self.shard.path
        offsets: list[int] = []
        pos = 0
        if data is None and is_ranged(self.shard) and self.shard.entry.bytes <= (
                HEADER_SCAN_RECORD_BYTES * max(1, self.shard.records)):
            offsets = _streamed_offsets(self.shard.source)  # a few large GETs, digest checked
            pos = size = self.shard.entry.bytes
        elif data is not None:
            size = len(data)
            while pos < size:
                if pos + _HEADER_BYTES > size:
                    raise shard_error(path, "truncated record header", record=len(offsets), offset=pos)
                length, _ = _HEADER.unpack_from(data, pos)
                offsets.append(pos)
                pos += _HEADER_BYTES + length + _FOOTER_BYTES
        else:
            source = self._file()
            size = source.size
            while pos < size:
                header = source.pread(_HEADER_BYTES, pos)
                if len(header) < _HEADER_BYTES:
                    raise shard_error(path, "truncated record header", record=len(offsets), offset=pos)
                length, _ = _HEADER.unpack(header)
                offsets.append(pos)
                pos += _HEADER_BYTES + length + _FOOTER_BYTES
        if pos != size:
            raise shard_error(path, f"the last record runs past the end of the file ({pos} > {size} bytes)",
                              record=len(offsets) - 1, offset=offsets[-1] if offsets else 0)
        if len(offsets) != self.shard.records:
            raise shard_error(path, f"holds {len(offsets)} records, the manifest says {self.shard.records}")
        self._offsets = offsets
        return offsets

    def _file(self) -> "ByteSource":
        """The shard's bytes for ranged reads: the local file (`pread`) or its object (ranged GETs)."""
        if self._source is None or self._pid != os.getpid():
            with naming_shard(self.shard.path):
                self._source = open_source(self.shard, ranged=True)
            self._pid = os.getpid()
        return self._source

    def _gzip_bytes(self) -> bytes:
        cache = TFRecordRandomAccess._gzip_cache
        path = self.shard.path
        with TFRecordRandomAccess._gzip_lock:
            data = cache.get(path)
            if data is not None:
                cache.move_to_end(path)
                return data
        with naming_shard(path):
            with open_source(self.shard) as source:
                data = gunzip_bounded(source.read_all(), gzip_limit(self.shard, self.spec), path)
        with TFRecordRandomAccess._gzip_lock:
            cache[path] = data
            total = sum(len(v) for v in cache.values())
            while total > GZIP_CACHE_BYTES and len(cache) > 1:
                _, dropped = cache.popitem(last=False)
                total -= len(dropped)
        return data

    def _frame(self, index: int) -> tuple[bytes, int]:
        """(framed record bytes, offset) of record `index`."""
        if self.spec.compression == "gzip":
            data = self._gzip_bytes()
            with self._lock:
                offsets = self._index(data)
            start = offsets[index]
            end = offsets[index + 1] if index + 1 < len(offsets) else len(data)
            return data[start:end], start
        with self._lock:
            offsets = self._index()
        start = offsets[index]
        end = offsets[index + 1] if index + 1 < len(offsets) else None
        if end is None:
            end = self._file().size
        frame = self._file().pread(end - start, start)
        return frame, start

    def read_record(self, index: int) -> Record:
        from readers.formats.tfrecord import wire as tfrecord_wire

        if not 0 <= index < self.shard.records:
            raise IndexError(f"record index must be in [0, {self.shard.records}). Received: {index}")
        path = self.shard.path
        with naming_shard(path, index):
            frame, offset = self._frame(index)
            length, length_crc = _HEADER.unpack_from(frame, 0)
            if len(frame) != _HEADER_BYTES + length + _FOOTER_BYTES:
                raise shard_error(path, "truncated record", record=index, offset=offset)
            if tfrecord_wire.masked_crc32c(frame[:8]) != length_crc:
                raise shard_error(path, "length CRC mismatch", record=index, offset=offset)
            payload = frame[_HEADER_BYTES:_HEADER_BYTES + length]
            (data_crc,) = struct.unpack_from("<I", frame, _HEADER_BYTES + length)
            if tfrecord_wire.masked_crc32c(payload) != data_crc:
                raise shard_error(path, "data CRC mismatch", record=index, offset=offset)
            record = record_from_features(tfrecord_wire.decode_example(payload), self.spec, path, index)
        return decode_record(record, self.spec, path, index)

    _mapped_cache: "collections.OrderedDict[tuple[int, str], Any]" = collections.OrderedDict()

    def _mapped(self) -> Any:
        """The shard mapped and checked once per process (`load_mapped`); mappings cost
        address space, not memory, so up to `MAPPED_SHARDS` stay open."""
        cache, key = TFRecordRandomAccess._mapped_cache, (os.getpid(), self.shard.path)
        with TFRecordRandomAccess._gzip_lock:
            data = cache.get(key)
            if data is not None:
                cache.move_to_end(key)
                return data
        data = load_mapped(self.shard, self.spec)
        with TFRecordRandomAccess._gzip_lock:
            cache[key] = data
            while len(cache) > MAPPED_SHARDS:
                cache.popitem(last=False)
        return data

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray | int]:
        if self.spec.compression == "none" and ENGINE == "mapped" and not is_ranged(self.shard):
            if not 0 <= index < self.shard.records:
                raise IndexError(f"record index must be in [0, {self.shard.records}). Received: {index}")
            data = self._mapped()
            target = data.targets[index]
            image, target = data.images[index], (target if self.spec.segmentation else int(target))
        else:
            record = self.read_record(index)
            image, target = record.image, (record.mask if self.spec.segmentation else record.label)
        check_record(target, self.spec, self.shard.path, index)
        return image, target

    def close(self) -> None:
        if self._source is not None and self._pid == os.getpid():
            try:
                self._source.close()
            except OSError as e:  # already closed: nothing to release
                _ = describe(e)
        self._source = None

    def __del__(self) -> None:
        self.close()


ADAPTER = TFRecordAdapter()


def _new_locks() -> None:  # a forked child (keras_dataset workers) must not inherit a lock a thread held
    TFRecordRandomAccess._gzip_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_locks)


__all__ = ["ADAPTER", "GZIP_CACHE_BYTES", "TFRecordAdapter", "TFRecordRandomAccess", "make_batch_parser",
           "record_from_features"]
