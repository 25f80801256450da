"""Per-shard index files: the per-sample data of a version-3 dataset.

A version-3 manifest lists shards only; what it knows about each sample (its key, its
source files' paths, sizes, mtimes and content digests, its record position) lives in
one index file per shard, written by the task that wrote the shard, next to it:

    train-00003.tfrecord                         the shard
    train-00003.tfrecord.9f2c4e1a0b7d3366.idx.npy   its index (the hex is the start of its digest)

The manifest's shard entry names the index file with its byte count and digest
(``"index": {"file": ..., "bytes": ..., "digest": "xxh3_128:..."}``). The name holds
the start of the digest, so an index that changes (a refreshed mtime) gets a new
name: a file a published manifest lists never changes under a reader.

Format: one NumPy ``.npy`` file (`numpy.save`, format 1.0/2.0) holding a structured
array with one row per record, row i describing record i of the shard. It loads with
``numpy.load(path, allow_pickle=False)``; no TensorFlow, no imgshard needed. Fields
(strings are UTF-8 bytes, ``S<n>`` with n the longest value of the file):

==================  ======  ======================================================
field               dtype   meaning
==================  ======  ======================================================
``key``             S       the sample's key (unique in the dataset)
``record``          <i4     its record position in the shard (= the row number)
``label``           <i8     class label (classification), -1 for segmentation
``image_path``      S       image source, relative to the source root ('/'-separated)
``image_size``      <i8     its size in bytes when converted
``image_mtime_ns``  <i8     its mtime (ns) when converted
``image_digest``    S       ``ALGORITHM:HEX`` of its content
``mask_*``          ...     the same for the mask; ``mask_size`` -1 when there is none
``classes``         u1[m]   optional (written since issue 30): the classes present in
                            the sample, a bitmask (`numpy.packbits`, little bit order,
                            m = ceil(classes / 8)); read by repeat-factor sampling
==================  ======  ======================================================

Index files written before the ``classes`` column still open (`ref_classes` gives None).

This module needs only NumPy (xxhash is imported when a digest is checked) so that
both the readers and the converter use it.
"""

from __future__ import annotations

import io
import os
import re
from typing import Any, Sequence

import numpy as np

from readers.digest import digest_bytes
from readers.manifest import IndexRef, ManifestError, SampleEntry, ShardEntry, SourceFingerprint

INDEX_SUFFIX = ".idx.npy"
_NPY_MAGIC = b"\x93NUMPY"
INDEX_ALGORITHM = "xxh3_128"
_NAME_HEX = 16
_INDEX_RE = re.compile(r"^[A-Za-z0-9_.]+-\d{5,}(?:-r[0-9a-f]{8})?\.[a-z]+\.[0-9a-f]{%d}%s$" % (_NAME_HEX, re.escape(INDEX_SUFFIX)))

_STR_FIELDS = ("key", "image_path", "image_digest", "mask_path", "mask_digest")
_INT_FIELDS = {"record": "<i4", "label": "<i8", "image_size": "<i8", "image_mtime_ns": "<i8",
               "mask_size": "<i8", "mask_mtime_ns": "<i8"}
FIELDS = ("key", "record", "label", "image_path", "image_size", "image_mtime_ns", "image_digest",
          "mask_path", "mask_size", "mask_mtime_ns", "mask_digest")
#: The optional last field: per-sample class presence as a bitmask (uint8 subarray).
CLASSES_FIELD = "classes"


class IndexFileError(ManifestError):
    """An index file is missing, damaged, or disagrees with the manifest."""


def is_index_name(name: str) -> bool:
    return bool(_INDEX_RE.match(name))


def index_name(shard_file: str, digest: str) -> str:
    return f"{shard_file}.{digest.split(':', 1)[1][:_NAME_HEX]}{INDEX_SUFFIX}"


def _digest(data: bytes | memoryview) -> str:
    return digest_bytes(data, INDEX_ALGORITHM)


def _utf8(values: Sequence[str]) -> np.ndarray:
    encoded = [v.encode("utf-8") for v in values]
    width = max([1] + [len(b) for b in encoded])
    return np.array(encoded, dtype=f"S{width}")


def build_table(samples: Sequence[SampleEntry], classes: np.ndarray | None = None) -> np.ndarray:
    """The index rows of `samples` (record i = samples[i]); `classes`: (n, K) bool class
    presence per sample, stored as the optional bitmask field, or (n, m) uint8 bitmasks."""
    n = len(samples)
    cols: dict[str, np.ndarray] = {
        "key": _utf8([s.key for s in samples]),
        "image_path": _utf8([s.image.path for s in samples]),
        "image_digest": _utf8([s.image.digest for s in samples]),
        "mask_path": _utf8([s.mask.path if s.mask else "" for s in samples]),
        "mask_digest": _utf8([s.mask.digest if s.mask else "" for s in samples]),
        "record": np.arange(n, dtype="<i4"),
        "label": np.array([-1 if s.label is None else s.label for s in samples], "<i8"),
        "image_size": np.array([s.image.size for s in samples], "<i8"),
        "image_mtime_ns": np.array([s.image.mtime_ns for s in samples], "<i8"),
        "mask_size": np.array([s.mask.size if s.mask else -1 for s in samples], "<i8"),
        "mask_mtime_ns": np.array([s.mask.mtime_ns if s.mask else 0 for s in samples], "<i8"),
    }
    fields = [(f, cols[f].dtype) for f in FIELDS]
    if classes is not None:
        classes = np.asarray(classes)
        bits = classes if classes.dtype == np.uint8 else np.packbits(classes.astype(bool), axis=1, bitorder="little")
        cols[CLASSES_FIELD] = bits.reshape(n, -1)
        fields.append((CLASSES_FIELD, np.uint8, (cols[CLASSES_FIELD].shape[1],)))
    table = np.empty(n, dtype=fields)
    for f, *_ in fields:
        table[f] = cols[f]
    return table


def encode_table(table: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, table, allow_pickle=False)
    return buf.getvalue()


def index_ref(shard_file: str, data: bytes) -> IndexRef:
    """The manifest's reference to the index file of `shard_file` holding `data`."""
    digest = _digest(data)
    return IndexRef(index_name(shard_file, digest), len(data), digest)


def encode_index(shard_file: str, samples: Sequence[SampleEntry],
                 classes: np.ndarray | None = None) -> tuple[IndexRef, bytes]:
    """(the manifest's reference, the file's bytes) of the index of `samples`."""
    data = encode_table(build_table(samples, classes))
    return index_ref(shard_file, data), data


def decode_index(data: bytes, where: str, records: int | None = None) -> np.ndarray:
    """Parse and check an index file's bytes (structure only; the digest is the caller's).

    The header's shape is bounded by the bytes there are before anything is allocated: a
    header claiming (4e9,) rows in a 2 KB file is damage, not a 682 GiB allocation; a zip
    (an ``.npz``) or anything else that is not one ``.npy`` document is refused."""
    fix = "Check the dataset with `imgshard verify OUT`; re-convert with --rebuild."
    if not bytes(data[:6]) == _NPY_MAGIC:
        what = "a zip archive" if bytes(data[:4]) == b"PK\x03\x04" else "not a .npy file"
        raise IndexFileError(f"{where}: not a readable index file (it is {what}, expected one NumPy .npy "
                             f"array). {fix}")
    try:
        buf = io.BytesIO(data)
        version = np.lib.format.read_magic(buf)
        shape, _, dtype = (np.lib.format.read_array_header_1_0(buf) if version == (1, 0)
                           else np.lib.format.read_array_header_2_0(buf))
        needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if needed > len(data) - buf.tell():
            raise ValueError(f"its header claims shape {shape} of {dtype.itemsize}-byte rows ({needed} bytes), "
                             f"but the file holds {len(data) - buf.tell()} bytes after the header")
        table = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError, TypeError, SyntaxError) as e:
        raise IndexFileError(f"{where}: not a readable index file ({type(e).__name__}: {e}). {fix}") from e
    check_table(table, where, records)
    return table


def check_table(table: np.ndarray, where: str, records: int | None = None) -> None:
    """The index's content is what this module writes: fields, types, rows, unique keys."""
    names = table.dtype.names
    if table.ndim != 1 or names is None or tuple(names) not in (FIELDS, FIELDS + (CLASSES_FIELD,)):
        raise IndexFileError(f"{where}: expected a 1-D structured array with fields {list(FIELDS)} (and "
                             f"optionally {CLASSES_FIELD!r}). Received: shape {table.shape}, fields {list(names or ())}.")
    if CLASSES_FIELD in names and (table.dtype[CLASSES_FIELD].base != np.uint8
                                   or len(table.dtype[CLASSES_FIELD].shape) != 1):
        raise IndexFileError(f"{where}: field {CLASSES_FIELD!r} must be a uint8 bitmask per row, received "
                             f"{table.dtype[CLASSES_FIELD]}.")
    for f in _STR_FIELDS:
        if table.dtype[f].kind != "S":
            raise IndexFileError(f"{where}: field {f!r} must hold bytes (S), received {table.dtype[f]}.")
    for f, dt in _INT_FIELDS.items():
        if table.dtype[f] != np.dtype(dt):
            raise IndexFileError(f"{where}: field {f!r} must be {np.dtype(dt)}, received {table.dtype[f]}.")
    if records is not None and len(table) != records:
        raise IndexFileError(f"{where}: holds {len(table)} rows, the manifest says the shard has {records} records.")
    if not np.array_equal(table["record"], np.arange(len(table))):
        raise IndexFileError(f"{where}: record positions are not 0..{len(table) - 1} in order.")
    if len(table) and (table["image_size"].min() < 0 or (table["key"] == b"").any()):
        raise IndexFileError(f"{where}: holds an empty key or a negative image size.")
    if len(np.unique(table["key"])) != len(table):
        raise IndexFileError(f"{where}: lists a key twice.")
    for f in _STR_FIELDS:
        _check_utf8(table[f], f, where)


def _check_utf8(column: np.ndarray, field: str, where: str) -> None:
    """Every value of a bytes field is UTF-8 (what the writer stores); the first that is not is named."""
    try:
        np.char.decode(column, "utf-8")
    except UnicodeDecodeError:
        for row, value in enumerate(column.tolist()):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as e:
                raise IndexFileError(f"{where}: row {row}'s {field} is not UTF-8 ({value!r}: {e.reason} at byte "
                                     f"{e.start}); the file is damaged. Check the dataset with `imgshard verify "
                                     "OUT`; re-convert with --rebuild.") from None


def read_bounded(root: str, path: str, expected: int, shard_file: str) -> bytes:
    """The bytes of an index file: a regular file inside the dataset folder, read up to one
    byte past the size the manifest gives (a swapped-in huge file is not read whole)."""
    from readers.files import check_inside, open_regular_file

    try:
        check_inside(root, path)
        with open_regular_file(path) as f:
            # never more than the file holds: a damaged "bytes" of 1 TiB allocates nothing
            return f.read(min(max(expected, 0), os.fstat(f.fileno()).st_size) + 1)
    except FileNotFoundError:
        raise IndexFileError(f"Index file {path} of shard {shard_file} is missing. Check the dataset with "
                             "`imgshard verify OUT`; re-convert with --rebuild.") from None
    except OSError as e:
        raise IndexFileError(f"Index file {path} of shard {shard_file} cannot be read ({e}). Check the dataset "
                             "with `imgshard verify OUT`; re-convert with --rebuild.") from e


def read_index(root: str, entry: ShardEntry) -> np.ndarray:
    """Load and check the index of `entry` (in dataset folder `root`): digest, size, content."""
    ref = entry.index
    if ref is None:
        raise IndexFileError(f"{entry.file}: the manifest names no index file for it (a version-1/2 manifest).")
    path = os.path.join(root, ref.file)
    data = read_bounded(root, path, ref.bytes, entry.file)
    if len(data) != ref.bytes or _digest(data) != ref.digest:
        raise IndexFileError(f"Index file {path} of shard {entry.file} is damaged: its size or digest differs from "
                             "the manifest's. Check the dataset with `imgshard verify OUT`; re-convert with "
                             "--rebuild.")
    return decode_index(data, path, entry.records)


def table_samples(table: np.ndarray) -> list[SampleEntry]:
    """The rows as `SampleEntry`s (for the few rows a run rewrites)."""
    out = []
    for row in table:
        def fp(prefix: str) -> SourceFingerprint:
            return SourceFingerprint(row[f"{prefix}_path"].decode("utf-8"), int(row[f"{prefix}_size"]),
                                     int(row[f"{prefix}_mtime_ns"]), row[f"{prefix}_digest"].decode("utf-8"))

        label = int(row["label"])
        out.append(SampleEntry(row["key"].decode("utf-8"), fp("image"),
                               fp("mask") if int(row["mask_size"]) >= 0 else None, None if label < 0 else label))
    return out


def shard_samples(root: str, entry: ShardEntry) -> list[SampleEntry]:
    """Every sample of a shard: from its index file (version 3) or the manifest (versions 1, 2)."""
    if entry.index is None:
        return list(entry.samples)
    return table_samples(read_index(root, entry))


def ref_table(shard: Any) -> np.ndarray:
    """The checked index table of a `ShardRef` of a version-3 dataset: its local index file,
    or the index object of a bucket dataset (`readers.remote`)."""
    entry = shard.entry
    if shard.source is not None:
        return read_index_object(shard.source.index_file(entry.index), entry.records)
    return read_index(shard.path[: len(shard.path) - len(entry.file)], entry)


def read_index_object(remote: Any, records: int) -> np.ndarray:
    """The checked table of an index object of a bucket dataset (a `readers.remote.RemoteFile`:
    its verified cached copy, or one GET checked against the manifest's size and digest)."""
    from readers.errors import ShardError

    try:
        with remote.open() as source:
            data = bytes(source.map())
        if remote.cached:  # the copy was verified when stored; check what was read from it
            remote.check(data)
    except ShardError as e:
        raise IndexFileError(str(e)) from e
    return decode_index(data, remote.url, records)


def ref_classes(shard: Any, num_classes: int) -> np.ndarray | None:
    """(records, num_classes) bool: the classes present in each record of a `ShardRef`,
    from its index file's ``classes`` field; None where the index has none (written
    before it, or a version-1/2 manifest)."""
    if shard.entry.index is None:
        return None
    table = ref_table(shard)
    if CLASSES_FIELD not in table.dtype.names:
        return None
    bits = np.unpackbits(table[CLASSES_FIELD], axis=1, bitorder="little")
    if bits.shape[1] < num_classes:
        raise IndexFileError(f"{shard.entry.index.file}: its {CLASSES_FIELD!r} field holds {bits.shape[1]} bits, "
                             f"the dataset has {num_classes} classes. Re-convert with --rebuild.")
    return bits[:, :num_classes].astype(bool)


def ref_keys(shard: Any) -> list[str]:
    """The keys of a `ShardRef`'s records, in record order (any manifest version, any store)."""
    if shard.entry.index is None:
        return shard.entry.keys
    return [k.decode("utf-8") for k in ref_table(shard)["key"].tolist()]


def shard_keys(root: str, entry: ShardEntry) -> list[str]:
    """The keys of a shard's records, in record order."""
    if entry.index is None:
        return entry.keys
    return [k.decode("utf-8") for k in read_index(root, entry)["key"].tolist()]


__all__ = ["FIELDS", "INDEX_SUFFIX", "IndexFileError", "build_table", "decode_index", "encode_index", "index_name",
           "index_ref", "encode_table", "read_bounded",
           "is_index_name", "read_index", "read_index_object", "ref_keys", "ref_table", "shard_keys", "shard_samples", "table_samples"]
