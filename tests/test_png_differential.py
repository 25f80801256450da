"""The fast PNG path gives Pillow's answer on odd and damaged PNGs (issue 12, item 10).

Every file of a generated corpus of oddities (chunks out of order, bad CRCs on critical
and ancillary chunks, ancillary chunks Pillow's handlers refuse, split image data, short
streams, lying headers) and of a seeded fuzz corpus (random byte changes with the CRCs
made right again, so the damage reaches the parsers) is decoded twice: as the converter
does (fast path first) and with the fast path switched off (Pillow only). Both must give
the same pixels, or the same bad-input kind; nothing may raise anything but DecodeError.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from converter.transform import png
from converter.transform.decode import DecodeError, MaskArray, SourceFile, decode_image, decode_mask
from tests._pngcraft import Png, chunk, ihdr_bomb, short_stream

pytestmark = pytest.mark.skipif(not png.available(), reason="the fast PNG path is not built (no _pngrows or isal)")

MAX_PIXELS = 10**8
ICC = b"icc\0\0" + zlib.compress(b"profile" * 20)
RGB = Png(color_type=2, seed=1, before_idat=(chunk(b"gAMA", struct.pack(">I", 45455)),))
GREY = Png(color_type=0, seed=2)
PALETTE = Png(color_type=3, seed=3)
RGBA = Png(color_type=6, seed=4)


def _oddities() -> dict[str, tuple[bytes, bool]]:
    """name -> (file bytes, decode as mask)."""
    odd = {
        "plte_after_idat": (PALETTE.but(palette=b"", after_idat=(chunk(b"PLTE", PALETTE.palette),)), True),
        "plte_after_idat_and_before": (PALETTE.but(after_idat=(chunk(b"PLTE", bytes(12)),)), True),
        "plte_twice": (PALETTE.but(before_idat=(chunk(b"PLTE", bytes(range(12))),)), True),
        "bad_crc_ancillary_before_idat": (RGB.but(before_idat=(chunk(b"tEXt", b"k\0v", bad_crc=True),)), False),
        "bad_crc_ancillary_after_idat": (RGB.but(after_idat=(chunk(b"tEXt", b"k\0v", bad_crc=True),)), False),
        "bad_crc_unknown_ancillary": (RGB.but(before_idat=(chunk(b"prVt", b"xyz", bad_crc=True),)), False),
        "bad_crc_ihdr": (RGB.but(bad_crc=frozenset({b"IHDR"})), False),
        "bad_crc_idat": (RGB.but(bad_crc=frozenset({b"IDAT"})), False),
        "bad_crc_plte": (PALETTE.but(bad_crc=frozenset({b"PLTE"})), True),
        "bad_crc_iend": (RGB.but(bad_crc=frozenset({b"IEND"})), False),
        "idat_split_by_text": (RGB.but(idat_parts=3, between_idat=chunk(b"tEXt", b"k\0v")), False),
        "idat_in_parts": (RGB.but(idat_parts=4), False),
        "second_ihdr": (RGB.but(before_idat=(chunk(b"IHDR", struct.pack(">IIBBBBB", 6, 4, 8, 2, 0, 0, 0)),)), False),
        "chunk_type_not_letters": (RGB.but(before_idat=(chunk(b"t3Xt", b"k\0v"),)), False),
        "unknown_critical_chunk": (RGB.but(before_idat=(chunk(b"ABCD", b"x"),)), False),
        "unknown_ancillary_chunk": (RGB.but(before_idat=(chunk(b"vpAg", b"\0" * 9),)), False),
        "short_gama": (RGB.but(before_idat=(chunk(b"gAMA", b"\0\0"),)), False),
        "short_gama_after_idat": (RGB.but(after_idat=(chunk(b"gAMA", b"\0\0"),)), False),
        "short_chrm": (RGB.but(before_idat=(chunk(b"cHRM", b"\0" * 20),)), False),
        "empty_srgb": (RGB.but(before_idat=(chunk(b"sRGB", b""),)), False),
        "short_phys": (RGB.but(before_idat=(chunk(b"pHYs", b"\0" * 5),)), False),
        "short_trns_rgb": (RGB.but(before_idat=(chunk(b"tRNS", b"\0\0"),)), False),
        "short_trns_grey_mask": (GREY.but(before_idat=(chunk(b"tRNS", b"\0"),)), True),
        "trns_palette_mask": (PALETTE.but(before_idat=(chunk(b"tRNS", b"\0\xff"),)), True),
        "long_trns_palette_mask": (PALETTE.but(before_idat=(chunk(b"tRNS", b"\0" * 40),)), True),
        "trns_rgba": (RGBA.but(before_idat=(chunk(b"tRNS", b"\0" * 6),)), False),
        "iccp_good": (RGB.but(before_idat=(chunk(b"iCCP", ICC),)), False),
        "iccp_bad_method": (RGB.but(before_idat=(chunk(b"iCCP", b"icc\0\1" + ICC[5:]),)), False),
        "iccp_no_method": (RGB.but(before_idat=(chunk(b"iCCP", b"icc\0"),)), False),
        "iccp_broken_zlib": (RGB.but(before_idat=(chunk(b"iCCP", b"icc\0\0garbage"),)), False),
        "iccp_over_text_limit": (RGB.but(before_idat=(chunk(b"iCCP", b"icc\0\0" + zlib.compress(bytes(2 << 20))),)),
                                 False),
        "ztxt_bad_method": (RGB.but(before_idat=(chunk(b"zTXt", b"k\0\1" + zlib.compress(b"v")),)), False),
        "ztxt_over_text_limit": (RGB.but(before_idat=(chunk(b"zTXt", b"k\0\0" + zlib.compress(bytes(2 << 20))),)),
                                 False),
        "itxt_compressed": (RGB.but(before_idat=(chunk(b"iTXt", b"k\0\1\0en\0\0" + zlib.compress(b"v" * 50)),)),
                            False),
        "itxt_over_text_limit": (RGB.but(
            before_idat=(chunk(b"iTXt", b"k\0\1\0en\0\0" + zlib.compress(bytes(2 << 20))),)), False),
        "text_chunks_over_memory_limit": (RGB.but(
            before_idat=tuple(chunk(b"tEXt", b"k%d\0" % i + b"v" * (1 << 20)) for i in range(65))), False),
        "apng_actl": (RGB.but(before_idat=(chunk(b"acTL", struct.pack(">II", 1, 0)),)), False),
        "no_iend": (RGB.but(with_iend=False), False),
        "grey_mask_bad_filter": (GREY.but(rows=b"".join(
            bytes([17]) + bytes(range(i, i + 12)) for i in range(8))), True),
        "rgb_mask_bad_filter": (RGB.but(rows=b"".join(bytes([17]) + bytes(36) for _ in range(8))), True),
    }
    out = {name: (p.bytes(), mask) for name, (p, mask) in odd.items()}
    out["short_stream_rgb"] = (short_stream(RGB, 5), False)
    out["short_stream_palette_mask"] = (short_stream(PALETTE, 3), True)
    out["short_stream_interlaced"] = (short_stream(RGB.but(interlace=1), 2), False)
    out["ihdr_bomb"] = (ihdr_bomb(), False)
    out["stream_runs_on"] = (RGB.bytes(zlib.compress(RGB.raw() + b"\0" * 37)), False)
    out["trailing_garbage_after_stream"] = (RGB.bytes(zlib.compress(RGB.raw()) + b"junk"), False)
    out["cut_in_half"] = (RGB.bytes()[: len(RGB.bytes()) // 2], False)
    return out


ODDITIES = _oddities()


def _colours(mask: MaskArray) -> np.ndarray:
    if mask.indices is not None:
        return mask.table[mask.indices]  # type: ignore[index]
    return mask.colors()


def outcome(data: bytes, as_mask: bool) -> tuple[str, object]:
    """('pixels', array) or ('bad', kind); any other exception propagates (a bug)."""
    src = SourceFile("odd.png", data, None)  # type: ignore[arg-type]
    try:
        if as_mask:
            return "pixels", _colours(decode_mask(src, MAX_PIXELS))
        return "pixels", decode_image(src, MAX_PIXELS)
    except DecodeError as e:
        return "bad", e.kind


def pillow_only(monkeypatch: pytest.MonkeyPatch, data: bytes, as_mask: bool) -> tuple[str, object]:
    with monkeypatch.context() as m:
        m.setattr(png, "available", lambda: False)
        return outcome(data, as_mask)


def assert_same(fast: tuple[str, object], slow: tuple[str, object], what: str) -> None:
    assert fast[0] == slow[0], f"{what}: fast path gave {fast[0]} {fast[1] if fast[0] == 'bad' else ''}, " \
                               f"Pillow gave {slow[0]} {slow[1] if slow[0] == 'bad' else ''}"
    if fast[0] == "bad":
        assert fast[1] == slow[1], what
    else:
        np.testing.assert_array_equal(fast[1], slow[1], err_msg=what)


@pytest.mark.parametrize("name", sorted(ODDITIES))
def test_fast_path_gives_pillows_answer_on_png_oddity(name, monkeypatch):
    data, as_mask = ODDITIES[name]
    assert_same(outcome(data, as_mask), pillow_only(monkeypatch, data, as_mask), name)


def test_plte_after_idat_is_not_used_by_the_fast_path(monkeypatch):
    data, _ = ODDITIES["plte_after_idat"]
    assert png.read_rows(data, palette=True) is None  # Pillow ignores a PLTE after the image data


def test_bad_crc_on_ancillary_chunk_before_idat_is_refused_like_pillow():
    data, _ = ODDITIES["bad_crc_ancillary_before_idat"]
    assert png.read_rows(data) is None
    with pytest.raises(DecodeError) as e:
        decode_image(SourceFile("odd.png", data, None), MAX_PIXELS)  # type: ignore[arg-type]
    assert e.value.kind == "corrupt" and "checksum" in e.value.reason


@pytest.mark.parametrize("name", ["iccp_good", "itxt_compressed", "unknown_ancillary_chunk", "idat_in_parts",
                                  "trns_palette_mask", "trns_rgba"])
def test_fast_path_still_takes_well_formed_pngs_with_ancillary_chunks(name):
    data, as_mask = ODDITIES[name]
    assert png.read_rows(data, palette=as_mask) is not None


def _fix_crcs(data: bytearray) -> None:
    pos = 8
    while pos + 12 <= len(data):
        length = struct.unpack_from(">I", data, pos)[0]
        stop = pos + 8 + length
        if stop + 4 > len(data):
            return
        struct.pack_into(">I", data, stop, zlib.crc32(bytes(data[pos + 4:stop])))
        pos = stop + 4


FUZZ_BASES = {
    "rgb": (Png(color_type=2, seed=5, before_idat=(chunk(b"gAMA", struct.pack(">I", 45455)), chunk(b"iCCP", ICC),
                                                   chunk(b"tRNS", b"\0\1\0\2\0\3"), chunk(b"pHYs", bytes(9))),
                after_idat=(chunk(b"tEXt", b"Comment\0hello"),)).bytes(), False),
    "palette_mask": (Png(color_type=3, seed=6, before_idat=(chunk(b"tRNS", b"\0\xff\x80"),
                                                            chunk(b"zTXt", b"k\0\0" + zlib.compress(b"abc")))).bytes(),
                     True),
    "grey_mask": (Png(color_type=0, seed=7, idat_parts=2, before_idat=(chunk(b"sRGB", b"\0"),)).bytes(), True),
}


@pytest.mark.parametrize("base", sorted(FUZZ_BASES))
def test_fast_path_gives_pillows_answer_on_fuzzed_pngs(base, monkeypatch):
    good, as_mask = FUZZ_BASES[base]
    rng = np.random.default_rng(12)
    for trial in range(150):
        data = bytearray(good)
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(8, len(data)))] = int(rng.integers(0, 256))
        if trial % 3:
            _fix_crcs(data)  # two in three: the damage gets past the CRCs to the parsers
        assert_same(outcome(bytes(data), as_mask), pillow_only(monkeypatch, bytes(data), as_mask),
                    f"{base} trial {trial}")
