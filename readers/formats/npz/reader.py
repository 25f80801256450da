"""NPZ shards: the reader side (NumPy records, `tf.data` pipeline, random access).

A shard is one ``.npz`` (a zip of ``.npy`` members, see `readers.formats`). We read the
members ourselves instead of through `np.load`:

* stored members (compression "none") are mapped: the member's data offset is found
  from the zip local header, and `np.frombuffer` views the `mmap` -- no copy, no read
  until a page is touched;
* deflated members are read raw and inflated in steps into pooled buffers (ISA-L when
  installed, else zlib), which releases the GIL, so a few threads load shards truly in
  parallel;
* every member's zip CRC-32 is checked (also GIL-free), object dtypes are refused
  (nothing is ever unpickled), and shapes and dtypes are checked against the manifest;
* training pipelines check a shard's CRCs the first time this process reads it
  (`readers.formats.base.CRC_POLICY`) and remember where its arrays lie: later epochs
  map the file and view the arrays without parsing the zip directory or the .npy
  headers again. A file whose size, mtime or inode changed is read and checked afresh.
"""

from __future__ import annotations

import ast
import collections
import ctypes
import math
import os
import re
import struct
import threading
import weakref
import zipfile
import zlib
from typing import TYPE_CHECKING, Any, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

try:  # optional: Intel ISA-L, a drop-in for zlib's inflate and crc32, several times faster
    from isal import isal_zlib as _inflater
except ImportError:  # pragma: no cover - exercised only without isal
    _inflater = zlib

from readers.errors import FIX_HINT, ShardError, shard_error
from readers.files import open_regular_file
from readers.sources import ByteSource, FileSource, is_ranged, open_source
from readers.formats import layouts
from readers.formats import (
    NPZ_IMAGE_BYTES,
    NPZ_IMAGE_OFFSETS,
    NPZ_IMAGES,
    NPZ_KEYS,
    NPZ_LABELS,
    NPZ_MASK_BYTES,
    NPZ_MASK_OFFSETS,
    NPZ_MASKS,
    FileFormat,
)
from readers.formats.base import CountError, FileAdapter, RandomAccessShard, crc_due, mark_verified, naming_shard
from readers.formats.classrange import check_record, checked_load
from readers.formats.pipeline import PipelineOptions
from readers.formats.spec import Record, RecordSpec, ShardRef
from readers.formats.batching import ShardArrays, generator_dataset

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"
_NPY_MAGIC = b"\x93NUMPY"
# The header NumPy writes: {'descr': '|u1', 'fortran_order': False, 'shape': (150, 512, 512, 3), }
_NPY_HEADER = re.compile(r"\{'descr': '([^']+)', 'fortran_order': (True|False), 'shape': \(([0-9, ]*)\), \}\s*")
# ast.literal_eval from several loader threads at once can fail on Python 3.11 with
# "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905): headers
# NumPy wrote are parsed by the regex above, any other one under this lock.
_AST_LOCK = threading.Lock()


def _npy_header(text: str) -> tuple[str, bool, tuple[int, ...]]:
    """(descr, fortran_order, shape) of a .npy header dict. Raises ValueError, SyntaxError, KeyError, TypeError."""
    m = _NPY_HEADER.fullmatch(text)
    if m is not None:
        dims = [d.strip() for d in m.group(3).split(",")]
        return m.group(1), m.group(2) == "True", tuple(int(d) for d in dims if d)
    with _AST_LOCK:
        header = ast.literal_eval(text)
    return header["descr"], bool(header["fortran_order"]), tuple(int(d) for d in header["shape"])

#: Compressed bytes inflated per step (the output step is up to 4x that).
INFLATE_CHUNK_BYTES = 256 << 10
#: Free inflate buffers kept for reuse per process.
POOL_BYTES = 512 << 20
#: Loaded shards kept per random-access process (least recently used dropped).
CACHE_BYTES = 1 << 30


NpzShard = ShardArrays  # the arrays of one shard (images (N, H, W, 3), targets, keys)


def _parse_npy(buf: Any, start: int, end: int, member: str, path: str) -> np.ndarray:
    """View the .npy document in `buf[start:end]` as an array, without copying."""
    return _view_npy(buf, _npy_layout(buf, start, end, member, path))


class _NpyArray(NamedTuple):
    """Where a .npy document's array lies in its buffer, and its layout."""

    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool


def _npy_layout(buf: Any, start: int, end: int, member: str, path: str) -> _NpyArray:
    """Parse and check the header of the .npy document in `buf[start:end]`."""
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
        descr, fortran, shape = _npy_header(text)
        dtype = np.lib.format.descr_to_dtype(descr)
    except (ValueError, SyntaxError, KeyError, TypeError) as e:
        raise shard_error(path, f"member {member!r} has a malformed .npy header ({e})") from e
    if dtype.hasobject:
        raise shard_error(path, f"member {member!r} holds Python objects ({dtype}); pickled data is never loaded")
    if any(d < 0 for d in shape):
        raise shard_error(path, f"member {member!r} has a negative dimension in its .npy shape {shape}")
    count = math.prod(shape)  # Python integers: no int64 overflow for a hostile shape
    offset = hstart + hlen
    if offset + count * dtype.itemsize > end:
        raise shard_error(path, f"member {member!r} is shorter than its header says ({shape} {dtype})")
    return _NpyArray(offset, dtype, shape, fortran)


def _view_npy(buf: Any, npy: _NpyArray) -> np.ndarray:
    count = math.prod(npy.shape)
    arr = np.frombuffer(buf, dtype=npy.dtype, count=count, offset=npy.offset)
    if npy.fortran:
        return arr.reshape(npy.shape[::-1]).transpose()
    return arr.reshape(npy.shape)


class _BufferPool:
    """Reusable byte buffers for inflated members, so that inflating a shard writes into
    memory the process already has instead of fresh pages the kernel must zero.

    `take` returns a uint8 array over a pooled buffer; the buffer goes back to the pool
    when the last array or view on it is gone (a `weakref.finalize` on the ctypes
    object that every view keeps alive), so handing views to consumers is safe. Sizes
    are rounded up to `_POOL_GRANULE` so shards of similar size share buffers; at most
    `POOL_BYTES` are kept free.
    """

    def __init__(self, max_free_bytes: int):
        self.max_free_bytes = max_free_bytes
        self._free: dict[int, list[bytearray]] = collections.defaultdict(list)
        self._free_bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes <= 0:
            return np.empty(0, np.uint8)
        size = -(-nbytes // _POOL_GRANULE) * _POOL_GRANULE
        with self._lock:
            stack = self._free.get(size)
            raw = stack.pop() if stack else None
            if raw is not None:
                self._free_bytes -= size
        if raw is None:
            raw = bytearray(size)
        holder = (ctypes.c_char * size).from_buffer(raw)
        weakref.finalize(holder, self._give, raw)
        return np.frombuffer(holder, np.uint8, count=nbytes)

    def _give(self, raw: bytearray) -> None:
        with self._lock:
            if self._free_bytes + len(raw) <= self.max_free_bytes:
                self._free[len(raw)].append(raw)
                self._free_bytes += len(raw)


_POOL_GRANULE = 1 << 20
_POOL = _BufferPool(POOL_BYTES)


def _inflate_member(source: ByteSource, start: int, info: zipfile.ZipInfo, path: str,
                    check_crc: bool = True) -> np.ndarray:
    """Inflate one deflated member into a pooled buffer, checking its CRC-32.

    The compressed bytes are read into a pooled buffer too, and inflated in
    `INFLATE_CHUNK_BYTES` steps (`inflate` and `crc32` release the GIL, so loader
    threads run in parallel); each step is copied into the output while in cache. A
    single `zlib.decompress` would allocate a fresh 40 MB result per member, which the
    kernel zero-fills page by page (measured: 310 page faults and 45% system time per
    sample).
    """
    raw = _POOL.take(info.compress_size)
    got = source.readinto(raw, start) if info.compress_size else 0
    if got != info.compress_size:
        raise shard_error(path, f"member {info.filename!r} is truncated ({got} of {info.compress_size} bytes)")
    out = _POOL.take(info.file_size)
    inflater = _inflater.decompressobj(-15)  # ISA-L when `isal` is installed (imgshard[fast])
    view = memoryview(raw)
    pos = crc = 0
    try:
        for piece in _inflated_pieces(inflater, view, INFLATE_CHUNK_BYTES):
            if pos + len(piece) > len(out):
                raise shard_error(path, f"member {info.filename!r} inflates past its size {info.file_size}")
            out[pos:pos + len(piece)] = np.frombuffer(piece, np.uint8)
            pos += len(piece)
            if check_crc:
                crc = _inflater.crc32(piece, crc)
    except (zlib.error, _inflater.error) as e:
        raise shard_error(path, f"member {info.filename!r} does not inflate ({e})") from e
    finally:
        view.release()
    if not inflater.eof:
        raise shard_error(path, f"member {info.filename!r} ends inside its deflate stream "
                                f"(inflated {pos} of {info.file_size} bytes)")
    if pos != info.file_size:
        raise shard_error(path, f"member {info.filename!r} inflates to {pos} bytes, expected {info.file_size}")
    if check_crc and crc != info.CRC:
        raise shard_error(path, f"CRC-32 mismatch in member {info.filename!r}")
    return out


def _inflated_pieces(inflater: Any, view: memoryview, step: int) -> Iterator[bytes]:
    """The output of inflating `view`, in pieces of at most 4 x `step` bytes.

    Each call's output is bounded, so a member that inflates to far more than it claims
    never allocates more than one piece. When the input is all consumed but the stream
    has not ended, the inflater is asked again with no input: ISA-L keeps the last bytes
    of a stream back when a call's output reached its limit exactly, and hands them
    out only on a further call (`flush()` would return them unbounded).
    """
    limit = 4 * step
    for at in range(0, len(view), step):
        yield inflater.decompress(view[at:at + step], limit)
        while inflater.unconsumed_tail:
            yield inflater.decompress(inflater.unconsumed_tail, limit)
    while not inflater.eof:
        piece = inflater.decompress(b"", limit)
        if not piece:
            return
        yield piece


def read_npz(path: str, names: Sequence[str], *, check_crc: "bool | str" = True,
             max_bytes: Mapping[str, int] | None = None, source: ByteSource | None = None) -> dict[str, np.ndarray]:
    """Read members `names` (without ".npy") of an uncompressed or deflated npz file.

    Raises `ShardError` naming the file for any damage (bad zip, CRC mismatch, missing
    member, object dtype). `check_crc`: True, False, or "once" (see
    `readers.formats.base.CRC_POLICY`). With "once", a file this process has already
    read and verified (same size, mtime and inode) is read from the layout remembered
    then: no zip directory, no .npy headers, no CRC pass (`readers.formats.layouts`).

    Every size the zip directory and local headers claim is checked against the file's
    size, and a member's inflated size against `max_bytes[name]` (the most its .npy
    document may hold, see `member_limits`), before anything is allocated: a damaged
    directory claiming a 4 GB member is a `ShardError`, not a 4 GB allocation.

    `source`: where the bytes come from (`readers.sources`; a bucket object); default:
    the local file at `path`. `path` names the shard in errors either way.
    """
    with naming_shard(path):
        with (source if source is not None else FileSource(path)) as f:
            check_crc, verified_key = crc_due(path, f.stat, check_crc)
            layout = layouts.recall(verified_key) if not check_crc else None
            if layout is not None and all(name in layout for name in names):
                return _read_known(f, path, names, layout)
            out, found = _read_parsed(f, path, names, check_crc, max_bytes or {})
        if check_crc:
            mark_verified(verified_key)
        if verified_key is not None:  # also after the layout was forgotten: verified, parsed again
            layouts.remember(verified_key, {**(layouts.recall(verified_key) or {}), **found})
        return out


class _Member(NamedTuple):
    """Where one member lies: a stored member's array directly (`npy`); a deflated
    member by its zip entry (`start` of the compressed data and the `info`), inflated
    (without a CRC pass) and its header parsed again."""

    npy: _NpyArray | None = None
    start: int = 0
    info: zipfile.ZipInfo | None = None


def _read_known(f: ByteSource, path: str, names: Sequence[str], layout: dict[str, _Member]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    mapped: Any = None
    for name in names:
        m = layout[name]
        if m.npy is not None:
            if mapped is None:
                mapped = f.map()
            out[name] = _view_npy(mapped, m.npy)  # np.frombuffer checks the bounds too
        else:
            data = _inflate_member(f, m.start, m.info, path, check_crc=False)
            out[name] = _parse_npy(data, 0, len(data), m.info.filename, path)
    return out


def _read_parsed(f: ByteSource, path: str, names: Sequence[str], check_crc: bool, max_bytes: Mapping[str, int]
                 ) -> tuple[dict[str, np.ndarray], dict[str, _Member]]:
    """Read `names` through the zip directory and the .npy headers; also returns where
    each member lies (for `readers.formats.layouts`)."""
    try:
        zf = zipfile.ZipFile(f.fileobj())
    except zipfile.BadZipFile as e:
        raise shard_error(path, f"not a valid zip/npz file ({e})") from e
    infos = {info.filename: info for info in zf.infolist()}
    file_size = f.size
    mapped: Any = None
    out: dict[str, np.ndarray] = {}
    found: dict[str, _Member] = {}
    for name in names:
        info = infos.get(name + ".npy")
        if info is None:
            raise shard_error(path, f"member {name + '.npy'!r} is missing; it holds {sorted(infos)}")
        header = f.pread(_LOCAL_HEADER.size, info.header_offset)
        if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_MAGIC:
            raise shard_error(path, f"bad zip local header for member {info.filename!r}",
                              offset=info.header_offset)
        fields = _LOCAL_HEADER.unpack(header)
        start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
        check_member_sizes(path, info, start, file_size, max_bytes.get(name))
        if info.compress_type == zipfile.ZIP_STORED:
            if mapped is None:
                mapped = f.map()
            end = start + info.file_size
            if end > len(mapped):
                raise shard_error(path, f"member {info.filename!r} runs past the end of the file")
            view = memoryview(mapped)
            if check_crc and _inflater.crc32(view[start:end]) != info.CRC:
                raise shard_error(path, f"CRC-32 mismatch in member {info.filename!r}")
            del view
            npy = _npy_layout(mapped, start, end, info.filename, path)
            out[name] = _view_npy(mapped, npy)
            found[name] = _Member(npy)
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            data = _inflate_member(f, start, info, path, check_crc)
            out[name] = _parse_npy(data, 0, len(data), info.filename, path)
            found[name] = _Member(start=start, info=info)
        else:
            raise shard_error(
                path, f"member {info.filename!r} uses zip compression method {info.compress_type}; "
                "expected stored (0) or deflated (8)"
            )
    return out, found


#: Most bytes a .npy header takes (`_npy_layout` refuses longer ones): magic, version, length, text.
NPY_HEADER_MAX_BYTES = 12 + (1 << 16)
#: Most bytes one deflated byte can inflate to (deflate's limit is about 1032:1).
DEFLATE_MAX_RATIO = 1032
#: Characters of a key when the manifest lists none to measure (a path: PATH_MAX).
KEY_MAX_CHARS = 4096


def check_member_sizes(path: str, info: zipfile.ZipInfo, start: int, file_size: int, limit: int | None) -> None:
    """Refuse sizes the zip directory claims that the file or the manifest cannot back,
    before a buffer of that size is allocated (`start`: where the member's data begins,
    or a lower bound of it; `limit`: see `member_limits`). Raises `ShardError`."""
    name = info.filename
    if start + info.compress_size > file_size:
        raise shard_error(path, f"member {name!r} claims {info.compress_size} bytes at offset {start}, past the "
                                f"end of the {file_size}-byte file (a damaged zip directory)")
    if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
        raise shard_error(path, f"stored member {name!r} claims {info.file_size} bytes but stores "
                                f"{info.compress_size} (a damaged zip directory)")
    if info.file_size > DEFLATE_MAX_RATIO * info.compress_size + 1024:
        raise shard_error(path, f"member {name!r} claims {info.file_size} bytes from {info.compress_size} "
                                "compressed bytes, more than deflate can produce (a damaged zip directory)")
    if limit is not None and info.file_size > limit:
        raise shard_error(path, f"member {name!r} claims {info.file_size} bytes, more than the {limit} the "
                                "manifest's record count and shape allow (a damaged zip directory or manifest)")


def member_limits(shard: ShardRef, spec: RecordSpec) -> dict[str, int]:
    """The most bytes each member's .npy document may hold, from the manifest: records x
    the record shape, keys at the manifest's longest key (4 bytes per character), plus
    the largest header."""
    n = shard.records
    samples = shard.entry.samples  # inline keys (versions 1, 2); none in version 3
    key_chars = max((len(s.key) for s in samples), default=0) if samples else KEY_MAX_CHARS
    target = (spec.kind.npz_member,
              math.prod(spec.mask_shape) * spec.mask_np_dtype.itemsize if spec.segmentation else 8)
    per_record = {NPZ_IMAGES: spec.image_bytes, target[0]: target[1], NPZ_KEYS: 4 * max(key_chars, 1)}
    return {name: n * size + NPY_HEADER_MAX_BYTES for name, size in per_record.items()}


def _encoded_parts(arrays: dict[str, np.ndarray], data_name: str, offsets_name: str, n: int,
                   path: str) -> list[np.ndarray]:
    """Per-record views of an encoded field stored as bytes + offsets (see `readers.formats`)."""
    data, offsets = arrays[data_name], arrays[offsets_name]
    if data.ndim != 1 or data.dtype != np.uint8:
        raise shard_error(path, f"member {data_name!r} is {data.shape} {data.dtype}, expected 1-D uint8")
    if offsets.shape != (n + 1,) or offsets.dtype.kind not in "iu":
        raise shard_error(path, f"member {offsets_name!r} is {offsets.shape} {offsets.dtype}, expected "
                          f"({n + 1},) int64 for {n} records")
    bounds = offsets.astype(np.int64)
    if n and (bounds[0] != 0 or bounds[-1] != data.size or np.any(np.diff(bounds) <= 0)):
        raise shard_error(path, f"member {offsets_name!r} does not cut {data_name!r} ({data.size} bytes) into "
                          f"{n} non-empty records")
    return [data[bounds[i]:bounds[i + 1]] for i in range(n)]


def _encoded_limits(shard: ShardRef, spec: RecordSpec) -> dict[str, int]:
    """`member_limits` for an encoded shard: offsets hold N+1 int64; keys, labels and raw
    masks as in raw shards. The byte members are bounded by the file (they are stored)."""
    limits = member_limits(shard, spec)
    offsets = 8 * (shard.records + 1) + NPY_HEADER_MAX_BYTES
    limits.update({NPZ_IMAGE_OFFSETS: offsets, NPZ_MASK_OFFSETS: offsets})
    limits.pop(NPZ_IMAGES, None)
    return limits


def _load_encoded(shard: ShardRef, spec: RecordSpec, check_crc: "bool | str") -> NpzShard:
    """An encoded shard: image (and mask) bytes + offsets, decoded per record on access."""
    from readers.formats.encoding import image_column, mask_column

    path, n = shard.path, shard.records
    names = [NPZ_IMAGE_BYTES, NPZ_IMAGE_OFFSETS, NPZ_KEYS]
    if spec.segmentation:
        masks_encoded = spec.mask_codec != "raw"
        names += [NPZ_MASK_BYTES, NPZ_MASK_OFFSETS] if masks_encoded else [NPZ_MASKS]
    else:
        names.append(NPZ_LABELS)
    arrays = read_npz(path, names, check_crc=check_crc, max_bytes=_encoded_limits(shard, spec),
                      source=_whole_source(shard))
    images: Any = image_column(_encoded_parts(arrays, NPZ_IMAGE_BYTES, NPZ_IMAGE_OFFSETS, n, path), spec, path)
    if not spec.segmentation:
        targets = arrays[NPZ_LABELS]
        if targets.shape != (n,) or targets.dtype.kind not in "iu":
            raise shard_error(path, f"member {NPZ_LABELS!r} is {targets.shape} {targets.dtype}, expected ({n},) integers")
    elif masks_encoded:
        targets = mask_column(_encoded_parts(arrays, NPZ_MASK_BYTES, NPZ_MASK_OFFSETS, n, path), spec, path)
    else:
        targets = arrays[NPZ_MASKS]
        if targets.shape != (n, *spec.mask_shape) or targets.dtype != spec.mask_np_dtype:
            raise shard_error(path, f"member {NPZ_MASKS!r} is {targets.shape} {targets.dtype}, the manifest implies "
                              f"{(n, *spec.mask_shape)} {spec.mask_np_dtype.name}")
    keys = arrays[NPZ_KEYS]
    if keys.shape != (n,) or keys.dtype.kind not in "US":
        raise shard_error(path, f"member {NPZ_KEYS!r} is {keys.shape} {keys.dtype}, expected ({n},) strings")
    return ShardArrays(images, targets, keys)


def load_shard(shard: ShardRef, spec: RecordSpec, *, check_crc: "bool | str" = True) -> NpzShard:
    """Read and check one shard against the manifest (encoded shards: see `_load_encoded`)."""
    if spec.image_codec != "raw":
        return _load_encoded(shard, spec, check_crc)
    path = shard.path
    target_name = spec.kind.npz_member
    arrays = read_npz(path, [NPZ_IMAGES, target_name, NPZ_KEYS], check_crc=check_crc,
                      max_bytes=member_limits(shard, spec), source=_whole_source(shard))
    images, targets, keys = arrays[NPZ_IMAGES], arrays[target_name], arrays[NPZ_KEYS]
    n = shard.records
    expected = {
        NPZ_IMAGES: ((n, *spec.image_shape), spec.image_np_dtype),
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
    return ShardArrays(images, targets, keys)


def _whole_source(shard: ShardRef) -> ByteSource | None:
    """The bytes of a bucket shard (its cached copy, or one whole checked read); None for a local file."""
    if shard.source is None:
        return None
    with naming_shard(shard.path):
        return open_source(shard)


def _load_for_training(shard: ShardRef, spec: RecordSpec) -> NpzShard:
    return load_shard(shard, spec, check_crc="once")


def _check_claims(path: str, info: zipfile.ZipInfo, file_size: int) -> None:
    """`check_member_sizes` (without the manifest's limit) as a `CountError`."""
    try:
        check_member_sizes(path, info, info.header_offset, file_size, None)
    except ShardError as e:
        raise CountError(str(e).split(": ", 1)[1].replace(" " + FIX_HINT, "")) from e


def _member_header(zf: zipfile.ZipFile, names: set[str], member: str, path: str,
                   file_size: int) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of one member from its .npy header, with `count_npz_records`'s checks:
    present, sizes the file can back, no negative dimension, no objects, header and zip
    directory agreeing on the size."""
    if member + ".npy" not in names:
        raise CountError(f"member {member}.npy is missing; it holds {sorted(names)}")
    info = zf.getinfo(member + ".npy")
    _check_claims(path, info, file_size)
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = header(f)
        header_bytes = f.tell()
    if any(d < 0 for d in shape):
        raise CountError(f"member {member}.npy has a negative dimension in its shape {shape}")
    if dtype.hasobject:
        raise CountError(f"member {member}.npy holds Python objects ({dtype}); pickled data is never loaded")
    if info.file_size != header_bytes + math.prod(shape) * dtype.itemsize:
        raise CountError(f"member {member}.npy claims {info.file_size} bytes in the zip directory, its .npy header "
                         f"{shape} {dtype} implies {header_bytes + math.prod(shape) * dtype.itemsize}")
    return tuple(shape), dtype


def _count_encoded_npz(path: str, spec: RecordSpec) -> int:
    """Records of an encoded NPZ shard: N+1 offsets per encoded field, N keys (and labels)."""
    with open_regular_file(path) as raw, zipfile.ZipFile(raw) as zf:
        names = set(zf.namelist())
        file_size = os.fstat(raw.fileno()).st_size
        counts = {}
        for member in (NPZ_IMAGE_OFFSETS, NPZ_KEYS,
                       (NPZ_MASK_OFFSETS if spec.mask_codec != "raw" else NPZ_MASKS) if spec.segmentation
                       else NPZ_LABELS):
            shape, dtype = _member_header(zf, names, member, path, file_size)
            offsets = member in (NPZ_IMAGE_OFFSETS, NPZ_MASK_OFFSETS)
            if not shape or (offsets and (len(shape) != 1 or shape[0] < 1 or dtype.kind not in "iu")):
                raise CountError(f"member {member}.npy is {shape} {dtype}, expected (N{' + 1' if offsets else ''},)")
            counts[member] = shape[0] - 1 if offsets else shape[0]
        for member in (NPZ_IMAGE_BYTES,) + ((NPZ_MASK_BYTES,) if spec.segmentation and spec.mask_codec != "raw"
                                            else ()):
            shape, dtype = _member_header(zf, names, member, path, file_size)
            if len(shape) != 1 or dtype != np.uint8:
                raise CountError(f"member {member}.npy is {shape} {dtype}, expected 1-D uint8")
    if len(set(counts.values())) != 1:
        raise CountError(f"members disagree on the number of records: {counts}")
    return counts[NPZ_KEYS]


def count_npz_records(path: str, spec: RecordSpec) -> int:
    """Records of an NPZ shard from its members' .npy headers (no data read, nothing unpickled)."""
    if spec.image_codec != "raw":
        return _count_encoded_npz(path, spec)
    target = spec.kind.npz_member
    want = {NPZ_IMAGES: (spec.image_shape, spec.image_np_dtype), NPZ_KEYS: ((), None),
            target: ((spec.mask_shape, spec.mask_np_dtype) if spec.segmentation else ((), None))}
    counts = {}
    with open_regular_file(path) as raw, zipfile.ZipFile(raw) as zf:
        names = set(zf.namelist())
        file_size = os.fstat(raw.fileno()).st_size
        for member, (shape, dtype) in want.items():
            got_shape, got_dtype = _member_header(zf, names, member, path, file_size)
            if got_shape[1:] != tuple(shape) or (dtype is not None and got_dtype != dtype):
                raise CountError(f"member {member}.npy is {got_shape} {got_dtype}, the manifest implies "
                             f"(N, {', '.join(map(str, shape))}) {dtype if dtype is not None else ''}")
            if member == NPZ_KEYS and got_dtype.kind not in "US":
                raise CountError(f"member {member}.npy holds {got_dtype}, expected strings")
            if member == NPZ_LABELS and got_dtype.kind not in "iu":
                raise CountError(f"member {member}.npy holds {got_dtype}, expected integers")
            counts[member] = got_shape[0] if got_shape else 0
    if len(set(counts.values())) != 1:
        raise CountError(f"members disagree on the number of records: {counts}")
    return counts[NPZ_IMAGES]


class NpzAdapter(FileAdapter):
    file_format = FileFormat.NPZ

    def iter_shard(self, shard: ShardRef, spec: RecordSpec) -> Iterator[Record]:
        from readers.formats.encoding import decode_stored

        return decode_stored(self.iter_stored(shard, spec), spec, shard.path)

    def iter_stored(self, shard: ShardRef, spec: RecordSpec) -> Iterator[Record]:
        data = load_shard(shard, spec)

        def stored(column: Any, i: int) -> Any:
            raw = getattr(column, "raw", None)  # an EncodedColumn: its stored bytes
            return raw(i) if raw is not None else column[i]

        for i in range(shard.records):
            with naming_shard(shard.path, i):
                key = data.keys[i]
                key = key.decode("utf-8") if isinstance(key, bytes) else str(key)
                if spec.segmentation:
                    record = Record(key, stored(data.images, i), mask=stored(data.targets, i))
                else:
                    record = Record(key, stored(data.images, i), label=int(data.targets[i]))
            yield record

    def tf_dataset(self, shards: Sequence[ShardRef], spec: RecordSpec, options: PipelineOptions,
                   ids: "np.ndarray | None" = None) -> "tf.data.Dataset":
        """Batched (x, y) from NPZ shards.

        Loader threads read whole shards (inflate + CRC, GIL free) ahead of a generator
        that cuts compact batches (see `readers.formats.batching` for order, shuffling and
        threads).
        """
        return generator_dataset(shards, spec, options, checked_load(_load_for_training), ids)

    def count_records(self, path: str, spec: RecordSpec, *, check_crc: bool = False) -> int:
        return count_npz_records(path, spec)

    def random_access(self, shard: ShardRef, spec: RecordSpec) -> "NpzRandomAccess":
        return NpzRandomAccess(shard, spec)


class NpzRandomAccess(RandomAccessShard):
    """Records of one NPZ shard by index.

    Stored (uncompressed) shards are mapped, so opening one is cheap and reads touch
    only the pages of the records asked for. Deflated shards are inflated whole on first
    use and kept (`CACHE_BYTES` per process across shards, least recently used
    dropped): random access over a large deflated split inflates shards repeatedly --
    prefer compression "none" for `keras_dataset`. Safe to pickle and to share between
    threads.

    A shard of a bucket dataset read without a local cache: the records of stored, raw
    members are read by ranged GETs (`RangedMembers`: the zip directory and .npy headers
    once, then one GET per image and mask); deflated and encoded shards are read whole
    (one checked GET) into the same per-process cache.
    """

    _cache: "collections.OrderedDict[str, NpzShard]" = collections.OrderedDict()
    _ranged: "collections.OrderedDict[tuple[int, str], RangedMembers | None]" = collections.OrderedDict()
    _lock = threading.Lock()

    def _ranged_members(self) -> "RangedMembers | None":
        """The ranged layout of a bucket shard (None when its members are not stored raw)."""
        key = (os.getpid(), self.shard.path)
        with NpzRandomAccess._lock:
            if key in NpzRandomAccess._ranged:
                NpzRandomAccess._ranged.move_to_end(key)
                return NpzRandomAccess._ranged[key]
        layout = RangedMembers.open(self.shard, self.spec)
        with NpzRandomAccess._lock:
            NpzRandomAccess._ranged[key] = layout
            while len(NpzRandomAccess._ranged) > RANGED_SHARDS:
                NpzRandomAccess._ranged.popitem(last=False)
        return layout

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
        data = load_shard(self.shard, self.spec, check_crc="once")
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
        if is_ranged(self.shard) and self.spec.image_codec == "raw":
            members = self._ranged_members()
            if members is not None:
                return members.read(index)
        data = self._data()
        with naming_shard(self.shard.path, index):
            target = data.targets[index]
            target = target if self.spec.segmentation else int(target)
            check_record(target, self.spec, self.shard.path, index)
            return data.images[index], target


#: Ranged layouts of bucket shards kept per process (a few hundred bytes each).
RANGED_SHARDS = 4096


class RangedMembers:
    """Where each record of a stored NPZ shard in a bucket lies, for ranged GETs.

    `open` reads the zip directory and the members' local and .npy headers by ranged
    reads and applies the checks `read_npz` applies (sizes the object can back, stored
    members, no object dtypes, shapes and dtypes the manifest implies); `read(i)` then
    gets record i's image (and mask) with one ranged GET each. Labels (classification)
    are read whole once. The zip CRC-32 covers a whole member and cannot be checked on a
    range: pixel damage inside a member shows only on a whole read (`tf_dataset`,
    `records`, `imgshard verify`, or any read through the cache, checked against the
    manifest's digest).
    """

    def __init__(self, source: ByteSource, path: str, images: _NpyArray, targets: _NpyArray | None,
                 labels: np.ndarray | None, spec: RecordSpec) -> None:
        self.source, self.path, self.images, self.targets, self.labels, self.spec = (
            source, path, images, targets, labels, spec)

    @classmethod
    def open(cls, shard: ShardRef, spec: RecordSpec) -> "RangedMembers | None":
        path = shard.path
        with naming_shard(path):
            source = open_source(shard, ranged=True)
            try:
                zf = zipfile.ZipFile(source.fileobj())
            except zipfile.BadZipFile as e:
                raise shard_error(path, f"not a valid zip/npz file ({e})") from e
            infos = {info.filename: info for info in zf.infolist()}
            limits = member_limits(shard, spec)
            n = shard.records
            image = cls._member(source, infos, NPZ_IMAGES, path, limits, (n, *spec.image_shape), spec.image_np_dtype)
            if image is None:
                return None
            if spec.segmentation:
                target = cls._member(source, infos, spec.kind.npz_member, path, limits, (n, *spec.mask_shape),
                                     spec.mask_np_dtype)
                return None if target is None else cls(source, path, image, target, None, spec)
            labels = read_npz(path, [NPZ_LABELS], check_crc=True, source=open_source(shard))[NPZ_LABELS]
            if labels.shape != (n,) or labels.dtype.kind not in "iu":
                raise shard_error(path, f"member {NPZ_LABELS!r} is {labels.shape} {labels.dtype}, expected ({n},) "
                                  "integers")
            return cls(source, path, image, None, labels, spec)

    @staticmethod
    def _member(source: ByteSource, infos: dict, name: str, path: str, limits: Mapping[str, int],
                shape: tuple[int, ...], dtype: Any) -> _NpyArray | None:
        """The layout of a stored member (offsets in the object), checked; None when deflated."""
        info = infos.get(name + ".npy")
        if info is None:
            raise shard_error(path, f"member {name + '.npy'!r} is missing; it holds {sorted(infos)}")
        if info.compress_type != zipfile.ZIP_STORED:
            return None
        header = source.pread(_LOCAL_HEADER.size, info.header_offset)
        if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_MAGIC:
            raise shard_error(path, f"bad zip local header for member {info.filename!r}", offset=info.header_offset)
        fields = _LOCAL_HEADER.unpack(header)
        start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
        check_member_sizes(path, info, start, source.size, limits.get(name))
        head = source.pread(min(info.file_size, NPY_HEADER_MAX_BYTES), start)
        npy = _npy_layout(head, 0, info.file_size, info.filename, path)
        if npy.shape != shape or npy.dtype != np.dtype(dtype) or npy.fortran:
            raise shard_error(path, f"member {name!r} is {npy.shape} {npy.dtype}, the manifest implies {shape} "
                              f"{np.dtype(dtype).name}")
        return npy._replace(offset=start + npy.offset)

    def _row(self, npy: _NpyArray, index: int) -> np.ndarray:
        row = npy.shape[1:]
        nbytes = math.prod(row) * npy.dtype.itemsize
        data = self.source.pread(nbytes, npy.offset + index * nbytes)
        if len(data) != nbytes:
            raise shard_error(self.path, f"record bytes end early ({len(data)} of {nbytes})", record=index)
        return np.frombuffer(data, npy.dtype).reshape(row)

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray | int]:
        with naming_shard(self.path, index):
            image = self._row(self.images, index)
            target = self._row(self.targets, index) if self.targets is not None else int(self.labels[index])
            check_record(target, self.spec, self.path, index)
            return image, target


ADAPTER = NpzAdapter()


def _new_locks() -> None:  # a forked child (keras_dataset workers) must not inherit a lock a thread held
    global _AST_LOCK
    _AST_LOCK = threading.Lock()
    _POOL._lock = threading.Lock()
    NpzRandomAccess._lock = threading.Lock()


os.register_at_fork(after_in_child=_new_locks)


__all__ = ["ADAPTER", "CACHE_BYTES", "NpzAdapter", "NpzRandomAccess", "NpzShard", "ShardError",
           "check_member_sizes", "load_shard", "member_limits", "read_npz"]
