"""The strict rules a stored mask PNG must meet before any reader decodes it.

A dataset's mask PNGs are written by `readers.formats.encoding.encode_mask`: greyscale
(colour type 0), 8-bit (16-bit above 255 classes), not interlaced, one zlib stream that
inflates to exactly ``height * (1 + width * bytes_per_sample)`` bytes. Anything else in a
shard is damage, and decoders would hide it: Pillow pads the rows a complete but short
zlib stream lacks with 0 (class 0 on every missing pixel), and TensorFlow's
``decode_png(channels=1)`` silently turns RGB, palette and grey+alpha PNGs into grey and
scales 8-bit data to 16-bit. `check_mask_png` refuses all of it with a reason, on the
stored bytes, before a decoder runs; every read path (`records`, `keras_dataset`,
`tf_dataset` seeded or not, gzip or not, `verify --deep`) decodes masks through it.

The PNG stream walking (`chunks`, `first_idat_run`, `inflated_size`) is here, in the
readers, because the readers may not import the converter; the converter's PNG checks
(`converter.transform.pngchunks`) use the same functions.

Standard library only (ISA-L's inflate when installed: 2-3x zlib).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Iterator

try:  # pragma: no cover - depends on the install
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover
    _inflate = zlib

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_COLOUR_TYPES = {0: "greyscale", 2: "RGB", 3: "palette", 4: "grey+alpha", 6: "RGBA"}
#: Output bytes inflated per step while counting (bounded memory whatever IHDR claims).
_STEP_BYTES = 1 << 20


def chunks(data: Any) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of each whole chunk after the signature; stops at
    the end of the data or at a chunk cut short (the CRC is at `end`)."""
    mv = memoryview(data)
    pos, end = len(SIGNATURE), len(mv)
    while pos + 12 <= end:
        length, ctype = struct.unpack_from(">I4s", mv, pos)
        stop = pos + 8 + length
        if stop + 4 > end:
            return
        yield ctype, pos + 8, stop
        pos = stop + 4


def first_idat_run(data: Any) -> list[memoryview]:
    """The payloads of the first run of consecutive IDAT chunks: the image data decoders
    (Pillow, TensorFlow) read."""
    mv = memoryview(data)
    run: list[memoryview] = []
    for ctype, start, stop in chunks(mv):
        if ctype == b"IDAT":
            run.append(mv[start:stop])
        elif run or ctype == b"IEND":
            break
    return run


def inflated_size(parts: list[memoryview], limit: int) -> int:
    """Bytes the zlib stream made of `parts` inflates to, counted up to `limit + 1` (so a
    stream longer than `limit` shows) and never holding more than 1 MiB of output; a
    damaged stream counts what came before the damage."""
    inflater = _inflate.decompressobj()
    total = 0
    try:
        for part in parts:
            buf: Any = part
            while buf and not inflater.eof and total <= limit:
                total += len(inflater.decompress(buf, _STEP_BYTES))
                buf = inflater.unconsumed_tail
        if not inflater.eof and total <= limit:
            total += len(inflater.flush())  # output still held back: at most a window
    except (zlib.error, _inflate.error):
        pass
    return min(total, limit + 1)


def check_mask_png(data: Any, height: int, width: int, depth: int) -> None:
    """Raise ValueError saying why `data` is not the `depth`-bit greyscale PNG class map of
    `height` x `width` a writer stores; return None when it is."""
    mv = memoryview(data).cast("B")
    if bytes(mv[:8]) != SIGNATURE:
        what = "a JPEG" if bytes(mv[:2]) == b"\xff\xd8" else "no PNG"
        raise ValueError(f"mask is not a PNG class map (its bytes are {what}: the PNG signature is missing)")
    if len(mv) < 33 or bytes(mv[12:16]) != b"IHDR":
        raise ValueError("mask is not a valid PNG class map (its IHDR header is missing or cut)")
    w, h, bits, colour, _, _, interlace = struct.unpack_from(">IIBBBBB", mv, 16)
    if (w, h) != (width, height):
        raise ValueError(f"mask is {w}x{h}, the manifest says {width}x{height}")
    if colour != 0 or bits != depth:
        kind = f"{bits}-bit {_COLOUR_TYPES.get(colour, f'colour type {colour}')}"
        raise ValueError(f"mask is a {kind} PNG, expected a {depth}-bit greyscale class map")
    if interlace:
        raise ValueError("mask is an interlaced PNG, expected a plain (non-interlaced) class map")
    need = height * (1 + width * depth // 8)
    got = inflated_size(first_idat_run(mv), need)
    if got < need:
        raise ValueError(f"mask is a truncated PNG: its image data ends after {got} of the {need} bytes a "
                         f"{width}x{height} class map needs (about {got * height // max(need, 1)} of {height} "
                         "rows); a decoder would pad the rest with class 0")
    if got > need:
        raise ValueError(f"mask PNG holds more image data than a {width}x{height} class map ({need} bytes)")


__all__ = ["SIGNATURE", "check_mask_png", "chunks", "first_idat_run", "inflated_size"]
