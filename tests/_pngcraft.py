"""Hand-built PNG files, well-formed or damaged on purpose, for the hostile-input tests.

`Png` holds the parts of a PNG (header fields, textured filtered rows, extra chunks
before and after the image data, the palette) and `Png.bytes()` assembles them, with a
hook for every kind of damage the tests need: a wrong CRC on a chunk, a short zlib
stream, an IHDR that lies about the size, chunks out of order.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field, replace

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def chunk(ctype: bytes, payload: bytes, *, bad_crc: bool = False) -> bytes:
    crc = zlib.crc32(ctype + payload) ^ (0xFFFFFFFF if bad_crc else 0)
    return struct.pack(">I", len(payload)) + ctype + payload + struct.pack(">I", crc)


def textured_rows(width: int, height: int, color_type: int, seed: int, depth: int = 8,
                  filter_byte: int | None = None) -> bytes:
    """Filtered scanlines of a textured picture: gradients plus noise, every filter type 0-4
    (or `filter_byte` on every row), so the pixels are never flat."""
    rng = np.random.default_rng(seed)
    row_bytes = (width * _SAMPLES[color_type] * depth + 7) // 8
    y, x = np.mgrid[0:height, 0:row_bytes]
    data = ((x * 7 + y * 13) % 256 + rng.integers(0, 40, (height, row_bytes))) % 256
    if color_type == 3:
        data %= 4  # palette indices inside a 4-colour palette
    out = bytearray()
    for r in range(height):
        out.append(r % 5 if filter_byte is None else filter_byte)
        out += data[r].astype(np.uint8).tobytes()
    return bytes(out)


@dataclass(frozen=True)
class Png:
    """A PNG to assemble. `rows` defaults to textured rows for the header's geometry."""

    width: int = 12
    height: int = 8
    color_type: int = 2
    depth: int = 8
    interlace: int = 0
    seed: int = 0
    rows: bytes | None = None
    palette: bytes = bytes([0, 0, 0, 128, 64, 0, 0, 128, 192, 255, 255, 255])
    before_idat: tuple[bytes, ...] = ()  # whole chunks after IHDR (and PLTE)
    after_idat: tuple[bytes, ...] = ()
    idat_parts: int = 1
    between_idat: bytes = b""  # a chunk put between the IDAT parts
    header_size: tuple[int, int] | None = None  # what IHDR claims, when it lies
    bad_crc: frozenset[bytes] = field(default_factory=frozenset)  # chunk types whose CRC is wrong
    with_iend: bool = True

    def raw(self) -> bytes:
        if self.rows is not None:
            return self.rows
        if not self.interlace:
            return textured_rows(self.width, self.height, self.color_type, self.seed, self.depth)
        out = b""  # Adam7: the rows of each of the 7 reduced images, one after another
        for i, (x0, y0, dx, dy) in enumerate(_ADAM7):
            w, h = max(0, -(-(self.width - x0) // dx)), max(0, -(-(self.height - y0) // dy))
            if w and h:
                out += textured_rows(w, h, self.color_type, self.seed + i, self.depth)
        return out

    def bytes(self, compressed: bytes | None = None) -> bytes:
        w, h = self.header_size or (self.width, self.height)
        ihdr = struct.pack(">IIBBBBB", w, h, self.depth, self.color_type, 0, 0, self.interlace)
        out = SIGNATURE + chunk(b"IHDR", ihdr, bad_crc=b"IHDR" in self.bad_crc)
        if self.color_type == 3:
            out += chunk(b"PLTE", self.palette, bad_crc=b"PLTE" in self.bad_crc)
        out += b"".join(self.before_idat)
        data = zlib.compress(self.raw()) if compressed is None else compressed
        step = -(-len(data) // self.idat_parts)
        parts = [data[i:i + step] for i in range(0, len(data), step)]
        for i, part in enumerate(parts):
            if i:
                out += self.between_idat
            out += chunk(b"IDAT", part, bad_crc=b"IDAT" in self.bad_crc)
        out += b"".join(self.after_idat)
        return out + (chunk(b"IEND", b"", bad_crc=b"IEND" in self.bad_crc) if self.with_iend else b"")

    def but(self, **changes: object) -> "Png":
        return replace(self, **changes)


def short_stream(png: Png, rows: int) -> bytes:
    """A complete, valid zlib stream holding only the first `rows` rows of `png`."""
    raw = png.raw()
    per_row = len(raw) // png.height  # interlaced: a cut inside the passes, as long
    return png.bytes(zlib.compress(raw[: rows * per_row]))


def ihdr_bomb(width: int = 9000, height: int = 9000) -> bytes:
    """A few hundred bytes whose IHDR claims width x height RGB: far more than its data holds."""
    return Png(width=4, height=4, header_size=(width, height), rows=b"\0" * 300).bytes()
