"""Tests for `readers.formats.tfrecord.wire`: bytes identical to TensorFlow's, both ways."""

from __future__ import annotations

import ast
import gzip
import io
import struct
from pathlib import Path

import numpy as np
import pytest

from readers.formats.tfrecord import wire
from readers.formats.tfrecord.wire import (
    BYTES_LIST,
    FLOAT_LIST,
    INT64_LIST,
    Feature,
    TFRecordCorruptError,
    TFRecordWriter,
    count_records,
    decode_example,
    encode_example,
    frame_record,
    iter_records,
    masked_crc32c,
    write_record,
)


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def _image(seed: int = 0, shape: tuple[int, ...] = (64, 48, 3)) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8).tobytes()


def _sample(i: int) -> dict:
    return {"image": _image(i), "key": f"train/{i:04d}.png", "height": 64, "width": 48}


def _tf_example(tf, features: dict) -> bytes:
    """The same features built with tf.train, values given as (kind, list)."""
    make = {
        BYTES_LIST: lambda v: tf.train.Feature(bytes_list=tf.train.BytesList(value=v)),
        FLOAT_LIST: lambda v: tf.train.Feature(float_list=tf.train.FloatList(value=v)),
        INT64_LIST: lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=v)),
    }
    feature = {name: make[kind](values) for name, (kind, values) in features.items()}
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString(deterministic=True)


def _tf_sample(tf, i: int) -> bytes:
    s = _sample(i)
    return _tf_example(
        tf,
        {
            "image": (BYTES_LIST, [s["image"]]),
            "key": (BYTES_LIST, [s["key"].encode()]),
            "height": (INT64_LIST, [s["height"]]),
            "width": (INT64_LIST, [s["width"]]),
        },
    )


def _write_ours(path: Path, n: int, compression: str = "none") -> None:
    with open(path, "wb") as f:
        writer = TFRecordWriter(f, compression)
        for i in range(n):
            writer.write(encode_example(_sample(i)))
        writer.close()


def _write_tf(tf, path: Path, n: int, options: str | None = None) -> None:
    with tf.io.TFRecordWriter(str(path), options=options) as writer:
        for i in range(n):
            writer.write(_tf_sample(tf, i))


# --------------------------------------------------------------------------- encode_example


def test_example_bytes_match_tf_for_image_record(tf):
    assert encode_example(_sample(0)) == _tf_sample(tf, 0)


def test_example_bytes_match_tf_for_large_payload(tf):
    big = _image(1, (2**21 + 4097,))  # lengths need 3-byte varints at every nesting level
    ours = encode_example({"image": memoryview(big), "label": 7})
    assert ours == _tf_example(tf, {"image": (BYTES_LIST, [big]), "label": (INT64_LIST, [7])})


def test_example_bytes_match_tf_for_negative_and_extreme_ints(tf):
    values = [-1, -(2**63), 2**63 - 1, 0, 127, 128, 300, -300]
    ours = encode_example({"ints": values, "neg": -5, "flag": True})
    theirs = _tf_example(
        tf,
        {"ints": (INT64_LIST, values), "neg": (INT64_LIST, [-5]), "flag": (INT64_LIST, [1])},
    )
    assert ours == theirs


def test_example_bytes_match_tf_for_empty_lists(tf):
    ours = encode_example(
        {"b": Feature(BYTES_LIST, []), "f": Feature(FLOAT_LIST, []), "i": Feature(INT64_LIST, [])}
    )
    theirs = _tf_example(tf, {"b": (BYTES_LIST, []), "f": (FLOAT_LIST, []), "i": (INT64_LIST, [])})
    assert ours == theirs


def test_example_bytes_match_tf_for_empty_example(tf):
    assert encode_example({}) == _tf_example(tf, {})


def test_example_bytes_match_tf_for_unicode_keys(tf):
    names = ["key", "Z", "é", "ﬀ", "\U0001f600", "a b", "ü/ß", "\x7f", "\x80"]
    ours = encode_example({name: name for name in names})
    theirs = _tf_example(tf, {name: (BYTES_LIST, [name.encode()]) for name in names})
    assert ours == theirs


def test_example_bytes_match_tf_for_prefix_keys(tf):
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() != "upb":
        pytest.skip("map order of prefix keys is pinned for the upb protobuf runtime only")
    names = ["a", "aa", "ab", "a b", "", "b", "é", "éa"]  # upb puts "aa", "ab" before "a"
    ours = encode_example({name: len(name) for name in names})
    theirs = _tf_example(tf, {name: (INT64_LIST, [len(name)]) for name in names})
    assert ours == theirs


def test_example_bytes_match_tf_for_floats_and_byte_lists(tf):
    floats = [0.1, -2.5, 3, 1e39, -1e39, float("inf"), 1e-50]
    blobs = [b"", b"\x00\xff" * 100, "ünïcode"]
    ours = encode_example({"f": floats, "one": 0.5, "blobs": blobs, "ba": bytearray(b"xyz")})
    theirs = _tf_example(
        tf,
        {
            "f": (FLOAT_LIST, floats),
            "one": (FLOAT_LIST, [0.5]),
            "blobs": (BYTES_LIST, [b"", b"\x00\xff" * 100, "ünïcode".encode()]),
            "ba": (BYTES_LIST, [b"xyz"]),
        },
    )
    assert ours == theirs


def test_example_with_numpy_scalars_matches_python_scalars():
    assert encode_example({"h": np.int64(5), "x": np.float32(0.5)}) == encode_example(
        {"h": 5, "x": 0.5}
    )


def test_empty_sequence_without_kind_raises():
    with pytest.raises(ValueError, match="Received: \\[\\]"):
        encode_example({"labels": []})


def test_mixed_sequence_raises():
    with pytest.raises(TypeError, match="'mixed'"):
        encode_example({"mixed": [1, b"x"]})


def test_int_outside_int64_raises():
    with pytest.raises(ValueError, match=f"Received: {2**63}"):
        encode_example({"big": 2**63})


def test_non_str_feature_name_raises():
    with pytest.raises(TypeError, match="Received: b'image'"):
        encode_example({b"image": b"x"})


def test_numpy_array_value_raises_with_hint():
    with pytest.raises(TypeError, match="tobytes"):
        encode_example({"image": np.zeros((2, 2), np.uint8)})


def test_unknown_feature_kind_raises():
    with pytest.raises(ValueError, match="Received: 'int32_list'"):
        Feature("int32_list", [1])


# --------------------------------------------------------------------------- framing and writer


def test_masked_crc32c_known_value():
    crc = 0xE3069283  # CRC32C("123456789"), the standard check value
    expected = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    assert masked_crc32c(b"123456789") == expected
    assert masked_crc32c(memoryview(b"123456789")) == expected
    assert masked_crc32c(bytearray(b"123456789")) == expected


def test_frame_record_keeps_payload_uncopied():
    payload = _image(2)
    header, body, footer = frame_record(payload)
    assert body is payload
    assert struct.unpack("<QI", header) == (len(payload), masked_crc32c(header[:8]))
    assert struct.unpack("<I", footer)[0] == masked_crc32c(payload)


def test_write_record_returns_bytes_written():
    out = io.BytesIO()
    assert write_record(out, b"abc") == 16 + 3
    assert write_record(out, b"") == 16
    assert len(out.getvalue()) == 35


def test_file_identical_to_tf_writer(tf, tmp_path):
    ours, theirs = tmp_path / "ours.tfrecord", tmp_path / "tf.tfrecord"
    _write_ours(ours, 5)
    _write_tf(tf, theirs, 5)
    assert ours.read_bytes() == theirs.read_bytes()


def test_writer_counts_uncompressed_bytes_and_leaves_file_open():
    out = io.BytesIO()
    writer = TFRecordWriter(out, "gzip")
    writer.write(b"x" * 1000)
    writer.close()
    assert writer.bytes_written == 1016
    assert not out.closed
    assert gzip.decompress(out.getvalue())[12:1012] == b"x" * 1000


def test_gzip_writer_is_deterministic():
    def write() -> bytes:
        out = io.BytesIO()
        writer = TFRecordWriter(out, "gzip")
        writer.write(encode_example(_sample(0)))
        writer.close()
        return out.getvalue()

    first = write()
    assert first == write()
    assert first[4:8] == b"\x00\x00\x00\x00"  # mtime 0
    assert not first[3] & 0x08  # FLG.FNAME unset: no file name stored


def test_writer_write_after_close_raises():
    writer = TFRecordWriter(io.BytesIO())
    writer.close()
    with pytest.raises(ValueError, match="after close"):
        writer.write(b"x")


def test_writer_unknown_compression_raises():
    with pytest.raises(ValueError, match="Received: 'zlib'"):
        TFRecordWriter(io.BytesIO(), "zlib")


def test_module_does_not_import_tensorflow():
    tree = ast.parse(Path(wire.__file__).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not {name for name in imported if name.split(".")[0] in {"tensorflow", "keras"}}


# --------------------------------------------------------------------------- reading


def test_iter_records_reads_tf_written_file(tf, tmp_path):
    path = tmp_path / "tf.tfrecord"
    _write_tf(tf, path, 4)
    assert list(iter_records(path)) == [_tf_sample(tf, i) for i in range(4)]


def test_iter_records_reads_tf_written_gzip_file(tf, tmp_path):
    path = tmp_path / "tf.tfrecord.gz"
    _write_tf(tf, path, 4, options="GZIP")
    assert list(iter_records(path, compression="gzip")) == [_tf_sample(tf, i) for i in range(4)]


def test_tf_reads_our_gzip_file(tf, tmp_path):
    path = tmp_path / "ours.tfrecord"
    _write_ours(path, 4, compression="gzip")
    read = [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type="GZIP")]
    assert read == [encode_example(_sample(i)) for i in range(4)]


def test_iter_records_reads_file_object(tmp_path):
    path = tmp_path / "ours.tfrecord"
    _write_ours(path, 3)
    with open(path, "rb") as f:
        assert list(iter_records(f)) == [encode_example(_sample(i)) for i in range(3)]
        assert not f.closed


def test_iter_records_empty_file_yields_nothing(tmp_path):
    path = tmp_path / "empty.tfrecord"
    path.write_bytes(b"")
    assert list(iter_records(path)) == []
    assert count_records(path) == 0


def _record_size(i: int) -> int:
    return 16 + len(encode_example(_sample(i)))


def test_truncated_payload_names_file(tmp_path):
    path = tmp_path / "cut.tfrecord"
    _write_ours(path, 3)
    data = path.read_bytes()
    cut = _record_size(0) + 12 + 100  # inside the payload of record 1
    path.write_bytes(data[:cut])
    with pytest.raises(TFRecordCorruptError, match="truncated payload") as info:
        list(iter_records(path))
    assert str(path) in str(info.value)
    assert (info.value.record, info.value.offset) == (1, _record_size(0))
    assert f"byte offset {_record_size(0)}" in str(info.value)


def test_truncated_header_names_file(tmp_path):
    path = tmp_path / "cut.tfrecord"
    _write_ours(path, 3)
    data = path.read_bytes()
    path.write_bytes(data[: _record_size(0) + _record_size(1) + 5])
    with pytest.raises(TFRecordCorruptError, match="truncated header") as info:
        list(iter_records(path))
    assert str(path) in str(info.value)
    assert info.value.record == 2


def test_truncated_data_crc_names_file(tmp_path):
    path = tmp_path / "cut.tfrecord"
    _write_ours(path, 1)
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(TFRecordCorruptError, match="truncated data CRC") as info:
        list(iter_records(path, check_crc=False))
    assert str(path) in str(info.value)


def test_cut_at_record_boundary_is_not_detected(tmp_path):
    path = tmp_path / "cut.tfrecord"
    _write_ours(path, 3)
    path.write_bytes(path.read_bytes()[: _record_size(0)])
    assert len(list(iter_records(path))) == 1  # the manifest's record count catches this


def test_flipped_payload_byte_raises(tmp_path):
    path = tmp_path / "flip.tfrecord"
    _write_ours(path, 2)
    data = bytearray(path.read_bytes())
    data[_record_size(0) + 12 + 500] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(TFRecordCorruptError, match="data CRC mismatch") as info:
        list(iter_records(path))
    assert str(path) in str(info.value)
    assert info.value.record == 1
    assert len(list(iter_records(path, check_crc=False))) == 2


def test_flipped_length_byte_raises(tmp_path):
    path = tmp_path / "flip.tfrecord"
    _write_ours(path, 1)
    data = bytearray(path.read_bytes())
    data[2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(TFRecordCorruptError, match="length CRC mismatch"):
        list(iter_records(path))


def test_truncated_gzip_file_raises(tmp_path):
    path = tmp_path / "cut.tfrecord.gz"
    _write_ours(path, 3, compression="gzip")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TFRecordCorruptError) as info:
        list(iter_records(path, compression="gzip"))
    assert str(path) in str(info.value)
    assert "uncompressed byte offset" in str(info.value)


def test_iter_records_unknown_compression_raises_when_called(tmp_path):
    with pytest.raises(ValueError, match="Received: 'GZIP'"):
        iter_records(tmp_path / "x", compression="GZIP")


def test_iter_records_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.tfrecord"):
        list(iter_records(tmp_path / "missing.tfrecord"))


# --------------------------------------------------------------------------- count_records


def test_count_records(tf, tmp_path):
    plain, gz = tmp_path / "tf.tfrecord", tmp_path / "tf.tfrecord.gz"
    _write_tf(tf, plain, 7)
    _write_tf(tf, gz, 7, options="GZIP")
    assert count_records(plain) == 7
    assert count_records(plain, check_crc=True) == 7
    assert count_records(gz, compression="gzip") == 7
    with open(plain, "rb") as f:
        assert count_records(f) == 7


def test_count_records_truncated_payload_names_file(tmp_path):
    path = tmp_path / "cut.tfrecord"
    _write_ours(path, 3)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(TFRecordCorruptError, match="truncated payload") as info:
        count_records(path)
    assert str(path) in str(info.value)
    assert info.value.record == 2


# --------------------------------------------------------------------------- decode_example


def test_decode_example_round_trip_tf_serialized(tf):
    features = {
        "image": (BYTES_LIST, [_image(3)]),
        "key": (BYTES_LIST, ["ünï/0001.png".encode()]),
        "height": (INT64_LIST, [64]),
        "ints": (INT64_LIST, [-1, -(2**63), 2**63 - 1, 300]),
        "floats": (FLOAT_LIST, [0.5, -2.25, 2.0**100]),  # exact in float32
        "empty": (FLOAT_LIST, []),
        "é": (BYTES_LIST, [b"", b"a"]),
    }
    decoded = decode_example(_tf_example(tf, features))
    assert decoded == {name: list(values) for name, (_, values) in features.items()}


def test_decode_example_round_trip_ours():
    sample = _sample(4)
    assert decode_example(encode_example(sample)) == {
        "image": [sample["image"]],
        "key": [sample["key"].encode()],
        "height": [64],
        "width": [48],
    }


def test_decode_example_reads_unpacked_lists(tf):
    # Int64List {value: -2, value: 5} and FloatList {value: 1.5, value: 2} written unpacked.
    ints = b"\x08" + b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01" + b"\x08\x05"
    floats = b"\x0d" + struct.pack("<f", 1.5) + b"\x0d" + struct.pack("<f", 2.0)

    def entry(name: bytes, tag: bytes, body: bytes) -> bytes:
        feature = tag + bytes([len(body)]) + body
        entry = b"\x0a" + bytes([len(name)]) + name + b"\x12" + bytes([len(feature)]) + feature
        return b"\x0a" + bytes([len(entry)]) + entry

    features = entry(b"i", b"\x1a", ints) + entry(b"f", b"\x12", floats)
    data = b"\x0a" + bytes([len(features)]) + features
    expected = {"i": [-2, 5], "f": [1.5, 2.0]}
    assert decode_example(data) == expected
    parsed = tf.train.Example.FromString(data).features.feature  # TF agrees
    assert list(parsed["i"].int64_list.value) == expected["i"]
    assert list(parsed["f"].float_list.value) == expected["f"]


def test_decode_example_malformed_raises():
    data = encode_example(_sample(0))
    with pytest.raises(ValueError, match="not a valid serialized tf.train.Example"):
        decode_example(data[:-10])
    with pytest.raises(ValueError, match="varint"):
        decode_example(b"\x0a\xff")


def test_decode_example_wrong_type_raises():
    with pytest.raises(TypeError, match="Received: str"):
        decode_example("not bytes")
