"""TFRecord files and ``tf.train.Example`` messages in plain Python, without TensorFlow.

Converter workers write shards with this module so that they never import TensorFlow
(seconds and hundreds of MB per process); ``imgshard verify`` and the NumPy reader read
shards with it. The bytes are identical to what TensorFlow writes::

    tf.io.TFRecordWriter(path).write(
        tf.train.Example(...).SerializeToString(deterministic=True))

TFRecord framing, per record (all little-endian)::

    uint64 length
    uint32 masked_crc32c(length bytes)
    byte   payload[length]
    uint32 masked_crc32c(payload)

``compression="gzip"`` means the whole file is one gzip stream around that framing,
as with TensorFlow's ``"GZIP"`` option.

``tf.train.Example`` as protobuf fields (``deterministic=True`` sorts the map by key)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }   # entries: key = 1, value = 2
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

Example::

    with open("train-00000.tfrecord", "wb") as f:
        writer = TFRecordWriter(f)
        writer.write(encode_example({"image": pixels.tobytes(), "height": 512,
                                     "width": 512, "key": "train/0001.png"}))
        writer.close()
    for payload in iter_records("train-00000.tfrecord"):
        features = decode_example(payload)   # {"image": [b"..."], "height": [512], ...}
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import numbers
import os
import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, BinaryIO, Union

import google_crc32c

from readers.formats import COMPRESSIONS, FileFormat

# `google_crc32c.implementation` is "c" when its C extension (hardware CRC32C) loaded
# and "python" when it fell back to a pure-Python table loop, orders of magnitude
# slower: check it first if writing or verifying shards is slow.

__all__ = [
    "BYTES_LIST",
    "FLOAT_LIST",
    "INT64_LIST",
    "Feature",
    "TFRecordCorruptError",
    "TFRecordWriter",
    "count_records",
    "decode_example",
    "encode_example",
    "frame_record",
    "iter_records",
    "masked_crc32c",
    "write_record",
]

BytesLike = Union[bytes, bytearray, memoryview]
PathOrFile = Union[str, "os.PathLike[str]", BinaryIO, IO[bytes]]

BYTES_LIST = "bytes_list"
FLOAT_LIST = "float_list"
INT64_LIST = "int64_list"
_FEATURE_KINDS = (BYTES_LIST, FLOAT_LIST, INT64_LIST)
#: Protobuf field number of each kind inside `tf.train.Feature`.
_KIND_FIELD = {BYTES_LIST: 1, FLOAT_LIST: 2, INT64_LIST: 3}
_FIELD_KIND = {number: kind for kind, number in _KIND_FIELD.items()}

_COMPRESSIONS = COMPRESSIONS[FileFormat.TFRECORD]

_MASK_DELTA = 0xA282EAD8
_UINT32_MASK = 0xFFFFFFFF
_UINT64_MASK = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_HEADER = struct.Struct("<QI")
_HEADER_BYTES = _HEADER.size  # 12: length + crc of length
_FOOTER_BYTES = _CRC.size  # 4: crc of payload
#: Payloads longer than this are read in pieces, so that a corrupt length field read
#: with check_crc=False cannot make us allocate an absurd buffer up front.
_READ_CHUNK_BYTES = 64 << 20

# Protobuf wire types and the one-byte tags used by tf.train.Example.
_WIRE_VARINT = 0
_WIRE_FIXED64 = 1
_WIRE_LEN = 2
_WIRE_FIXED32 = 5
_TAG_FIELD1_LEN = b"\x0a"  # field 1, length-delimited
_TAG_FIELD2_LEN = b"\x12"  # field 2, length-delimited
_FEATURE_TAGS = {kind: bytes(((number << 3) | _WIRE_LEN,)) for kind, number in _KIND_FIELD.items()}

_SMALL_VARINTS = tuple(bytes((i,)) for i in range(0x80))


class TFRecordCorruptError(ValueError):
    """A TFRecord file is truncated inside a record or fails a CRC check.

    Attributes:
        path: the file (or the file object's name).
        record: index of the damaged record.
        offset: byte offset of that record's header (in the uncompressed stream for gzip).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        record: int | None = None,
        offset: int | None = None,
    ):
        super().__init__(message)
        self.path = path
        self.record = record
        self.offset = offset


# --------------------------------------------------------------------------- CRC + framing


def _crc32c(data: BytesLike) -> int:
    # The C extension parses its argument with "y#", which accepts `bytes` (and NumPy
    # arrays) but refuses memoryview and bytearray; those cost one copy here.
    if type(data) is not bytes:
        data = bytes(data)
    return google_crc32c.value(data)


def masked_crc32c(data: BytesLike) -> int:
    """TFRecord's masked CRC32C of `data`: ``((crc >> 15 | crc << 17) + 0xa282ead8)``."""
    crc = _crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & _UINT32_MASK) + _MASK_DELTA) & _UINT32_MASK


def _as_byte_buffer(value: Any, argument: str) -> BytesLike:
    """`value` as bytes, bytearray or a flat unsigned-byte memoryview, without copying."""
    if isinstance(value, (bytes, bytearray)):
        return value
    if isinstance(value, memoryview):
        if not value.c_contiguous:
            raise ValueError(
                f"`{argument}` must be a C-contiguous buffer. "
                f"Received: a non-contiguous memoryview of shape {value.shape}"
            )
        if value.format != "B" or value.ndim != 1:
            value = value.cast("B")
        return value
    raise TypeError(
        f"`{argument}` must be bytes, bytearray or memoryview. Received: {type(value).__name__}"
    )


def frame_record(payload: BytesLike) -> list[BytesLike]:
    """The pieces of one framed TFRecord: header, `payload` itself (not copied), footer."""
    payload = _as_byte_buffer(payload, "payload")
    length = _LENGTH.pack(len(payload))
    header = length + _CRC.pack(masked_crc32c(length))
    return [header, payload, _CRC.pack(masked_crc32c(payload))]


def _write_all(fileobj: IO[bytes], data: BytesLike) -> None:
    written = fileobj.write(data)
    # Buffered files write everything; a raw file may write less and say so.
    if written is not None and written < len(data):
        view = memoryview(data)
        while written < len(view):
            more = fileobj.write(view[written:])
            if not more:
                raise OSError(f"Short write to {_name_of(fileobj)}: {written} of {len(view)} bytes")
            written += more


def write_record(fileobj: IO[bytes], payload: BytesLike) -> int:
    """Write `payload` as one TFRecord to `fileobj`; returns the number of bytes written."""
    total = 0
    for piece in frame_record(payload):
        _write_all(fileobj, piece)
        total += len(piece)
    return total


class TFRecordWriter:
    """Writes TFRecords to an open binary file object, optionally as one gzip stream.

    `close()` finishes the gzip stream but leaves `fileobj` open: the caller owns it
    (and its fsync/rename). The gzip header carries no file name and mtime 0, so the
    same records give the same bytes. `bytes_written` counts uncompressed bytes.
    """

    def __init__(self, fileobj: IO[bytes], compression: str = "none", *, compresslevel: int = 6):
        if not callable(getattr(fileobj, "write", None)):
            raise TypeError(
                "`fileobj` must be a binary file object open for writing. "
                f"Received: {type(fileobj).__name__}"
            )
        compression = _check_compression(compression)
        if not isinstance(compresslevel, int) or not 0 <= compresslevel <= 9:
            raise ValueError(
                f"`compresslevel` must be an int in [0, 9]. Received: {compresslevel!r}"
            )
        self.compression = compression
        self.bytes_written = 0
        self._fileobj = fileobj
        self._gzip: gzip.GzipFile | None = None
        self._out: IO[bytes] = fileobj
        if compression == "gzip":
            # zlib's default level 6 (TensorFlow's default too); gzip's own default, 9,
            # is several times slower on image bytes for a percent or two.
            self._gzip = gzip.GzipFile(
                fileobj=fileobj, mode="wb", mtime=0, filename="", compresslevel=compresslevel
            )
            self._out = self._gzip
        self._closed = False

    def write(self, payload: BytesLike) -> None:
        if self._closed:
            raise ValueError("TFRecordWriter.write() called after close().")
        self.bytes_written += write_record(self._out, payload)

    def close(self) -> None:
        """Finish the gzip stream (if any) and flush; does not close the file object."""
        if self._closed:
            return
        self._closed = True
        if self._gzip is not None:
            self._gzip.close()  # writes the trailer; never closes a fileobj it was given
        flush = getattr(self._fileobj, "flush", None)
        if flush is not None:
            flush()


# --------------------------------------------------------------------------- Example encoding


@dataclasses.dataclass(frozen=True)
class Feature:
    """A feature whose kind is stated rather than inferred, e.g. ``Feature(INT64_LIST, [])``.

    Needed for empty lists (whose kind cannot be inferred) and to force a kind, such as
    whole numbers stored as floats.
    """

    kind: str
    values: Sequence[Any]

    def __post_init__(self) -> None:
        if self.kind not in _FEATURE_KINDS:
            raise ValueError(
                f"`kind` must be one of {list(_FEATURE_KINDS)}. Received: {self.kind!r}"
            )
        if isinstance(self.values, (str, bytes, bytearray, memoryview)):
            raise TypeError(
                "`values` must be a sequence of values; wrap a single value in a list. "
                f"Received: {type(self.values).__name__}"
            )


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL_VARINTS[value]
    if value < 0:
        value &= _UINT64_MASK  # protobuf writes negative int64 as 10-byte two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _kind_of(value: Any) -> str | None:
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return BYTES_LIST
    if isinstance(value, (int, numbers.Integral)):  # bool too, as TensorFlow accepts
        return INT64_LIST
    if isinstance(value, numbers.Real):
        return FLOAT_LIST
    return None


def _infer_feature(name: str, value: Any) -> tuple[str, Sequence[Any]]:
    kind = _kind_of(value)
    if kind is not None:
        return kind, (value,)
    if isinstance(value, Feature):
        return value.kind, value.values
    if not isinstance(value, Sequence):
        hint = " Pass arrays as arr.tobytes() or arr.tolist()." if hasattr(value, "dtype") else ""
        raise TypeError(
            f"Feature {name!r} must be bytes, str, int, float, a sequence of one of those, "
            f"or a Feature.{hint} Received: {type(value).__name__}"
        )
    if not value:
        raise ValueError(
            f"Feature {name!r} is an empty sequence, whose kind cannot be inferred. Expected "
            f"Feature(INT64_LIST | FLOAT_LIST | BYTES_LIST, []). Received: {value!r}"
        )
    kinds = {_kind_of(item) for item in value}
    if kinds == {INT64_LIST}:
        return INT64_LIST, value
    if kinds <= {INT64_LIST, FLOAT_LIST}:
        return FLOAT_LIST, value
    if kinds == {BYTES_LIST}:
        return BYTES_LIST, value
    types = sorted({type(item).__name__ for item in value})
    raise TypeError(
        f"Feature {name!r} must hold only bytes/str, only ints, or only numbers. "
        f"Received: a {type(value).__name__} of {types}"
    )


def _encode_bytes_list(name: str, values: Sequence[Any], parts: list[BytesLike]) -> int:
    """Append the BytesList body to `parts`; returns its length."""
    size = 0
    for item in values:
        if isinstance(item, str):
            item = item.encode("utf-8")
        else:
            try:
                item = _as_byte_buffer(item, f"features[{name!r}]")
            except TypeError:
                raise TypeError(
                    f"Feature {name!r} of kind {BYTES_LIST!r} must hold bytes or str. "
                    f"Received: {type(item).__name__}"
                ) from None
        prefix = _TAG_FIELD1_LEN + _varint(len(item))
        parts.append(prefix)
        parts.append(item)
        size += len(prefix) + len(item)
    return size


def _encode_int64_list(name: str, values: Sequence[Any], parts: list[BytesLike]) -> int:
    if len(values) == 0:
        return 0
    encoded = []
    for item in values:
        if not isinstance(item, (int, numbers.Integral)):
            raise TypeError(
                f"Feature {name!r} of kind {INT64_LIST!r} must hold ints. "
                f"Received: {type(item).__name__}"
            )
        item = int(item)
        if not _INT64_MIN <= item <= _INT64_MAX:
            raise ValueError(
                f"Feature {name!r} holds a value outside the int64 range. Received: {item}"
            )
        encoded.append(_varint(item))
    packed = b"".join(encoded)
    prefix = _TAG_FIELD1_LEN + _varint(len(packed))
    parts.append(prefix)
    parts.append(packed)
    return len(prefix) + len(packed)


def _pack_float32(values: list[float]) -> bytes:
    try:
        return struct.pack(f"<{len(values)}f", *values)
    except OverflowError:
        # struct refuses what C's (float) cast, used by protobuf, rounds to +-inf.
        out = []
        for value in values:
            try:
                out.append(struct.pack("<f", value))
            except OverflowError:
                out.append(struct.pack("<f", float("inf") if value > 0 else float("-inf")))
        return b"".join(out)


def _encode_float_list(name: str, values: Sequence[Any], parts: list[BytesLike]) -> int:
    if len(values) == 0:
        return 0
    floats = []
    for item in values:
        if not isinstance(item, (float, int, numbers.Real)):
            raise TypeError(
                f"Feature {name!r} of kind {FLOAT_LIST!r} must hold numbers. "
                f"Received: {type(item).__name__}"
            )
        floats.append(float(item))
    packed = _pack_float32(floats)
    prefix = _TAG_FIELD1_LEN + _varint(len(packed))
    parts.append(prefix)
    parts.append(packed)
    return len(prefix) + len(packed)


_ENCODERS = {
    BYTES_LIST: _encode_bytes_list,
    FLOAT_LIST: _encode_float_list,
    INT64_LIST: _encode_int64_list,
}


def _map_entry_order(entry: tuple[bytes, str]) -> bytes:
    """Sort key giving the map entry order of ``SerializeToString(deterministic=True)``.

    upb, the protobuf runtime of current TensorFlow, emits entries by key bytes
    ascending except that a key comes AFTER the keys it is a prefix of ("aa", "ab",
    "a", ..., ""); the pure-Python and C++ runtimes put the prefix first. The two agree
    unless one feature name is a prefix of another, as none of imgshard's are. Appending
    0xFF, a byte UTF-8 never contains, reproduces upb's order with a plain bytes sort.
    """
    return entry[0] + b"\xff"


def encode_example(features: Mapping[str, Any]) -> bytes:
    """Serialize `features` as a ``tf.train.Example``, byte-identical to TensorFlow's
    ``SerializeToString(deterministic=True)``.

    Values: bytes-like or str (a one-element bytes_list; str as UTF-8), int (int64_list),
    float (float_list), a non-empty list/tuple of one of those, or a `Feature` (needed for
    empty lists). Big byte strings are copied once, into the returned bytes.
    """
    if not isinstance(features, Mapping):
        raise TypeError(
            f"`features` must be a mapping of feature name to value. "
            f"Received: {type(features).__name__}"
        )
    encoded_keys = []
    for name in features:
        if not isinstance(name, str):
            raise TypeError(f"Feature names must be str. Received: {name!r}")
        encoded_keys.append((name.encode("utf-8"), name))
    encoded_keys.sort(key=_map_entry_order)

    body: list[BytesLike] = []
    features_size = 0
    for key_bytes, name in encoded_keys:
        kind, values = _infer_feature(name, features[name])
        list_parts: list[BytesLike] = []
        list_size = _ENCODERS[kind](name, values, list_parts)
        # Feature { <kind> = N: list }
        feature_head = _FEATURE_TAGS[kind] + _varint(list_size)
        feature_size = len(feature_head) + list_size
        # map entry { key = 1: name; value = 2: Feature }
        entry_tail = (
            _TAG_FIELD1_LEN
            + _varint(len(key_bytes))
            + key_bytes
            + _TAG_FIELD2_LEN
            + _varint(feature_size)
            + feature_head
        )
        entry_size = len(entry_tail) + list_size
        entry_head = _TAG_FIELD1_LEN + _varint(entry_size)
        body.append(entry_head + entry_tail)
        body.extend(list_parts)
        features_size += len(entry_head) + entry_size
    # Example { features = 1: Features { feature = 1: entry, ... } }
    body.insert(0, _TAG_FIELD1_LEN + _varint(features_size))
    return b"".join(body)


# --------------------------------------------------------------------------- Example decoding


class _DecodeError(Exception):
    pass


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise _DecodeError(f"truncated varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _UINT64_MASK, pos
        shift += 7
        if shift >= 70:
            raise _DecodeError(f"varint longer than 10 bytes ending at byte {pos}")


def _iter_fields(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
    """Yield (field number, wire type, value) of one message: value is an int for varints
    and a memoryview slice for the other wire types."""
    pos = 0
    end = len(buf)
    while pos < end:
        tag, pos = _read_varint(buf, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise _DecodeError(f"field number 0 at byte {pos}")
        if wire_type == _WIRE_VARINT:
            value, pos = _read_varint(buf, pos)
            yield number, wire_type, value
            continue
        if wire_type == _WIRE_LEN:
            size, pos = _read_varint(buf, pos)
        elif wire_type == _WIRE_FIXED32:
            size = 4
        elif wire_type == _WIRE_FIXED64:
            size = 8
        else:
            raise _DecodeError(f"unsupported wire type {wire_type} at byte {pos}")
        if pos + size > end:
            raise _DecodeError(f"field {number} of {size} bytes runs past the end at byte {pos}")
        yield number, wire_type, buf[pos : pos + size]
        pos += size


def _expect_len(number: int, wire_type: int, what: str) -> None:
    if wire_type != _WIRE_LEN:
        raise _DecodeError(f"{what} (field {number}) has wire type {wire_type}, expected 2")


def _to_int64(value: int) -> int:
    return value - (1 << 64) if value > _INT64_MAX else value


def _decode_list(kind: str, buf: memoryview) -> list[Any]:
    values: list[Any] = []
    for number, wire_type, value in _iter_fields(buf):
        if number != 1:
            continue  # unknown field
        if kind == BYTES_LIST:
            _expect_len(number, wire_type, "BytesList.value")
            values.append(bytes(value))
        elif kind == INT64_LIST:
            if wire_type == _WIRE_VARINT:  # unpacked
                values.append(_to_int64(value))
            elif wire_type == _WIRE_LEN:  # packed
                pos = 0
                while pos < len(value):
                    item, pos = _read_varint(value, pos)
                    values.append(_to_int64(item))
            else:
                raise _DecodeError(f"Int64List.value has wire type {wire_type}")
        else:
            if wire_type == _WIRE_FIXED32:  # unpacked
                values.append(struct.unpack("<f", value)[0])
            elif wire_type == _WIRE_LEN:  # packed
                if len(value) % 4:
                    raise _DecodeError(f"packed FloatList of {len(value)} bytes")
                values.extend(struct.unpack(f"<{len(value) // 4}f", value))
            else:
                raise _DecodeError(f"FloatList.value has wire type {wire_type}")
    return values


def _decode_feature(buf: memoryview) -> list[Any]:
    kind: str | None = None
    values: list[Any] = []
    for number, wire_type, value in _iter_fields(buf):
        field_kind = _FIELD_KIND.get(number)
        if field_kind is None:
            continue  # unknown field
        _expect_len(number, wire_type, field_kind)
        decoded = _decode_list(field_kind, value)
        if field_kind == kind:
            values.extend(decoded)  # a repeated message field merges
        else:
            kind, values = field_kind, decoded  # a oneof keeps the last member set
    return values


def _decode_features(buf: memoryview, out: dict[str, list[Any]]) -> None:
    for number, wire_type, entry in _iter_fields(buf):
        if number != 1:
            continue
        _expect_len(number, wire_type, "Features.feature")
        key = ""
        values: list[Any] = []
        for entry_number, entry_wire_type, value in _iter_fields(entry):
            if entry_number == 1:
                _expect_len(entry_number, entry_wire_type, "map key")
                try:
                    key = str(value, "utf-8")
                except UnicodeDecodeError as e:
                    raise _DecodeError(f"feature name is not UTF-8: {bytes(value)!r}") from e
            elif entry_number == 2:
                _expect_len(entry_number, entry_wire_type, "map value")
                values = _decode_feature(value)
        out[key] = values  # a later entry for the same key replaces the earlier one


def decode_example(data: BytesLike) -> dict[str, list[Any]]:
    """Parse a serialized ``tf.train.Example`` into ``{name: [bytes...] | [int...] | [float...]}``.

    Accepts packed and unpacked int64/float lists; unknown fields are skipped. Floats come
    back as Python floats holding the stored float32 values.
    """
    try:
        buf = _as_byte_buffer(data, "data")
    except TypeError as e:
        raise TypeError(
            f"`data` must be a serialized tf.train.Example (bytes). Received: {type(data).__name__}"
        ) from e
    view = memoryview(buf)
    out: dict[str, list[Any]] = {}
    try:
        for number, wire_type, value in _iter_fields(view):
            if number == 1:
                _expect_len(number, wire_type, "Example.features")
                _decode_features(value, out)
    except _DecodeError as e:
        raise ValueError(
            f"`data` is not a valid serialized tf.train.Example: {e}. "
            f"Received: {len(view)} bytes starting {bytes(view[:16])!r}"
        ) from e
    return out


# --------------------------------------------------------------------------- reading files


def _check_compression(compression: str) -> str:
    if compression not in _COMPRESSIONS:
        raise ValueError(
            f"`compression` must be one of {list(_COMPRESSIONS)}. Received: {compression!r}"
        )
    return compression


def _name_of(fileobj: Any) -> str:
    name = getattr(fileobj, "name", None)
    if isinstance(name, (str, bytes, os.PathLike)):
        return os.fsdecode(name)
    return repr(fileobj)


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    """Read `size` bytes, or fewer only at end of file."""
    data = stream.read(min(size, _READ_CHUNK_BYTES))
    if data is None:
        data = b""
    if len(data) == size or not data:
        return data
    chunks = [data]
    got = len(data)
    while got < size:
        more = stream.read(min(size - got, _READ_CHUNK_BYTES))
        if not more:
            break
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)


class _RecordReader:
    """Reads framed records from an uncompressed byte stream, tracking index and offset."""

    def __init__(self, stream: IO[bytes], name: str, compression: str, check_crc: bool):
        self.stream = stream
        self.name = name
        self.check_crc = check_crc
        self.where = "uncompressed byte offset" if compression == "gzip" else "byte offset"
        self.index = 0
        self.offset = 0

    def corrupt(self, problem: str) -> TFRecordCorruptError:
        return TFRecordCorruptError(
            f"Corrupt TFRecord file {self.name!r}: record {self.index} at "
            f"{self.where} {self.offset}: {problem}.",
            path=self.name,
            record=self.index,
            offset=self.offset,
        )

    def read_header(self) -> int | None:
        """The payload length of the next record, or None at a clean end of file."""
        header = _read_exact(self.stream, _HEADER_BYTES)
        if not header:
            return None
        if len(header) < _HEADER_BYTES:
            raise self.corrupt(
                f"truncated header, expected {_HEADER_BYTES} bytes, got {len(header)}"
            )
        length, length_crc = _HEADER.unpack(header)
        if self.check_crc and masked_crc32c(header[:8]) != length_crc:
            raise self.corrupt("length CRC mismatch")
        return length

    def __iter__(self) -> Iterator[bytes]:
        while True:
            length = self.read_header()
            if length is None:
                return
            payload = _read_exact(self.stream, length)
            if len(payload) < length:
                raise self.corrupt(
                    f"truncated payload, expected {length} bytes, got {len(payload)}"
                )
            footer = _read_exact(self.stream, _FOOTER_BYTES)
            if len(footer) < _FOOTER_BYTES:
                raise self.corrupt(
                    f"truncated data CRC, expected {_FOOTER_BYTES} bytes, got {len(footer)}"
                )
            if self.check_crc and masked_crc32c(payload) != _CRC.unpack(footer)[0]:
                raise self.corrupt(f"data CRC mismatch in a payload of {length} bytes")
            yield payload
            self.index += 1
            self.offset += _HEADER_BYTES + length + _FOOTER_BYTES


def _check_source(path_or_fileobj: Any) -> None:
    if isinstance(path_or_fileobj, (str, os.PathLike)):
        return
    if not callable(getattr(path_or_fileobj, "read", None)):
        raise TypeError(
            "`path_or_fileobj` must be a path or a binary file object open for reading. "
            f"Received: {type(path_or_fileobj).__name__}"
        )


def _open_source(path_or_fileobj: PathOrFile) -> tuple[IO[bytes], str, bool]:
    """(stream, name for messages, whether we opened it and must close it)."""
    if isinstance(path_or_fileobj, (str, os.PathLike)):
        path = os.fspath(path_or_fileobj)
        from readers.files import open_regular_file

        return open_regular_file(path), os.fsdecode(path), True
    return path_or_fileobj, _name_of(path_or_fileobj), False  # type: ignore[return-value]


def iter_records(
    path_or_fileobj: PathOrFile, *, compression: str = "none", check_crc: bool = True
) -> Iterator[bytes]:
    """Yield the payload of each record of a TFRecord file.

    Raises `TFRecordCorruptError` naming the file, the record index and its byte offset
    (in the uncompressed stream for gzip) when the file ends inside a record, a CRC does
    not match (with `check_crc`), or the gzip stream is damaged. A file cut exactly at a
    record boundary reads as a shorter valid file. Arguments are checked when called;
    the file is opened on the first ``next()``.
    """
    compression = _check_compression(compression)
    _check_source(path_or_fileobj)
    return _iter_records(path_or_fileobj, compression, check_crc)


def _iter_records(
    path_or_fileobj: PathOrFile, compression: str, check_crc: bool
) -> Iterator[bytes]:
    source, name, owned = _open_source(path_or_fileobj)
    try:
        stream: IO[bytes] = source
        if compression == "gzip":
            stream = gzip.GzipFile(fileobj=source, mode="rb")  # never closes `source`
        reader = _RecordReader(stream, name, compression, check_crc)
        try:
            yield from reader
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise reader.corrupt(f"damaged gzip stream ({e})") from e
        finally:
            if stream is not source:
                stream.close()
    finally:
        if owned:
            source.close()


def count_records(
    path_or_fileobj: PathOrFile, compression: str = "none", check_crc: bool = False
) -> int:
    """Number of records in a TFRecord file, raising `TFRecordCorruptError` like `iter_records`.

    Uncompressed without `check_crc`, reads only the 12-byte headers and seeks past the
    payloads.
    """
    compression = _check_compression(compression)
    _check_source(path_or_fileobj)
    if compression == "gzip" or check_crc:
        records = iter_records(path_or_fileobj, compression=compression, check_crc=check_crc)
        return sum(1 for _ in records)
    source, name, owned = _open_source(path_or_fileobj)
    try:
        if not (callable(getattr(source, "seekable", None)) and source.seekable()):
            return sum(1 for _ in _RecordReader(source, name, compression, check_crc=False))
        start = source.tell()
        size = source.seek(0, io.SEEK_END) - start
        source.seek(start)
        reader = _RecordReader(source, name, compression, check_crc=False)
        while True:
            length = reader.read_header()
            if length is None:
                return reader.index
            payload_end = reader.offset + _HEADER_BYTES + length
            if payload_end > size:
                raise reader.corrupt(
                    f"truncated payload, expected {length} bytes, "
                    f"got {size - reader.offset - _HEADER_BYTES}"
                )
            if payload_end + _FOOTER_BYTES > size:
                raise reader.corrupt(
                    f"truncated data CRC, expected {_FOOTER_BYTES} bytes, got {size - payload_end}"
                )
            source.seek(length + _FOOTER_BYTES, io.SEEK_CUR)
            reader.index += 1
            reader.offset = payload_end + _FOOTER_BYTES
    finally:
        if owned:
            source.close()


if __name__ == "__main__":
    # Throughput of encode_example + write_record on 1 MB images, the converter's hot path:
    #   python -m readers.formats.tfrecord.wire
    import time

    image = os.urandom(1 << 20)
    rounds = 500
    with open(os.devnull, "wb") as sink:
        started = time.perf_counter()
        for i in range(rounds):
            payload = encode_example(
                {"image": image, "height": 512, "width": 683, "key": f"train/{i:05d}.png"}
            )
            write_record(sink, payload)
        seconds = time.perf_counter() - started
    print(
        f"encode_example + write_record: {rounds * len(image) / seconds / 1e6:.0f} MB/s "
        f"({seconds / rounds * 1e6:.0f} us per 1 MiB record; "
        f"google_crc32c implementation: {google_crc32c.implementation})"
    )
