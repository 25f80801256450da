"""The fast PNG path: ISA-L inflate, then a small C routine that undoes the row filters
straight into the layout the next stage wants.

Decoding a 1920x1080 photo PNG is mostly inflate; ISA-L inflates 2-3x faster than
zlib (and faster than the zlib-ng inside Pillow), and `_pngrows.unfilter` writes RGB rows, mask colour keys or
mask class indices directly, so a colour mask never exists as a (H, W, 3) array nor as
a (H, W) uint32 key array: each row is looked up in the colour table as it is decoded.

It takes what datasets hold: 8-bit, non-interlaced greyscale, RGB, RGBA and palette
PNGs, and for masks also 1-, 2- and 4-bit greyscale and palette PNGs (Pillow saves a
palette of up to 16 colours with 4 bits or fewer, and a binary mask as 1-bit grey).
Anything else, and any file in which it finds something odd (a bad CRC on any chunk, a
stream that ends early or runs on, an unknown critical chunk, a PLTE after the image
data, an ancillary chunk Pillow's handler refuses: see `pngchunks`), gives None: the
caller then decodes the file with Pillow, which names the problem. Pixels are identical
to Pillow's (tests compare every filter type and layout).

Needs the `_pngrows` extension (built at install when a C compiler is present) and
`isal`; without either, `available()` is False and Pillow decodes every PNG.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

try:
    from isal import isal_zlib
except ImportError:  # pragma: no cover - isal is a dependency; only a broken install lacks it
    isal_zlib = None
try:
    from converter.transform import _pngrows
except ImportError:  # no C compiler at install time: Pillow decodes every PNG
    _pngrows = None
from converter.transform import pngchunks

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 6: 4}  # colour type -> samples per pixel
_LOW_DEPTHS = (1, 2, 4)  # bits per sample that grey and palette PNGs may also have


def available() -> bool:
    """True when the fast path can run (the C extension built and `isal` installed)."""
    return _pngrows is not None and isal_zlib is not None


@dataclass(frozen=True)
class PngRows:
    """An inflated, still filtered PNG; each method unfilters into one layout."""

    width: int
    height: int
    color_type: int  # 0 grey, 2 RGB, 3 palette, 6 RGBA
    filtered: bytes
    palette: bytes = b""  # PLTE payload (palette PNGs)
    depth: int = 8  # bits per sample: 8, or 1, 2, 4 for grey and palette

    @property
    def channels(self) -> int:
        return _CHANNELS[self.color_type]

    def _unfilter(self, layout: int, out: np.ndarray, **kw: object) -> int:
        try:
            return _pngrows.unfilter(self.filtered, self.height, self.width, self.channels, layout, out, **kw)  # type: ignore[union-attr]
        except ValueError as e:
            raise PngDataError(str(e)) from e

    def samples(self) -> np.ndarray:
        """(H, W) for grey and palette (indices), (H, W, 3) for RGB and RGBA (alpha dropped).

        Grey samples of 1, 2 or 4 bits are scaled to 0..255 as PNG defines it (and Pillow
        decodes them): 1 -> 255 at 1 bit, x 85 at 2 bits, x 17 at 4 bits.
        """
        if self.depth != 8:
            out = np.empty((self.height, self.width), np.uint8)
            scale = 255 // ((1 << self.depth) - 1) if self.color_type == 0 else 1
            self._unfilter(_pngrows.LAYOUT_SAMPLES, out, depth=self.depth, scale=scale)  # type: ignore[union-attr]
            return out
        if self.channels == 1:
            out = np.empty((self.height, self.width), np.uint8)
            self._unfilter(_pngrows.LAYOUT_RAW, out)  # type: ignore[union-attr]
        else:
            out = np.empty((self.height, self.width, 3), np.uint8)
            self._unfilter(_pngrows.LAYOUT_RGB, out)  # type: ignore[union-attr]
        return out

    def packed(self) -> np.ndarray:
        """(H, W) uint32 0xRRGGBB of an RGB/RGBA PNG (alpha dropped)."""
        out = np.empty((self.height, self.width), np.uint32)
        self._unfilter(_pngrows.LAYOUT_PACKED, out)  # type: ignore[union-attr]
        return out

    def lookup(self, inverted_lut: np.ndarray, flag_from: int) -> tuple[np.ndarray, int]:
        """(H, W) uint16 `~inverted_lut[0xRRGGBB]` of an RGB/RGBA PNG, and how many pixels got a value >= flag_from.

        The table holds each value bitwise-inverted (see `ColorMap.inverted_lut`).
        """
        if inverted_lut.dtype != np.uint16 or inverted_lut.shape != (1 << 24,) or not inverted_lut.flags.c_contiguous:
            raise ValueError("inverted_lut must be a contiguous (2**24,) uint16 array. "
                             f"Received: {inverted_lut.dtype} {inverted_lut.shape}")
        out = np.empty((self.height, self.width), np.uint16)
        flagged = self._unfilter(_pngrows.LAYOUT_CLASSES, out, lut=inverted_lut,  # type: ignore[union-attr]
                                 flag_from=flag_from)
        return out, flagged


class PngDataError(ValueError):
    """The image data of a PNG is corrupt (an unknown row filter type)."""


def row_bytes(width: int, channels: int, depth: int) -> int:
    """Bytes of one unfiltered row of `width` pixels."""
    return (width * channels * depth + 7) // 8


def read_rows(data: bytes | memoryview, *, palette: bool = False) -> PngRows | None:
    """Parse and inflate a non-interlaced PNG; None when the fast path does not apply.

    `palette=True` (masks) accepts palette PNGs, whose indices are looked up, and grey
    and palette PNGs of 1, 2 or 4 bits per sample; images leave those to Pillow, which
    resolves palettes to RGB.
    """
    if not available() or len(data) < 45 or bytes(data[:8]) != SIGNATURE:
        return None
    mv = memoryview(data)
    length, ctype = struct.unpack_from(">I4s", mv, 8)
    if ctype != b"IHDR" or length != 13:
        return None
    width, height, depth, color_type, compression, filter_method, interlace = struct.unpack_from(">IIBBBBB", mv, 16)
    low_depth = palette and depth in _LOW_DEPTHS and color_type in (0, 3)
    if ((depth != 8 and not low_depth) or color_type not in _CHANNELS or (color_type == 3 and not palette)
            or compression or filter_method or interlace or width == 0 or height == 0):
        return None
    found = _walk_chunks(mv, color_type)
    if found is None:
        return None
    idat, plte = found
    if color_type == 3 and not plte:
        return None
    expected = height * (1 + row_bytes(width, _CHANNELS[color_type], depth))
    try:
        inflater = isal_zlib.decompressobj()  # type: ignore[union-attr]
        filtered = inflater.decompress(idat[0] if len(idat) == 1 else b"".join(idat), expected)
        if len(filtered) != expected or not inflater.eof or inflater.unconsumed_tail:
            return None  # too short, or more data than the image holds
    except isal_zlib.error:  # type: ignore[union-attr]
        return None  # a broken stream: the slow path names it
    return PngRows(width, height, color_type, filtered, plte, depth)


def _walk_chunks(mv: memoryview, color_type: int) -> tuple[list[memoryview], bytes] | None:
    """The IDAT payloads and the PLTE payload of a PNG the fast path may decode, or None
    where Pillow or the PNG specification would see something odd (see `pngchunks`):
    then Pillow decodes the file and names the problem, so both paths give one answer."""
    crc32 = isal_zlib.crc32  # type: ignore[union-attr]
    idat: list[memoryview] = []
    plte: bytes | None = None
    text = 0
    after_idat = False
    for n, (ctype, start, stop) in enumerate(pngchunks.chunks(mv)):
        if crc32(mv[start - 4:stop]) != struct.unpack_from(">I", mv, stop)[0]:
            return None  # damaged (Pillow checks every CRC before the image data)
        if n == 0:
            continue  # the IHDR, read by the caller
        if ctype == b"IEND":
            return (idat, plte or b"") if idat else None
        if ctype == b"IDAT":
            if after_idat:
                return None  # image data split by another chunk: Pillow reads the first run only
            idat.append(mv[start:stop])
            continue
        after_idat = bool(idat)
        if ctype == b"PLTE":
            if idat or plte is not None:
                return None  # a PLTE after the image data (Pillow ignores it) or a second one
            plte = bytes(mv[start:stop])
        elif ctype == b"IHDR" or ctype[:1].isupper():
            return None  # a second IHDR, or a critical chunk we do not know
        else:
            refused, text = pngchunks.ancillary_refusal(ctype, bytes(mv[start:stop]), color_type, text)
            if refused:
                return None
    return None  # no IEND: cut short
