"""Decode source files into NumPy arrays, with one clear error per bad file.

PNG files that are plain 8-bit (greyscale, RGB, RGBA; palette for masks) and not
interlaced take the fast path (`converter.transform.png`: ISA-L inflate + a C row
unfilter, about 2x libspng and Pillow); every other file (JPEG, palette images,
16-bit or interlaced PNG, BMP, GIF, ...) and every PNG the fast path declines goes
through Pillow, which gives identical pixels and names what is wrong with a damaged
file. Pillow is imported when the first such file comes: a run over plain PNGs never
imports it. (libspng, used before, was dropped: as wrapped by `pyspng` it does not check
the zlib checksum and returned damaged pixels without an error.)

Images come out as (H, W) greyscale or (H, W, 3) RGB uint8 (alpha dropped, palette
resolved; greyscale stays one channel so that resizing costs a third). Masks come out
as a `MaskArray`: either packed 24-bit colours (H, W) uint32, or 8-bit indices (H, W)
plus a 256-entry table of packed colours (palette and greyscale masks), so the colour
-> class lookup can work on 256 entries instead of every pixel.
"""

from __future__ import annotations

import contextlib
import io
import struct
import sys
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import numpy as np

from converter.discover.files import files_for
from converter.discover.stable import SourceChangedError
from converter.plan.fingerprint import digest_bytes
from converter.transform import png, pngchunks
from converter.transform.jpeg import JpegDataError, check_jpeg
from readers.files import NotRegularFileError
from readers.manifest import SourceFingerprint
from readers.storage.url import is_remote

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

#: `PIL.Image.MAX_IMAGE_PIXELS` as Pillow sets it (a test checks it): the limit in force
#: while Pillow is not imported, since nobody can have changed it then.
PILLOW_DEFAULT_MAX_IMAGE_PIXELS = int(1024 * 1024 * 1024 // 4 // 3)

_PNG_EXIF_CHUNK = b"eXIf"


class DecodeError(ValueError):
    """A source file cannot be used. `kind` is a short machine-readable category."""

    def __init__(self, path: str, kind: str, reason: str, fix: str = "") -> None:
        super().__init__(f"{path}: {reason}" + (f" ({fix})" if fix else ""))
        self.path = path
        self.kind = kind
        self.reason = reason
        self.fix = fix


@dataclass(frozen=True)
class SourceFile:
    """The bytes of a source file and its fingerprint (hashed while reading)."""

    path: str
    data: bytes
    fingerprint: SourceFingerprint


def read_source(path: str, rel: str, stat: tuple[int, int] | None = None) -> SourceFile:
    """Read a whole file once: its bytes feed both the hash and the decoder. Only a
    regular file is read (a FIFO would block the run, a device never end). An object-store
    URL is read with one GET (`converter.discover.files`); its fingerprint carries the
    (size, version stamp) discovery listed (`stat`), so the next run compares like with like."""
    try:
        data, stamp = files_for(path).read(path)
    except NotRegularFileError as e:
        raise DecodeError(path, "unreadable", f"unreadable: {e}", "replace it with a real image file") from e
    except SourceChangedError as e:
        raise DecodeError(path, "changed_during_read", f"the file {e.strerror}", "let the program writing it "
                          "finish, then re-run convert (the next run converts it)") from e
    except FileNotFoundError as e:
        raise DecodeError(path, "missing", "file disappeared while converting", "re-run convert") from e
    except OSError as e:
        raise DecodeError(path, "unreadable", f"cannot read file: {e.strerror or e}", "check permissions") from e
    if not data:
        raise DecodeError(path, "empty_file", "zero-byte file", "re-copy the file from its origin")
    if is_remote(path) and stat is not None:
        stamp = stat[1]
    fp = SourceFingerprint(rel, len(data), stamp or 0, digest_bytes(data))
    return SourceFile(path, data, fp)


def _png_header(data: bytes) -> tuple[int, int, int, int] | None:
    """(width, height, bit_depth, colour_type) of a PNG, or None if not a PNG."""
    if len(data) < 33 or not data.startswith(png.SIGNATURE) or data[12:16] != b"IHDR":
        return None
    width, height, depth, ctype = struct.unpack(">IIBB", data[16:26])
    return width, height, depth, ctype


def _check_pixels(path: str, width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise DecodeError(
            path, "too_large",
            f"{width}x{height} = {width * height} pixels is over --max-pixels {max_pixels}",
            "raise --max-pixels if the file is genuine (it may be a decompression bomb)",
        )


def _pillow_bomb_limit() -> int | None:
    """Pillow's decompression-bomb limit now: the caller's setting once Pillow is imported."""
    image = sys.modules.get("PIL.Image")
    return image.MAX_IMAGE_PIXELS if image is not None else PILLOW_DEFAULT_MAX_IMAGE_PIXELS


def _open_pillow(src: SourceFile, max_pixels: int) -> Image.Image:
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(src.data))
            _check_pixels(src.path, im.width, im.height, max_pixels)
            if im.format in ("JPEG", "MPO"):
                _check_jpeg_data(src)
            im.load()
        if im.format == "PNG":
            _check_png_complete(src)
        return im
    except DecodeError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DecodeError(src.path, "too_large", f"Pillow refused it as a decompression bomb: {e}",
                          "check the file; raise --max-pixels only if it is genuine") from e
    except Image.UnidentifiedImageError as e:
        if src.data.startswith(png.SIGNATURE):
            raise DecodeError(src.path, "corrupt", f"a PNG whose header chunks are damaged: {_png_open_error(src.data)}",
                              "re-copy or re-export the file") from e
        raise DecodeError(src.path, "not_an_image", "not an image Pillow can identify",
                          "remove the file or replace it with a real image") from e
    except (OSError, SyntaxError, ValueError, struct.error, EOFError) as e:
        reason = str(e) or type(e).__name__
        kind = "truncated" if "truncated" in reason.lower() else "corrupt"
        raise DecodeError(src.path, kind, f"cannot decode image: {reason}",
                          "re-copy or re-export the file") from e


def _check_jpeg_data(src: SourceFile) -> None:
    """Before Pillow decodes a JPEG: its scan data holds every row, and its header claims no more
    pixels than its bytes can hold (`converter.transform.jpeg`)."""
    try:
        check_jpeg(src.data)
    except JpegDataError as e:
        raise DecodeError(src.path, e.kind, e.reason, "re-copy or re-export the file") from e


def _png_open_error(data: bytes) -> str:
    """Why Pillow's PNG plugin refuses `data` (`Image.open` only says it cannot identify it)."""
    from PIL import PngImagePlugin

    try:
        PngImagePlugin.PngImageFile(io.BytesIO(data)).close()
    except (SyntaxError, IndexError, TypeError, struct.error, ValueError, OSError, EOFError) as e:
        return str(e) or type(e).__name__
    return "Pillow cannot identify it"


def _check_png_limits(src: SourceFile, header: tuple[int, int, int, int], max_pixels: int) -> None:
    """--max-pixels, and Pillow's decompression-bomb limit, for the paths that bypass Pillow.

    A larger --max-pixels never lets a PNG past Pillow's guard.
    """
    width, height, _, _ = header
    _check_pixels(src.path, width, height, max_pixels)
    bomb = _pillow_bomb_limit()
    if bomb is not None and width * height > bomb:
        raise DecodeError(
            src.path, "too_large",
            f"{width}x{height} = {width * height} pixels is over Pillow's decompression-bomb limit "
            f"({bomb} pixels, PIL.Image.MAX_IMAGE_PIXELS)",
            "check the file; Pillow's guard stays on whatever --max-pixels says",
        )
    _check_png_data_size(src)


def _png_geometry(data: bytes) -> tuple[int, int, int | None]:
    """(width, height, bytes its image data must inflate to: None for an unknown colour type)."""
    width, height, depth, color_type, _, _, interlace = struct.unpack_from(">IIBBBBB", data, 16)
    return width, height, pngchunks.raw_size(width, height, depth, color_type, interlace)


def _check_png_data_size(src: SourceFile) -> None:
    """Refuse, before anything is allocated, a PNG whose IHDR claims more pixels than its
    compressed data could ever hold (deflate expands at most about 1032:1): a 429-byte
    file claiming 9000x9000 is cut short, not a picture."""
    width, height, raw = _png_geometry(src.data)
    if raw is None:
        return
    compressed = sum(len(part) for part in pngchunks.first_idat_run(src.data))
    if raw > pngchunks.max_inflated(compressed):
        raise DecodeError(
            src.path, "truncated",
            f"IHDR says {width}x{height} ({raw} bytes of image data) but its {compressed} bytes of "
            f"compressed data hold at most {pngchunks.max_inflated(compressed)}",
            "re-copy or re-export the file",
        )


def _check_png_complete(src: SourceFile) -> None:
    """After Pillow decoded a PNG: its image data held every row IHDR promises. Pillow
    pads the rows a complete but short zlib stream lacks with black and reports nothing."""
    width, height, raw = _png_geometry(src.data)
    if raw is None:
        return
    got = pngchunks.inflated_size(pngchunks.first_idat_run(src.data), raw)
    if got < raw:
        raise DecodeError(
            src.path, "truncated",
            f"image data ends after {got} of the {raw} bytes a {width}x{height} PNG needs "
            f"(about {got * height // raw} of {height} rows)",
            "re-copy or re-export the file",
        )


@contextlib.contextmanager
def _png_data(path: str) -> Iterator[None]:
    """Turn the fast path's row-filter errors (a corrupt file) into a DecodeError naming `path`."""
    try:
        yield
    except png.PngDataError as e:
        raise DecodeError(path, "corrupt", f"cannot decode PNG: {e}", "re-copy or re-export the file") from e


def _exif_transpose(src: SourceFile, im: Image.Image) -> Image.Image:
    """Apply the EXIF orientation tag (as a photo viewer shows the image)."""
    try:
        from PIL import ImageOps  # photos only: segmentation runs never pay for its import

        return ImageOps.exif_transpose(im)
    except (OSError, SyntaxError, ValueError, KeyError, TypeError, struct.error) as e:
        raise DecodeError(src.path, "corrupt", f"cannot apply the EXIF orientation: {type(e).__name__}: {e}",
                          "re-save the file, or strip its EXIF data") from e


def open_image(src: SourceFile, max_pixels: int) -> Image.Image:
    """`src` opened and loaded by Pillow, with the checks every decode makes (one `DecodeError` per bad file)."""
    return _open_pillow(src, max_pixels)


def _refuse_reduction(src: SourceFile, what: str) -> DecodeError:
    return DecodeError(src.path, "image_reduction",
                       f"{what}: storing it as 8-bit RGB would lose precision, and the sources scan saw did not "
                       "say so", "re-run convert (it stores 16-bit images as uint16), or accept the loss with "
                       "--accept-reduction")


def decode_image(src: SourceFile, max_pixels: int, *, exif_transpose: bool = False,
                 reduce_wide: bool = True) -> np.ndarray:
    """Decode to (H, W) uint8 greyscale or (H, W, 3) uint8 RGB.

    With `exif_transpose` (classification sources: photos) the EXIF orientation is
    applied first, as a viewer shows the image (JPEG, TIFF, WebP, and PNG with an eXIf
    chunk). 16-bit and 32-bit integer greyscale (I;16, I) keeps its top 8 bits (v >> 8
    of the 16-bit value, as libpng and `tf.io.decode_png(dtype=uint8)` do; Pillow's
    own conversion would clip everything above 255 to white); with `reduce_wide=False`
    such an image (and a 16-bit PNG, a float image) is refused instead (`image_reduction`). Every other mode (CMYK,
    P, RGBA, LA, 1, ...) becomes RGB through Pillow's `convert("RGB")`.
    """
    header = _png_header(src.data)
    if not reduce_wide and header is not None and header[2] == 16:
        raise _refuse_reduction(src, "a 16-bit PNG")
    # The fast path ignores a PNG's eXIf chunk: such a PNG goes through Pillow when orienting.
    if header is not None and not (exif_transpose and _PNG_EXIF_CHUNK in src.data):
        _check_png_limits(src, header, max_pixels)
        rows = png.read_rows(src.data, palette=False)
        if rows is not None:
            return _pixels(src, rows)
    im = _open_pillow(src, max_pixels)
    if exif_transpose:
        im = _exif_transpose(src, im)
    if im.mode == "L":
        return np.asarray(im)
    if im.mode in _WIDE_GREY or im.mode == "F":
        if not reduce_wide:
            raise _refuse_reduction(src, f"a {im.mode} image (more than 8 bits per sample)")
    if im.mode in _WIDE_GREY:
        return (np.clip(np.asarray(im), 0, 0xFFFF).astype(np.uint32) >> 8).astype(np.uint8)
    if im.mode != "RGB":
        im = im.convert("RGB")  # P, RGBA (alpha dropped), CMYK, LA, 1 ...
    return np.asarray(im)


#: Integer greyscale modes wider than 8 bits (16-bit PNG and TIFF open as I;16 or I).
_WIDE_GREY = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def _pixels(src: SourceFile, rows: png.PngRows) -> np.ndarray:
    with _png_data(src.path):
        return rows.samples()


@dataclass(frozen=True)
class MaskArray:
    """A decoded mask, in one of three forms.

    * `packed`: (H, W) uint32 0xRRGGBB colours (colour masks decoded by Pillow);
    * `indices` + `table`: (H, W) uint8 and 256 packed colours (palette, greyscale);
    * `rows`: a colour PNG from the fast path, still filtered, so that the colour lookup
      (`ColorMap.lookup`) decodes it straight into class indices; `colors()` gives
      the packed colours when they are needed (to report unknown ones).
    """

    height: int
    width: int
    packed: np.ndarray | None = None  # (H, W) uint32
    indices: np.ndarray | None = None  # (H, W) uint8
    table: np.ndarray | None = None  # (256,) uint32 packed colours for `indices`
    rows: png.PngRows | None = None
    path: str = ""

    def colors(self) -> np.ndarray:
        """(H, W) uint32 packed colours of a colour mask (`packed`, or decoded from `rows`)."""
        if self.packed is not None:
            return self.packed
        if self.rows is None:
            raise ValueError(f"{self.path}: colors() is for colour masks; this one has indices and a table")
        with _png_data(self.path):
            return self.rows.packed()

    def lookup(self, inverted_lut: np.ndarray, flag_from: int) -> tuple[np.ndarray, int]:
        """(H, W) `~inverted_lut[colour]` of a colour mask, and how many pixels got a value >= flag_from."""
        if self.rows is None:
            classes = ~inverted_lut[self.colors()]
            return classes, int(np.count_nonzero(classes >= flag_from))
        with _png_data(self.path):
            return self.rows.lookup(inverted_lut, flag_from)


_GREY_TABLE = (np.arange(256, dtype=np.uint32) * 0x010101).astype(np.uint32)


def palette_table(rgb: bytes) -> np.ndarray:
    """(256,) uint32 0xRRGGBB of a palette given as R, G, B bytes; entries past its end
    black (as Pillow resolves them)."""
    table = np.zeros(768, np.uint8)
    n = min(len(rgb), 768) // 3 * 3
    table[:n] = np.frombuffer(rgb, np.uint8, n)
    return pack_rgb(table.reshape(1, 256, 3))[0]


def pack_rgb(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3+) uint8 -> (H, W) uint32 0xRRGGBB."""
    out = rgb[:, :, 0].astype(np.uint32)
    out <<= 8
    out |= rgb[:, :, 1]
    out <<= 8
    out |= rgb[:, :, 2]
    return out


def _refuse_animated(src: SourceFile, im: Image.Image) -> None:
    """A mask with several frames (animated GIF, APNG) has no one class map: refused, never frame 0."""
    frames = getattr(im, "n_frames", 1)
    if frames > 1:
        raise DecodeError(src.path, "animated", f"an animated {im.format} mask with {frames} frames: which frame "
                          "holds the classes is unknown", "save the mask as a single-frame PNG")


def decode_mask(src: SourceFile, max_pixels: int, *, wide: bool = False) -> MaskArray:
    """Decode a colour, palette or greyscale mask (alpha ignored).

    `wide` (index masks): a 16-bit greyscale mask keeps its values above 255 (uint16
    `indices`, no colour table) instead of being refused.
    """
    header = _png_header(src.data)
    if header is not None:
        _check_png_limits(src, header, max_pixels)
        rows = png.read_rows(src.data, palette=True)
        if rows is not None:
            h, w = rows.height, rows.width
            if rows.color_type == 0:
                return MaskArray(h, w, indices=_pixels(src, rows), table=_GREY_TABLE, path=src.path)
            if rows.color_type == 3:
                return MaskArray(h, w, indices=_pixels(src, rows), table=palette_table(rows.palette), path=src.path)
            return MaskArray(h, w, rows=rows, path=src.path)
    im = _open_pillow(src, max_pixels)
    _refuse_animated(src, im)
    h, w = im.height, im.width
    if im.mode == "P":
        table = palette_table(bytes(im.getpalette("RGB") or []))
        return MaskArray(h, w, indices=np.asarray(im), table=table, path=src.path)
    if im.mode in ("L", "1"):  # "1": a binary mask, levels 0 and 255
        return MaskArray(h, w, indices=np.asarray(im.convert("L")), table=_GREY_TABLE, path=src.path)
    if im.mode in ("LA", "La"):
        return MaskArray(h, w, indices=np.asarray(im.getchannel(0)), table=_GREY_TABLE, path=src.path)
    if im.mode in _WIDE_GREY:  # 16-bit grey masks: fine while every value is a grey level 0..255
        values = np.asarray(im)
        top = int(values.max()) if values.size else 0
        low = int(values.min()) if values.size else 0
        if wide and top <= 0xFFFF and low >= 0:
            if top > 255:
                return MaskArray(h, w, indices=values.astype(np.uint16), table=None, path=src.path)
        if top > 255 or low < 0:
            raise DecodeError(
                src.path, "mask_16bit",
                f"{im.mode} greyscale mask with values up to {top}: a class table maps grey levels 0-255 "
                "(value v is colour (v, v, v))",
                "save the masks as 8-bit greyscale or palette PNGs with values 0-255",
            )
        return MaskArray(h, w, indices=values.astype(np.uint8), table=_GREY_TABLE, path=src.path)
    if im.mode not in ("RGB", "RGBA"):
        im = im.convert("RGB")
    return MaskArray(h, w, packed=pack_rgb(np.asarray(im)), path=src.path)
