"""The fast PNG path (ISA-L inflate + C unfilter) against Pillow.

PNGs are written here by a small encoder that picks the row filter itself, so every
filter type (None, Sub, Up, Average, Paeth) is exercised for every pixel layout, on
textured pixels; Pillow's decoder is the reference.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from converter.testing import synth
from converter.transform import decode, png
from converter.transform.colormap import AMBIGUOUS, UNKNOWN, ColorMap
from converter.transform.decode import DecodeError, SourceFile, decode_image, decode_mask
from readers.manifest import ClassInfo

needs_fast = pytest.mark.skipif(not png.available(), reason="the _pngrows extension is not built (no C compiler)")

_CTYPE = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type


def _paeth(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    a, b, c = (x.astype(np.int16) for x in (a, b, c))
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c)).astype(np.uint8)


def _filter_row(kind: int, row: np.ndarray, prior: np.ndarray, bpp: int) -> np.ndarray:
    left = np.concatenate([np.zeros(bpp, np.uint8), row[:-bpp]])
    upleft = np.concatenate([np.zeros(bpp, np.uint8), prior[:-bpp]])
    if kind == 0:
        pred = np.zeros_like(row)
    elif kind == 1:
        pred = left
    elif kind == 2:
        pred = prior
    elif kind == 3:
        pred = ((left.astype(np.uint16) + prior) >> 1).astype(np.uint8)
    else:
        pred = _paeth(left, prior, upleft)
    return (row - pred).astype(np.uint8)


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _pack_bits(samples: np.ndarray, depth: int) -> np.ndarray:
    """(H, W) samples < 2**depth -> (H, ceil(W * depth / 8)) bytes, first pixel in the high bits, rows padded with 0."""
    h, w = samples.shape
    per_byte = 8 // depth
    padded = np.zeros((h, -(-w // per_byte) * per_byte), np.uint8)
    padded[:, :w] = samples
    groups = padded.reshape(h, -1, per_byte).astype(np.uint16)
    shifts = np.arange(8 - depth, -1, -depth, dtype=np.uint16)
    return (groups << shifts).sum(axis=2).astype(np.uint8)


def encode_png(pixels: np.ndarray, filters: list[int], *, palette: bytes | None = None, idat_parts: int = 1,
               interlace: int = 0, extra_chunks: list[tuple[bytes, bytes]] = (), depth: int = 8) -> bytes:
    """A PNG of `pixels` ((H, W) or (H, W, C)) with row y filtered by filters[y % len].

    `depth` < 8 (one channel only): samples are packed that many bits each, and the
    filters work on the packed bytes (one byte per "pixel"), as PNG defines."""
    arr = pixels if pixels.ndim == 3 else pixels[:, :, None]
    h, w, c = arr.shape
    ctype = 3 if palette is not None else _CTYPE[c]
    flat = arr.reshape(h, w * c) if depth == 8 else _pack_bits(arr[:, :, 0], depth)
    bpp = c if depth == 8 else 1
    prior = np.zeros(flat.shape[1], np.uint8)
    raw = bytearray()
    for y in range(h):
        kind = filters[y % len(filters)]
        raw.append(kind)
        raw += _filter_row(kind, flat[y], prior, bpp).tobytes()
        prior = flat[y]
    z = zlib.compress(bytes(raw), 6)
    step = -(-len(z) // idat_parts)
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, interlace))
    for kind, payload in extra_chunks:
        out += _chunk(kind, payload)
    if palette is not None:
        out += _chunk(b"PLTE", palette)
    for i in range(0, len(z), step):
        out += _chunk(b"IDAT", z[i:i + step])
    return out + _chunk(b"IEND", b"")


def _textured(h: int, w: int, channels: int, seed: int) -> np.ndarray:
    rgb = synth.textured_image(h, w, np.random.default_rng(seed))
    if channels == 1:
        return rgb[:, :, 1].copy()
    if channels == 4:
        alpha = np.random.default_rng(seed + 1).integers(0, 256, (h, w, 1), dtype=np.uint8)
        return np.concatenate([rgb, alpha], axis=2)
    return rgb


def _src(data: bytes, name: str = "x.png") -> SourceFile:
    return SourceFile(name, data, None)  # type: ignore[arg-type]


def _pillow(data: bytes, mode: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert(mode))


FILTER_MIXES = [[0], [1], [2], [3], [4], [4, 3, 2, 1, 0, 2, 4]]


@needs_fast
@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("filters", FILTER_MIXES, ids=lambda f: "f" + "".join(map(str, f)))
def test_fast_path_equals_pillow_for_every_filter_and_layout(channels: int, filters: list[int]) -> None:
    pixels = _textured(23, 37, channels, seed=channels * 10 + len(filters))
    data = encode_png(pixels, filters, idat_parts=3)
    rows = png.read_rows(data)
    assert rows is not None, "the fast path declined a plain 8-bit PNG"
    got = decode_image(_src(data), 1 << 30)
    want = _pillow(data, "L" if channels == 1 else "RGB")
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@needs_fast
@pytest.mark.parametrize("channels", [3, 4])
def test_colour_mask_lookup_equals_the_table_lookup_of_pillow_pixels(channels: int) -> None:
    ds_colors = [(128, 64, 128), (70, 70, 70), (220, 20, 60), (0, 0, 142)]
    rng = np.random.default_rng(7)
    idx = rng.integers(0, len(ds_colors), (29, 41))
    rgb = np.array(ds_colors, np.uint8)[idx]
    rgb[3:5, 10:14] = (1, 2, 3)  # unknown colour, 8 px
    if channels == 4:
        rgb = np.concatenate([rgb, rng.integers(0, 256, (29, 41, 1), dtype=np.uint8)], axis=2)
    data = encode_png(rgb, [4, 1, 2, 3, 0])
    mask = decode_mask(_src(data, "m.png"), 1 << 30)
    assert mask.rows is not None and mask.packed is None  # the fused path was taken
    cmap = ColorMap(tuple(ClassInfo(f"c{i}", c) for i, c in enumerate(ds_colors)))
    classes, unknown = cmap.lookup(mask)
    ref = _pillow(data, "RGB").astype(np.uint32)
    packed = (ref[:, :, 0] << 16) | (ref[:, :, 1] << 8) | ref[:, :, 2]
    np.testing.assert_array_equal(mask.colors(), packed)
    np.testing.assert_array_equal(classes, cmap.lookup_colors(packed))
    assert unknown.counts == {(1, 2, 3): 8}
    assert (classes == UNKNOWN).sum() == 8


@needs_fast
def test_lookup_counts_every_flagged_pixel() -> None:
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (17, 19, 3), dtype=np.uint8)
    rows = png.read_rows(encode_png(rgb, [4]))
    lut = np.full(1 << 24, 5, np.uint16)
    packed = (rgb[:, :, 0].astype(np.uint32) << 16) | (rgb[:, :, 1].astype(np.uint32) << 8) | rgb[:, :, 2]
    lut[packed[::2].ravel()] = AMBIGUOUS
    classes, flagged = rows.lookup(~lut, int(AMBIGUOUS))
    np.testing.assert_array_equal(classes, lut[packed])
    assert flagged == int((lut[packed] >= AMBIGUOUS).sum()) > 0


@needs_fast
def test_palette_and_grey_masks_come_out_as_indices_and_table() -> None:
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 6, (21, 33), dtype=np.uint8)
    idx[0, 0] = 9  # an index past the 6-entry palette: black, as Pillow
    pal = bytes([10, 20, 30, 200, 0, 0, 0, 200, 0, 0, 0, 200, 255, 255, 0, 9, 8, 7])
    data = encode_png(idx, [4, 2, 1], palette=pal)
    mask = decode_mask(_src(data), 1 << 30)
    assert mask.rows is None and mask.indices is not None
    im = Image.open(io.BytesIO(data))
    np.testing.assert_array_equal(mask.indices, np.asarray(im))
    ref = np.asarray(im.convert("RGB")).astype(np.uint32)
    np.testing.assert_array_equal(mask.table[mask.indices], (ref[:, :, 0] << 16) | (ref[:, :, 1] << 8) | ref[:, :, 2])
    grey = decode_mask(_src(encode_png(idx * 40, [3])), 1 << 30)
    np.testing.assert_array_equal(grey.table[grey.indices] & 0xFF, idx * 40)


def _slow_mask(data: bytes, monkeypatch: pytest.MonkeyPatch) -> decode.MaskArray:
    with monkeypatch.context() as m:
        m.setattr(png, "available", lambda: False)
        return decode_mask(_src(data), 1 << 30)


def _colours(mask: decode.MaskArray) -> np.ndarray:
    if mask.indices is not None:
        return mask.table[mask.indices]
    return mask.packed if mask.packed is not None else mask.colors()


@needs_fast
@pytest.mark.parametrize("depth", [1, 2, 4])
@pytest.mark.parametrize("kind", ["grey", "palette"])
@pytest.mark.parametrize("filters", FILTER_MIXES, ids=lambda f: "f" + "".join(map(str, f)))
def test_low_bit_depth_masks_take_the_fast_path_and_equal_pillow(depth: int, kind: str, filters: list[int],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(depth * 7 + len(filters))
    for h, w in ((1, 1), (9, 13), (17, 31), (24, 64)):  # widths that leave 0..7 padding bits per row
        samples = rng.integers(0, 1 << depth, (h, w), dtype=np.uint8)
        palette = bytes(rng.integers(0, 256, 3 * min(1 << depth, 5), dtype=np.uint8)) if kind == "palette" else None
        data = encode_png(samples, filters, palette=palette, depth=depth)
        rows = png.read_rows(data, palette=True)
        assert rows is not None and rows.depth == depth
        assert png.read_rows(data) is None  # an image of this kind is Pillow's job
        mask = decode_mask(_src(data), 1 << 30)
        assert mask.indices is not None
        np.testing.assert_array_equal(_colours(mask), _colours(_slow_mask(data, monkeypatch)))
        if kind == "grey":  # PNG scales grey samples to 0..255
            np.testing.assert_array_equal(mask.indices, samples.astype(np.uint16) * (255 // ((1 << depth) - 1)))
        else:
            np.testing.assert_array_equal(mask.indices, samples)


@needs_fast
def test_masks_pillow_writes_with_few_bits_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A palette of up to 16 colours is saved with 1, 2 or 4 bits; a binary mask ("1") with 1-bit grey."""
    rng = np.random.default_rng(11)
    classes = synth.random_mask(90, 121, 5, rng)
    palette_mask = Image.fromarray(classes, mode="P")
    palette_mask.putpalette([128, 64, 128, 70, 70, 70, 0, 0, 142, 220, 20, 60, 107, 142, 35])
    four = Image.fromarray((classes % 4).astype(np.uint8), mode="P")
    four.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255])
    for im, depth in ((palette_mask, 4), (Image.fromarray(classes > 2), 1), (four, 2)):
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        data = buf.getvalue()
        assert data[24] == depth
        mask = decode_mask(_src(data), 1 << 30)
        assert png.read_rows(data, palette=True) is not None and mask.indices is not None
        np.testing.assert_array_equal(_colours(mask), _colours(_slow_mask(data, monkeypatch)))
        reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.uint32)
        np.testing.assert_array_equal(_colours(mask), (reference[:, :, 0] << 16) | (reference[:, :, 1] << 8)
                                      | reference[:, :, 2])


@needs_fast
def test_a_low_bit_depth_mask_with_a_bad_filter_type_is_named() -> None:
    w, h = 21, 6
    packed = _pack_bits(np.random.default_rng(2).integers(0, 16, (h, w), dtype=np.uint8), 4)
    raw = b"".join(bytes([9 if y == 3 else 0]) + packed[y].tobytes() for y in range(h))
    data = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 4, 0, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b""))
    with pytest.raises(DecodeError) as e:
        decode_mask(_src(data, "mask4.png"), 1 << 30)
    assert e.value.kind == "corrupt" and "mask4.png" in str(e.value) and "row 3" in str(e.value)


@needs_fast
def test_declined_files_still_decode_through_the_slow_path() -> None:
    pixels = _textured(16, 24, 3, seed=2)
    interlaced_header = encode_png(pixels, [0], interlace=1)
    assert png.read_rows(interlaced_header) is None
    la = np.stack([pixels[:, :, 0], pixels[:, :, 1]], axis=2)
    la_png = encode_png(la, [4])
    assert png.read_rows(la_png) is None  # grey + alpha: Pillow's job
    np.testing.assert_array_equal(decode_image(_src(la_png), 1 << 30), _pillow(la_png, "RGB"))
    trailing = encode_png(pixels, [1])
    assert png.read_rows(trailing + b"junk after IEND") is not None
    # an image-only read of a palette PNG goes to Pillow, which resolves the palette
    assert png.read_rows(encode_png(pixels[:, :, 0] % 4, [0], palette=bytes(range(12)))) is None


def _damage_crc(data: bytes, kind: bytes) -> bytes:
    at = data.index(kind)
    length = struct.unpack(">I", data[at - 4:at])[0]
    crc_at = at + 4 + length
    return data[:crc_at] + bytes([data[crc_at] ^ 0xFF]) + data[crc_at + 1:]


@needs_fast
def test_damaged_files_get_a_named_error_and_never_wrong_pixels(tmp_path: Path) -> None:
    pixels = _textured(20, 30, 3, seed=4)
    good = encode_png(pixels, [4, 1])
    # a damaged CRC field over intact data: declined; libspng (like Pillow) decodes the intact pixels
    bad_crc = _damage_crc(good, b"IDAT")
    assert png.read_rows(bad_crc) is None
    np.testing.assert_array_equal(decode_image(_src(bad_crc, "bad_crc.png"), 1 << 30), pixels)

    # damaged pixel data (with a matching CRC): the zlib checksum catches it, the file is named
    at = good.index(b"IDAT")
    length = struct.unpack(">I", good[at - 4:at])[0]
    payload = bytearray(good[at + 4:at + 4 + length])
    payload[len(payload) // 2] ^= 0x5A
    damaged = good[:at - 4] + _chunk(b"IDAT", bytes(payload)) + good[at + 8 + length:]
    assert png.read_rows(damaged) is None
    with pytest.raises(DecodeError) as e:
        decode_image(_src(damaged, "damaged.png"), 1 << 30)
    assert e.value.kind in ("corrupt", "truncated") and "damaged.png" in str(e.value)

    cut = good[: len(good) // 2]
    with pytest.raises(DecodeError) as e:
        decode_image(_src(cut, "cut.png"), 1 << 30)
    assert e.value.kind == "truncated" and "cut.png" in str(e.value)

    # a filter type byte of 7 with valid CRCs and zlib stream: only the unfilter step can see it
    h, w = pixels.shape[:2]
    raw = bytearray()
    for y in range(h):
        raw.append(7 if y == 5 else 0)
        raw += pixels[y].tobytes()
    z = zlib.compress(bytes(raw))
    bad_filter = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                  + _chunk(b"IDAT", z) + _chunk(b"IEND", b""))
    with pytest.raises(DecodeError) as e:
        decode_image(_src(bad_filter, "bad_filter.png"), 1 << 30)
    assert e.value.kind == "corrupt" and "bad_filter.png" in str(e.value) and "row 5" in str(e.value)

    # more pixel data than the header's size: declined, then the slow path decides
    long_stream = bytearray(raw)
    long_stream[5 * (1 + w * 3)] = 0
    z = zlib.compress(bytes(long_stream) + b"\0" * 40)
    too_long = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + _chunk(b"IDAT", z) + _chunk(b"IEND", b""))
    assert png.read_rows(too_long) is None


@needs_fast
def test_unfilter_rejects_wrong_sizes_naming_what_it_expected() -> None:
    from converter.transform import _pngrows

    filtered = bytes(3 * (1 + 4 * 3))
    with pytest.raises(ValueError, match="needs 39"):
        _pngrows.unfilter(filtered[:-1], 3, 4, 3, _pngrows.LAYOUT_RAW, np.empty((3, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="expected 36"):
        _pngrows.unfilter(filtered, 3, 4, 3, _pngrows.LAYOUT_RAW, np.empty((3, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="lut of 2"):
        _pngrows.unfilter(filtered, 3, 4, 3, _pngrows.LAYOUT_CLASSES, np.empty((3, 4), np.uint16))
    with pytest.raises(ValueError, match="layout must be"):
        _pngrows.unfilter(filtered, 3, 4, 3, 9, np.empty((3, 4, 3), np.uint8))
    packed = bytes(3 * (1 + 7) - 1)  # 3 rows of 13 4-bit samples need 3 * (1 + 7) bytes
    with pytest.raises(ValueError, match="needs 24"):
        _pngrows.unfilter(packed, 3, 13, 1, _pngrows.LAYOUT_SAMPLES, np.empty((3, 13), np.uint8), depth=4)
    for kw in ({"depth": 3}, {"depth": 8}, {"depth": 4, "scale": 0}, {"depth": 4, "scale": 256}):
        with pytest.raises(ValueError, match="samples layout needs"):
            _pngrows.unfilter(bytes(24), 3, 13, 1, _pngrows.LAYOUT_SAMPLES, np.empty((3, 13), np.uint8), **kw)
    with pytest.raises(ValueError, match="samples layout needs"):
        _pngrows.unfilter(filtered, 3, 4, 3, _pngrows.LAYOUT_RAW, np.empty((3, 4, 3), np.uint8), depth=4)


def test_without_the_extension_pillow_gives_the_same_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    pixels = _textured(22, 31, 4, seed=9)
    data = encode_png(pixels, [4, 3, 2, 1, 0])
    fast = decode_image(_src(data), 1 << 30)
    mask_fast = decode_mask(_src(data), 1 << 30).colors()
    monkeypatch.setattr(png, "_pngrows", None)
    assert not png.available()
    slow = decode_image(_src(data), 1 << 30)
    mask_slow = decode_mask(_src(data), 1 << 30)
    assert mask_slow.rows is None
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_array_equal(mask_fast, mask_slow.colors())


def test_the_fast_path_is_built_where_ci_requires_it() -> None:
    """.ci/run sets IMGSHARD_REQUIRE_FAST_PNG=1: there the C extension must have been built."""
    if os.environ.get("IMGSHARD_REQUIRE_FAST_PNG") != "1":
        pytest.skip("IMGSHARD_REQUIRE_FAST_PNG is not set (only CI requires the compiled extension)")
    assert png.available(), "converter.transform._pngrows did not build: is a C compiler installed?"
    assert decode.png is png


# -- 16-bit greyscale (Pillow path: the fast path takes 8-bit only) -------------------------------

def _png16(values: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(values.astype(np.uint16)).save(buf, "PNG")
    return buf.getvalue()


def test_16_bit_grey_images_keep_their_top_8_bits_instead_of_clipping_to_white() -> None:
    rng = np.random.default_rng(12)
    values = (synth.textured_image(30, 40, rng)[:, :, 0].astype(np.uint16) * 257 + rng.integers(0, 257, (30, 40))
              ).astype(np.uint16)
    data = _png16(values)
    assert png.read_rows(data) is None and Image.open(io.BytesIO(data)).mode == "I;16"
    got = decode_image(_src(data), 1 << 30)
    np.testing.assert_array_equal(got, (values >> 8).astype(np.uint8))
    assert got.max() > 200 and got.min() < 60  # the texture survives (Pillow's convert would give all 255)


def test_16_bit_grey_masks_work_within_0_255_and_are_refused_above_naming_the_file() -> None:
    idx = np.random.default_rng(13).integers(0, 5, (20, 24)).astype(np.uint16) * 40
    mask = decode_mask(_src(_png16(idx), "ok16.png"), 1 << 30)
    np.testing.assert_array_equal(mask.indices, idx.astype(np.uint8))
    idx[3, 4] = 1000
    with pytest.raises(DecodeError) as e:
        decode_mask(_src(_png16(idx), "ids16.png"), 1 << 30)
    assert e.value.kind == "mask_16bit" and "ids16.png" in str(e.value) and "values up to 1000" in str(e.value)
    assert "8-bit" in e.value.fix
