"""NPZ shards: the reader side (NumPy records, `tf.data` pipeline, random access).

A shard is one ``.npz`` (a zip of ``.npy`` members, see `readers.formats`). We read the
members ourselves instead of through `np.load`:

* stored members (compression "none") are mapped: the member's data offset is found
  from the zip local header, and `np.frombuffer` views the `mmap` -- no copy, no read
  until a page is touched;
* deflated members are read raw and inflated by one `zlib.decompress` call, which
  releases the GIL, so a few threads load shards truly in parallel;
* every member's zip CRC-32 is checked (also GIL-free), object dtypes are refused
  (nothing is ever unpickled), and shapes and dtypes are checked against the manifest.
"""

from __future__ import annotations

import ast
import collections
import concurrent.futures
import mmap
import os
import struct
import threading
import zipfile
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from readers.errors import ShardError, shard_error
from readers.formats import NPZ_IMAGES, NPZ_KEYS, NPZ_LABELS, NPZ_MASKS, FileFormat
from readers.formats.base import (
    FileAdapter,
    PipelineOptions,
    RandomAccessShard,
    Record,
    RecordSpec,
    ShardRef,
    expand_tf,
    naming_shard,
    y_signature,
)

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"
_NPY_MAGIC = b"\x93NUMPY"

#: Threads loading (inflating, CRC-checking) shards ahead of the `tf.data` pipeline.
LOADER_THREADS = min(4, max(2, os.cpu_count() or 2))
#: Shards loaded ahead of the one being batched (each held in memory whole).
SHARDS_AHEAD = LOADER_THREADS
#: Loaded shards kept per random-access process (least recently used dropped).
CACHE_BYTES = 1 << 30


@dataclass(frozen=True)
class NpzShard:
    """The arrays of one shard (views on a mapping or on one inflated buffer)."""

    images: np.ndarray
    targets: np.ndarray  # masks (N, H, W[, C]) or labels (N,)
    keys: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.images.nbytes + self.targets.nbytes + self.keys.nbytes)


def _parse_npy(buf: Any, start: int, end: int, member: str, path: str) -> np.ndarray:
    """View the .npy document in `buf[start:end]` as an array, without copying."""
    head = bytes(buf[start:start + 10])
    if len(head) < 10 or head[:6] != _NPY_MAGIC:
        raise shard_error(path, f"member {member!r} is not a .npy document")
    major = head[6]
    if major == 1:
        (hlen,) = struct.unpack("<H", head[8:10])
        hstart = start + 10
    elif major in (2, 3):
        (hlen,) = struct.unpack("<I", bytes(buf[start + 8:start + 12]))
        hstart = start + 12
    else:
        raise shard_error(path, f"member {member!r} has unsupported .npy version {major}")
    if hlen > 1 << 16:
        raise shard_error(path, f"member {member!r} has an implausible .npy header of {hlen} bytes")
    text = bytes(buf[hstart:hstart + hlen]).decode("utf-8" if major == 3 else "latin1")
    try:
        header = ast.literal_eval(text)
        dtype = np.lib.format.descr_to_dtype(header["descr"])
        shape = tuple(int(d) for d in header["shape"])
        fortran = bool(header["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError) as e:
        raise shard_error(path, f"member {member!r} has a malformed .npy header ({e})") from e
    if dtype.hasobject:
        raise shard_error(path, f"member {member!r} holds Python objects ({dtype}); pickled data is never loaded")
    count = int(np.prod(shape)) if shape else 1
    offset = hstart + hlen
    if offset + count * dtype.itemsize > end:
        raise shard_error(path, f"member {member!r} is shorter than its header says ({shape} {dtype})")
    arr = np.frombuffer(buf, dtype=dtype, count=count, offset=offset)
    if fortran:
        return arr.reshape(shape[::-1]).transpose()
    return arr.reshape(shape)


def _inflate_member(fd: int, start: int, info: zipfile.ZipInfo, path: str, check_crc: bool = True) -> bytes:
    """Inflate one deflated member in a single `zlib.decompress` call.

    One call releases the GIL for the whole member (so loader threads inflate in
    parallel) and makes no extra copy. Its 40 MB result is only cheap when malloc
    reuses memory instead of mapping fresh pages (see `tune_allocator`).
    """
    raw = os.pread(fd, info.compress_size, start)
    if len(raw) != info.compress_size:
        raise shard_error(path, f"member {info.filename!r} is truncated ({len(raw)} of {info.compress_size} bytes)")
    try:
        data = zlib.decompress(raw, -15, max(info.file_size, 1))
    except zlib.error as e:
        raise shard_error(path, f"member {info.filename!r} does not inflate ({e})") from e
    del raw
    if len(data) != info.file_size:
        raise shard_error(path, f"member {info.filename!r} inflates to {len(data)} bytes, expected {info.file_size}")
    if check_crc and zlib.crc32(data) != info.CRC:
        raise shard_error(path, f"CRC-32 mismatch in member {info.filename!r}")
    return data


def read_npz(path: str, names: Sequence[str], *, check_crc: bool = True) -> dict[str, np.ndarray]:
    """Read members `names` (without ".npy") of an uncompressed or deflated npz file.

    Raises `ShardError` naming the file for any damage (bad zip, CRC mismatch, missing
    member, object dtype).
    """
    with naming_shard(path):
        with open(path, "rb") as f:
            try:
                zf = zipfile.ZipFile(f)
            except zipfile.BadZipFile as e:
                raise shard_error(path, f"not a valid zip/npz file ({e})") from e
            infos = {info.filename: info for info in zf.infolist()}
            mapped: mmap.mmap | None = None
            out: dict[str, np.ndarray] = {}
            for name in names:
                info = infos.get(name + ".npy")
                if info is None:
                    raise shard_error(path, f"member {name + '.npy'!r} is missing; it holds {sorted(infos)}")
                header = os.pread(f.fileno(), _LOCAL_HEADER.size, info.header_offset)
                if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_MAGIC:
                    raise shard_error(path, f"bad zip local header for member {info.filename!r}",
                                      offset=info.header_offset)
                fields = _LOCAL_HEADER.unpack(header)
                start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
                if info.compress_type == zipfile.ZIP_STORED:
                    if mapped is None:
                        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    end = start + info.file_size
                    if end > len(mapped):
                        raise shard_error(path, f"member {info.filename!r} runs past the end of the file")
                    view = memoryview(mapped)
                    if check_crc and zlib.crc32(view[start:end]) != info.CRC:
                        raise shard_error(path, f"CRC-32 mismatch in member {info.filename!r}")
                    out[name] = _parse_npy(mapped, start, end, info.filename, path)
                    del view
                elif info.compress_type == zipfile.ZIP_DEFLATED:
                    data = _inflate_member(f.fileno(), start, info, path, check_crc)
                    out[name] = _parse_npy(data, 0, len(data), info.filename, path)
                else:
                    raise shard_error(
                        path, f"member {info.filename!r} uses zip compression method {info.compress_type}; "
                        "expected stored (0) or deflated (8)"
                    )
            return out


def load_shard(shard: ShardRef, spec: RecordSpec, *, check_crc: bool = True) -> NpzShard:
    """Read and check one shard against the manifest."""
    path = shard.path
    target_name = NPZ_MASKS if spec.segmentation else NPZ_LABELS
    arrays = read_npz(path, [NPZ_IMAGES, target_name, NPZ_KEYS], check_crc=check_crc)
    images, targets, keys = arrays[NPZ_IMAGES], arrays[target_name], arrays[NPZ_KEYS]
    n = shard.records
    expected = {
        NPZ_IMAGES: ((n, *spec.image_shape), np.dtype(np.uint8)),
        target_name: ((n, *spec.mask_shape), spec.mask_np_dtype) if spec.segmentation else ((n,), None),
    }
    for name, arr in ((NPZ_IMAGES, images), (target_name, targets)):
        shape, dtype = expected[name]
        if arr.shape != shape or (dtype is not None and arr.dtype != dtype):
            raise shard_error(
                path, f"member {name!r} is {arr.shape} {arr.dtype}, the manifest implies "
                f"{shape} {dtype.name if dtype is not None else 'integer'}"
            )
    if not spec.segmentation and targets.dtype.kind not in "iu":
        raise shard_error(path, f"member {NPZ_LABELS!r} must hold integers. Received: {targets.dtype}")
    if keys.shape != (n,) or keys.dtype.kind not in "US":
        raise shard_error(path, f"member {NPZ_KEYS!r} is {keys.shape} {keys.dtype}, expected ({n},) strings")
    return NpzShard(images, targets, keys)


class NpzAdapter(FileAdapter):
    file_format = FileFormat.NPZ

    def iter_shard(self, shard: ShardRef, spec: RecordSpec) -> Iterator[Record]:
        data = load_shard(shard, spec)
        for i in range(shard.records):
            with naming_shard(shard.path, i):
                key = data.keys[i]
                key = key.decode("utf-8") if isinstance(key, bytes) else str(key)
                if spec.segmentation:
                    record = Record(key, data.images[i], mask=data.targets[i])
                else:
                    record = Record(key, data.images[i], label=int(data.targets[i]))
            yield record

    def tf_dataset(self, shards: Sequence[ShardRef], spec: RecordSpec, options: PipelineOptions) -> "tf.data.Dataset":
        """Batched (x, y) from NPZ shards.

        `LOADER_THREADS` threads load the next `SHARDS_AHEAD` shards (inflate + CRC, GIL
        free) while a generator cuts compact uint8 batches, which `from_generator` hands to
        a parallel map that casts and one-hot encodes them. shuffle=False: shard order and
        record order, as `Dataset.records()`. shuffle=True: the shard order is shuffled
        every epoch (with the seed); shards are gathered into windows of at least
        `options.buffer_records()` records, and each window is permuted as a whole (a
        block shuffle whose memory is bounded like the TFRecord shuffle buffer).
        """
        import tensorflow as tf

        image_spec = tf.TensorSpec((None, *spec.image_shape), tf.uint8)
        y_shape, y_dtype = y_signature(spec)
        if options.drop_remainder:
            image_spec = tf.TensorSpec((options.batch_size, *spec.image_shape), tf.uint8)
            y_shape = (options.batch_size, *y_shape[1:])
        generator = _BatchGenerator(list(shards), spec, options)
        ds = tf.data.Dataset.from_generator(
            generator, output_signature=(image_spec, tf.TensorSpec(y_shape, tf.dtypes.as_dtype(y_dtype)))
        )

        def expand(images: "tf.Tensor", targets: "tf.Tensor") -> tuple["tf.Tensor", "tf.Tensor"]:
            return expand_tf(images, targets, spec, one_hot=options.one_hot, normalize=options.normalize)

        return ds.map(expand, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def random_access(self, shard: ShardRef, spec: RecordSpec) -> "NpzRandomAccess":
        return NpzRandomAccess(shard, spec)


class _BatchGenerator:
    """Callable that `from_generator` calls once per epoch; yields compact batches."""

    def __init__(self, shards: list[ShardRef], spec: RecordSpec, options: PipelineOptions):
        self.shards = shards
        self.spec = spec
        self.options = options
        self.rng = np.random.default_rng(options.seed)  # advances every epoch: reshuffles
        self.window = options.buffer_records(shards)

    def _loaded(self, order: list[int]) -> Iterator[NpzShard]:
        """Shards in `order`, loaded `SHARDS_AHEAD` ahead by a thread pool."""
        pool = concurrent.futures.ThreadPoolExecutor(LOADER_THREADS, thread_name_prefix="imgshard-npz")
        pending: collections.deque = collections.deque()
        try:
            todo = iter(order)
            for i in todo:
                pending.append(pool.submit(load_shard, self.shards[i], self.spec))
                if len(pending) > SHARDS_AHEAD:
                    break
            while pending:
                data = pending.popleft().result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(pool.submit(load_shard, self.shards[nxt], self.spec))
                yield data
        finally:
            for fut in pending:
                fut.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    def __call__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        order = list(range(len(self.shards)))
        if self.options.shuffle and self.options.record_shard is None:
            self.rng.shuffle(order)
        pieces = self._pieces(order)
        if self.options.shuffle:
            yield from self._shuffled(pieces)
        else:
            yield from self._sequential(pieces)

    def _pieces(self, order: list[int]) -> Iterator[tuple[NpzShard, np.ndarray]]:
        """(shard arrays, indices of the records this pipeline keeps) per shard."""
        offset = 0
        for data in self._loaded(order):
            n = len(data.images)
            idx = np.arange(n)
            if self.options.record_shard is not None:
                num, index = self.options.record_shard
                idx = idx[(idx + offset) % num == index]
            offset += n
            yield data, idx

    def _emit(self, parts: list[tuple[NpzShard, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """Gather a batch from (shard, record indices) pieces; a contiguous run is a view."""
        if len(parts) == 1:
            data, idx = parts[0]
            if idx.size and int(idx[-1]) - int(idx[0]) + 1 == idx.size:
                sl = slice(int(idx[0]), int(idx[-1]) + 1)
                return data.images[sl], data.targets[sl]
        return self._gather([(d, int(i)) for d, ids in parts for i in ids])

    def _sequential(self, pieces: Iterator[tuple[NpzShard, np.ndarray]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        bs = self.options.batch_size
        parts: list[tuple[NpzShard, np.ndarray]] = []
        have = 0
        for data, idx in pieces:
            pos = 0
            while pos < idx.size:
                take = min(bs - have, idx.size - pos)
                parts.append((data, idx[pos:pos + take]))
                have += take
                pos += take
                if have == bs:
                    yield self._emit(parts)
                    parts, have = [], 0
        if have and not self.options.drop_remainder:
            yield self._emit(parts)

    def _shuffled(self, pieces: Iterator[tuple[NpzShard, np.ndarray]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        bs = self.options.batch_size
        window: list[tuple[NpzShard, int]] = []  # leftover samples of the previous window first

        def flush(final: bool) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            nonlocal window
            samples, window = window, []
            perm = self.rng.permutation(len(samples))
            full = len(samples) // bs * bs
            for start in range(0, full, bs):
                yield self._gather([samples[j] for j in perm[start:start + bs]])
            window = [samples[j] for j in perm[full:]]
            if final and window and not self.options.drop_remainder:
                yield self._gather(window)

        for data, idx in pieces:
            window.extend((data, int(i)) for i in idx)
            if len(window) >= self.window:
                yield from flush(final=False)
        yield from flush(final=True)

    def _gather(self, samples: list[tuple[NpzShard, int]]) -> tuple[np.ndarray, np.ndarray]:
        first = samples[0][0]
        images = _aligned_empty((len(samples), *first.images.shape[1:]), first.images.dtype)
        targets = _aligned_empty((len(samples), *first.targets.shape[1:]), first.targets.dtype)
        for j, (data, i) in enumerate(samples):
            images[j] = data.images[i]
            targets[j] = data.targets[i]
        return images, targets


def _aligned_empty(shape: tuple[int, ...], dtype: Any, alignment: int = 64) -> np.ndarray:
    """`np.empty` whose data starts on an `alignment`-byte boundary: TensorFlow then wraps
    the array handed over by `from_generator` without copying it (it copies arrays that
    are not aligned for Eigen)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class NpzRandomAccess(RandomAccessShard):
    """Records of one NPZ shard by index.

    Stored (uncompressed) shards are mapped, so opening one is cheap and reads touch
    only the pages of the records asked for. Deflated shards are inflated whole on first
    use and kept (`CACHE_BYTES` per process across shards, least recently used
    dropped): random access over a large deflated split inflates shards repeatedly --
    prefer compression "none" for `keras_dataset`. Safe to pickle and to share between
    threads.
    """

    _cache: "collections.OrderedDict[str, NpzShard]" = collections.OrderedDict()
    _lock = threading.Lock()

    def __init__(self, shard: ShardRef, spec: RecordSpec):
        self.shard = shard
        self.spec = spec

    def _data(self) -> NpzShard:
        cache, path = NpzRandomAccess._cache, self.shard.path
        with NpzRandomAccess._lock:
            data = cache.get(path)
            if data is not None:
                cache.move_to_end(path)
                return data
        data = load_shard(self.shard, self.spec)
        with NpzRandomAccess._lock:
            cache[path] = data
            total = sum(d.nbytes for d in cache.values())
            while total > CACHE_BYTES and len(cache) > 1:
                _, dropped = cache.popitem(last=False)
                total -= dropped.nbytes
        return data

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray | int]:
        if not 0 <= index < self.shard.records:
            raise IndexError(f"record index must be in [0, {self.shard.records}). Received: {index}")
        data = self._data()
        with naming_shard(self.shard.path, index):
            target = data.targets[index]
            return data.images[index], (target if self.spec.segmentation else int(target))


ADAPTER = NpzAdapter()

__all__ = ["ADAPTER", "CACHE_BYTES", "NpzAdapter", "NpzRandomAccess", "NpzShard", "ShardError", "load_shard",
           "read_npz"]
