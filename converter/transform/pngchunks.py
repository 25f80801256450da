"""PNG chunk rules shared by the fast path and the checks around Pillow's decoder.

The fast path (`converter.transform.png`) must give Pillow's answer for every file: the
same pixels, or no answer at all (then Pillow decodes the file and names what is wrong).
So it declines every file in which Pillow, or the PNG specification, would see something
odd: a bad CRC on any chunk, a chunk type that is not four letters, a second IHDR, a
PLTE after the image data (Pillow ignores it) or twice, image data split by other chunks
(Pillow reads only the first run), animation chunks, and the ancillary chunks whose
Pillow handler refuses them (a short gAMA, tRNS, ...; a text or ICC profile chunk over
Pillow's size limits). `ancillary_refusal` mirrors those handlers.

`raw_size` and `MAX_INFLATE_RATIO` bound what an IHDR may claim: the image data of a
PNG inflates to exactly `raw_size` bytes, and deflate cannot expand data more than
about 1032 times, so a header claiming more than its compressed data can hold is a
truncated file, refused before anything is allocated.
"""

from __future__ import annotations

import sys
import zlib

from readers.formats.pngmask import chunks, first_idat_run, inflated_size  # noqa: F401 - one PNG stream walker for both sides (re-exported)

#: Deflate's greatest expansion: a 258-byte match coded in 2 bits (1-bit length and
#: distance codes) gives 258 bytes per 2 bits, 1032:1; headers only lower it.
MAX_INFLATE_RATIO = 1032
#: Slack on top of that bound for the bytes a stream starts with (a literal before matches).
INFLATE_SLACK_BYTES = 1024

#: Pillow's defaults (`PngImagePlugin.MAX_TEXT_CHUNK`, `MAX_TEXT_MEMORY`); the current
#: values are read from Pillow when it is imported.
_PILLOW_MAX_TEXT_CHUNK = 1024 * 1024
_PILLOW_MAX_TEXT_MEMORY = 64 * _PILLOW_MAX_TEXT_CHUNK

_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel
#: Adam7 passes: (x start, y start, x step, y step).
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
#: Minimum payloads Pillow's handlers require (shorter: "Truncated gAMA chunk", ...).
_MIN_LENGTH = {b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9}
_ANIMATION = (b"acTL", b"fcTL", b"fdAT")


def raw_size(width: int, height: int, depth: int, color_type: int, interlace: int) -> int | None:
    """Bytes the image data of a PNG inflates to (filter bytes included); None for an
    unknown colour type."""
    samples = _SAMPLES.get(color_type)
    if samples is None:
        return None
    bits = samples * depth
    if not interlace:
        return height * (1 + (width * bits + 7) // 8)
    total = 0
    for x0, y0, dx, dy in _ADAM7:
        w = (width - x0 + dx - 1) // dx if width > x0 else 0
        h = (height - y0 + dy - 1) // dy if height > y0 else 0
        if w and h:
            total += h * (1 + (w * bits + 7) // 8)
    return total


def max_inflated(compressed_bytes: int) -> int:
    """The most bytes `compressed_bytes` of a zlib stream can inflate to."""
    return compressed_bytes * MAX_INFLATE_RATIO + INFLATE_SLACK_BYTES


def _pillow_text_limits() -> tuple[int, int]:
    plugin = sys.modules.get("PIL.PngImagePlugin")
    if plugin is None:
        return _PILLOW_MAX_TEXT_CHUNK, _PILLOW_MAX_TEXT_MEMORY
    return plugin.MAX_TEXT_CHUNK, plugin.MAX_TEXT_MEMORY


def _inflates_within(data: bytes, limit: int) -> int | None:
    """Length `data` inflates to (0 for a broken stream, which Pillow ignores), or None
    when it holds more than `limit` bytes (Pillow: "Decompressed data too large")."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit)
    except zlib.error:
        return 0
    return None if inflater.unconsumed_tail else len(out)


def _text_length(ctype: bytes, payload: bytes, chunk_limit: int) -> int | None:
    """Characters of text Pillow keeps from a tEXt/zTXt/iTXt/iCCP chunk; None where its
    handler raises (an unknown compression method, data over MAX_TEXT_CHUNK, no method byte)."""
    key, sep, rest = payload.partition(b"\0")
    if ctype == b"tEXt":
        return len(rest) if key else 0
    if ctype == b"iCCP":
        if len(payload) < payload.find(b"\0") + 2 or payload[payload.find(b"\0") + 1] != 0:
            return None
        return 0 if _inflates_within(payload[payload.find(b"\0") + 2:], chunk_limit) is not None else None
    if ctype == b"zTXt":
        if rest and rest[0] != 0:
            return None
        size = _inflates_within(rest[1:], chunk_limit)
        return None if size is None else (size if key else 0)
    # iTXt: key \0 flag method lang \0 translated \0 text
    if not sep or len(rest) < 2:
        return 0
    flag, method, fields = rest[0], rest[1], rest[2:].split(b"\0", 2)
    if len(fields) < 3 or (flag and method):
        return 0
    return len(fields[2]) if not flag else _inflates_within(fields[2], chunk_limit)


def ancillary_refusal(ctype: bytes, payload: bytes, color_type: int, text_so_far: int) -> tuple[str | None, int]:
    """Why Pillow would refuse this ancillary chunk (None: it accepts it), and the text
    memory Pillow counts after it (it refuses over MAX_TEXT_MEMORY in all)."""
    if not all(65 <= c <= 90 or 97 <= c <= 122 for c in ctype):
        return f"chunk type {ctype!r} is not four letters", text_so_far
    if ctype in _ANIMATION:
        return f"animation chunk {ctype.decode()} (Pillow decodes APNG)", text_so_far
    if len(payload) < _MIN_LENGTH.get(ctype, 0):
        return f"truncated {ctype.decode()} chunk", text_so_far
    if ctype == b"tRNS" and len(payload) < {0: 2, 2: 6}.get(color_type, 0):
        return "truncated tRNS chunk", text_so_far
    if ctype in (b"tEXt", b"zTXt", b"iTXt", b"iCCP"):
        chunk_limit, memory_limit = _pillow_text_limits()
        length = _text_length(ctype, payload, chunk_limit)
        if length is None:
            return f"{ctype.decode()} chunk Pillow refuses (compression method or size)", text_so_far
        text_so_far += length
        if text_so_far > memory_limit:
            return "text chunks over Pillow's MAX_TEXT_MEMORY", text_so_far
    return None, text_so_far
