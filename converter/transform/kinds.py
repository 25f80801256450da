"""Images beyond 8-bit RGB: what kind a source file is, the dataset's stored kind
resolved from a sample of them, and decode + resize into that kind.

* `probe_source`: a file's kind from its header (dtype, channels, alpha), without
  decoding its pixels where the format allows (PNG header, TIFF tags, Pillow's mode).
* `resolve_kind`: the stored `ImageKind` from the probed files and the flags
  (`--image-mode`, `--alpha`, `--accept-reduction`); a reduction that loses precision or
  channels is refused by name unless accepted (and then recorded).
* `ImageReader`: decode and resize one image into the stored kind; uint8 RGB keeps the
  fast path of `converter.transform.decode` / `resize` unchanged.

TIFF files go through tifffile (the `tiff` extra, imported only when a TIFF comes):
multi-band, tiled and compressed (with imagecodecs); 16-bit colour PNG through
imagecodecs (Pillow keeps only 8 bits of it). 16-bit images are resized per band by
Pillow's `I;16` resampling (the same filters as 8-bit, rounded to the nearest level).
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from converter.discover.files import read_head
from converter.imagekind import MAX_CHANNELS, AlphaMode, ImageKind, ImageMode
from converter.options import ImageFilter, OutputOptions
from converter.transform.decode import DecodeError, SourceFile, decode_image, open_image, read_source
from converter.transform.exif import orient, orientation_of
from converter.transform.resize import Geometry, resample, resize_image

_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
_PNG_CHANNELS = {0: (1, False), 2: (3, False), 3: (3, False), 4: (1, True), 6: (3, True)}
_PILLOW_MODES = {  # mode -> (dtype, channels without alpha, alpha)
    "1": ("uint8", 1, False), "L": ("uint8", 1, False), "P": ("uint8", 3, False), "RGB": ("uint8", 3, False),
    "CMYK": ("uint8", 3, False), "YCbCr": ("uint8", 3, False), "LAB": ("uint8", 3, False), "HSV": ("uint8", 3, False),
    "RGBA": ("uint8", 3, True), "RGBa": ("uint8", 3, True), "PA": ("uint8", 3, True), "LA": ("uint8", 1, True),
    "La": ("uint8", 1, True), "I;16": ("uint16", 1, False), "I;16L": ("uint16", 1, False),
    "I;16B": ("uint16", 1, False), "I;16N": ("uint16", 1, False), "I": ("int32", 1, False),
    "F": ("float32", 1, False),
}
#: Decode errors of a damaged file: the probe skips it (the run reports it as bad input).
_BAD_FILE = frozenset({"corrupt", "truncated", "not_an_image", "empty_file", "missing", "unreadable", "too_large",
                       "changed_during_read"})
#: How many source images `resolve_kind` looks at (evenly spread over the samples).
PROBE_FILES = 16
#: How much of a file the probe reads first: the header of a PNG, JPEG, BMP, GIF or WebP.
PROBE_HEAD_BYTES = 1 << 16


class ImageKindError(ValueError):
    """The sources cannot be stored as asked without a loss no flag accepted; exit 65."""

    exit_code = 65


@dataclass(frozen=True)
class SourceKind:
    """One file's image kind: dtype ('uint8', 'uint16', 'int32', 'float32'), channels
    without alpha, whether it has alpha, and the file."""

    path: str
    dtype: str
    channels: int
    alpha: bool = False

    def describe(self) -> str:
        bits = {"uint8": "8-bit", "uint16": "16-bit", "int32": "32-bit integer", "float32": "float"}[self.dtype]
        what = {1: "grey", 3: "RGB"}.get(self.channels, f"{self.channels}-band")
        return f"{bits} {what}" + (" + alpha" if self.alpha else "")


def is_tiff(data: bytes) -> bool:
    return data[:4] in _TIFF_MAGIC


def _tifffile(path: str):
    try:
        import tifffile
    except ImportError as e:
        raise DecodeError(path, "needs_extra", "a TIFF file needs tifffile to be read exactly",
                          "pip install 'imgshard[tiff]' (tifffile and imagecodecs)") from e
    return tifffile


def _tiff_layout(src: SourceFile):
    """(tifffile series, axes) of a TIFF's first image, with a named error for what is not one image."""
    tifffile = _tifffile(src.path)
    try:
        tif = tifffile.TiffFile(io.BytesIO(src.data))
        series = tif.series[0]
        axes, shape = series.axes, series.shape
    except Exception as e:  # tifffile raises many types for damaged files
        raise DecodeError(src.path, "corrupt", f"cannot read TIFF: {type(e).__name__}: {e}",
                          "re-copy or re-export the file") from e
    extra = [a for a, n in zip(axes, shape) if a not in "YXSC" and n > 1]
    if extra or "Y" not in axes or "X" not in axes:
        tif.close()
        raise DecodeError(src.path, "tiff_stack", f"a TIFF of shape {shape} (axes {axes}), not one 2-D image",
                          "save one image (its bands as samples) per file")
    return tif, series


def _tiff_kind(src: SourceFile) -> SourceKind:
    tif, series = _tiff_layout(src)
    with tif:
        sizes = dict(zip(series.axes, series.shape))
        channels = int(sizes.get("S", 1) * sizes.get("C", 1))
        page = tif.pages[0]
        alpha = bool(channels in (2, 4) and any(int(e) in (1, 2) for e in (page.extrasamples or ())))
        dtype = np.dtype(series.dtype)
    name = {np.dtype(np.uint8): "uint8", np.dtype(np.uint16): "uint16", np.dtype(np.float32): "float32"}.get(dtype)
    if name is None:
        raise DecodeError(src.path, "image_dtype", f"a TIFF of {dtype} samples; imgshard stores uint8 and uint16",
                          "convert it to 8- or 16-bit unsigned integers")
    return SourceKind(src.path, name, channels - alpha, alpha)


def probe_source(src: SourceFile) -> SourceKind:
    """The kind of one source image, from its header (PNG, TIFF) or Pillow's mode."""
    if is_tiff(src.data):
        return _tiff_kind(src)
    if src.data[:8] == b"\x89PNG\r\n\x1a\n" and src.data[12:16] == b"IHDR":
        depth, ctype = src.data[24], src.data[25]
        if ctype in _PNG_CHANNELS:
            channels, alpha = _PNG_CHANNELS[ctype]
            return SourceKind(src.path, "uint16" if depth == 16 else "uint8", channels, alpha)
    from PIL import Image

    try:
        with Image.open(io.BytesIO(src.data)) as im:
            mode = im.mode
    except Exception as e:  # noqa: BLE001 - the decode names it precisely: let it say what is wrong
        open_image(src, 1 << 62)  # raises the DecodeError a conversion would give (corrupt, truncated, ...)
        raise DecodeError(src.path, "not_an_image", f"not an image Pillow can identify ({type(e).__name__})",
                          "remove the file or replace it with a real image") from e
    dtype, channels, alpha = _PILLOW_MODES.get(mode, ("uint8", 3, False))
    return SourceKind(src.path, dtype, channels, alpha)


# -- the dataset's kind ---------------------------------------------------------------------------


def _refuse(what: str, fix: str) -> ImageKindError:
    return ImageKindError(f"{what}. {fix}")


def _source_dtype(kinds: Sequence[SourceKind]) -> str:
    dtypes = {("uint16" if k.dtype == "int32" else k.dtype) for k in kinds}
    if "float32" in dtypes:
        f = next(k for k in kinds if k.dtype == "float32")
        raise _refuse(f"{f.path}: a float image; imgshard stores uint8 and uint16 images, and a float -> integer "
                      "conversion would lose values", "Convert the images to 16-bit integers first. "
                      "Received: --image-mode, float32 samples")
    if dtypes == {"uint8", "uint16"}:
        a = next(k for k in kinds if k.dtype == "uint8")
        b = next(k for k in kinds if k.dtype != "uint8")
        raise _refuse(f"the sources mix 8-bit ({a.path}) and 16-bit ({b.path}) images; one dataset stores one "
                      "dtype", "Convert them to one bit depth. Received: both")
    return dtypes.pop() if dtypes else "uint8"


def _source_channels(kinds: Sequence[SourceKind], alpha: AlphaMode) -> int:
    counts = {k.channels + (alpha is AlphaMode.KEEP and k.alpha) for k in kinds}
    if len(counts) > 1 and not counts <= {1, 3}:
        a, b = kinds[0], next(k for k in kinds if k.channels != kinds[0].channels)
        raise _refuse(f"the sources mix {a.describe()} ({a.path}) and {b.describe()} ({b.path}) images",
                      "One dataset stores one number of channels. Received: " + ", ".join(map(str, sorted(counts))))
    return max(counts) if counts else 3


def resolve_kind(kinds: Sequence[SourceKind], requested: ImageKind, bands: tuple[str, ...] = (),
                 grey_as_rgb: bool = False) -> ImageKind:
    """The stored kind for sources of `kinds` under the flags of `requested`; `bands`: the
    band names when each image is stacked from one file per band. Under `--image-mode auto`
    8-bit grey stays one channel (RGB where any file is colour, or `grey_as_rgb`)."""
    dtype = _source_dtype(kinds)
    channels = _source_channels(kinds, requested.alpha)
    if bands:
        requested = dataclasses.replace(requested, bands=tuple(bands))
        channels = len(bands) * channels
    if channels > MAX_CHANNELS:
        raise _refuse(f"the sources have {channels} channels; imgshard stores 1..{MAX_CHANNELS}",
                      f"Give fewer bands. Received: {channels}")
    mode, reductions = requested.mode, []
    want_dtype, want_channels = dtype, channels
    if mode is ImageMode.RGB or (mode is ImageMode.AUTO and dtype == "uint8" and channels <= 3):
        want_dtype, want_channels = "uint8", 1 if mode is ImageMode.AUTO and channels == 1 and not grey_as_rgb else 3
    elif mode is ImageMode.GREY:
        want_channels = 1
    if dtype == "uint16" and want_dtype == "uint8":
        reductions.append("16-bit -> 8-bit (the top 8 bits of each sample)")
    if channels > want_channels:
        reductions.append(f"{channels} channels -> {want_channels}" + (" (luma)" if want_channels == 1 else
                                                                        " (the first ones kept)"))
    if reductions and not requested.accept_reduction:
        raise _refuse(f"storing these images as {want_dtype} with {want_channels} channel(s) would lose "
                      f"{'; '.join(reductions)}", "Drop --image-mode (the default keeps 16-bit and multi-band images "
                      f"as they are), or accept the loss with --accept-reduction. Received: --image-mode {mode.value}")
    return dataclasses.replace(requested, dtype=want_dtype, channels=want_channels, reductions=tuple(reductions))


def check_encoding(kind: ImageKind, encoding: str) -> None:
    """Encoded images (PNG/JPEG/WebP) hold 8-bit RGB, PNG also one channel of 8 or 16 bits
    (lossless); refuse other kinds by name."""
    if encoding == "png" and kind.channels == 1:
        return
    if encoding != "raw" and not kind.legacy:
        lossy = encoding in ("jpeg", "webp")
        raise _refuse(f"--image-encoding {encoding} {'is lossy and 8-bit' if lossy else 'stores 8-bit RGB'}; these "
                      f"images are {kind.dtype} with {kind.channels} channel(s)",
                      f"Use --image-encoding raw (with --compression for smaller shards). Received: {encoding}")


def _spread(n: int, k: int) -> list[int]:
    """Up to `k` indices evenly spread over range(n), first and last included."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def probe_path(path: str) -> SourceKind:
    """The kind of the image at `path`, from its first `PROBE_HEAD_BYTES` when they tell it (on a
    bucket one ranged GET, not a download of a file the conversion may not need again); a TIFF
    (its tags may lie anywhere), a header that does not tell, or a damaged file: the whole file,
    whose read names what is wrong."""
    try:
        head = read_head(path, PROBE_HEAD_BYTES)
    except OSError:
        head = b""
    if head and not is_tiff(head):
        try:
            return probe_source(SourceFile(path, head, None))  # type: ignore[arg-type]  # no fingerprint needed
        except DecodeError:
            pass
    return probe_source(read_source(path, path))


def probe_samples(samples: Sequence, k: int = PROBE_FILES) -> list[SourceKind]:
    """The kinds of up to `k` of the samples' images (a damaged file is skipped: the conversion
    reports it as bad input; a file of a kind imgshard cannot store raises `ImageKindError`)."""
    kinds = []
    for i in _spread(len(samples), k):
        sample = samples[i]
        paths = [sample.image] + (list(sample.bands or ()) if i == 0 else [])  # every band of the first sample
        try:
            kinds += [probe_path(path) for path in paths]
        except DecodeError as e:
            if e.kind not in _BAD_FILE:  # a kind imgshard cannot store: said now, not file by file
                raise ImageKindError(str(e)) from e
    return kinds


def resolve_options(samples: Sequence, options: OutputOptions) -> OutputOptions:
    """`options` with the image kind resolved from a sample of the sources' images."""
    first = samples[0] if len(samples) else None
    bands = () if first is None or first.bands is None else band_names_of((first.image, *first.bands))
    lossy = options.image_encoding.value in ("jpeg", "webp")  # 8-bit RGB encoders: grey goes as RGB
    kind = resolve_kind(probe_samples(samples), options.image_kind, bands, grey_as_rgb=lossy)  # type: ignore[arg-type]
    check_encoding(kind, options.image_encoding.value)
    return dataclasses.replace(options, image_kind=kind)


def keep_earlier_kind(options: OutputOptions, stored: Mapping[str, Any]) -> OutputOptions:
    """`options` for an incremental run on a dataset whose stored options are `stored`: one written
    before grey stayed one channel (no ``image_kind``: uint8 RGB) keeps 8-bit grey as RGB, as it was
    converted, instead of being refused as built with other options (`--rebuild` stores it as grey)."""
    kind = options.image_kind
    auto_grey = kind.mode is ImageMode.AUTO and kind.dtype == "uint8" and kind.channels == 1 and not kind.bands
    if auto_grey and "image_kind" not in stored:
        return dataclasses.replace(options, image_kind=dataclasses.replace(kind, channels=3))
    return options


# -- decode and resize into the kind --------------------------------------------------------------


def _decode_tiff(src: SourceFile) -> tuple[np.ndarray, bool]:
    tif, series = _tiff_layout(src)
    with tif:
        try:
            arr = series.asarray()
        except Exception as e:  # noqa: BLE001 - a damaged strip / tile, a missing codec
            raise DecodeError(src.path, "corrupt", f"cannot decode TIFF: {type(e).__name__}: {e}",
                              "re-copy the file; compressed TIFFs need imagecodecs (pip install 'imgshard[tiff]')"
                              ) from e
        axes = series.axes
        alpha = _tiff_kind(src).alpha
    keep = [axes.index(a) for a in "YX"] + [axes.index(a) for a in "CS" if a in axes]
    arr = np.squeeze(arr, axis=tuple(i for i in range(arr.ndim) if i not in keep)) if arr.ndim > len(keep) else arr
    order = [a for a in axes if a in "YXCS"]
    arr = np.transpose(arr, [order.index(a) for a in "YX"] + [order.index(a) for a in order if a in "CS"])
    return arr.reshape(arr.shape[0], arr.shape[1], -1), alpha


def _decode_png16_colour(src: SourceFile) -> np.ndarray:
    try:
        import imagecodecs
    except ImportError as e:
        raise DecodeError(src.path, "needs_extra", "a 16-bit colour PNG: Pillow keeps only 8 bits of it",
                          "pip install 'imgshard[tiff]' (imagecodecs decodes it exactly)") from e
    try:
        return np.asarray(imagecodecs.png_decode(src.data))
    except Exception as e:  # noqa: BLE001
        raise DecodeError(src.path, "corrupt", f"cannot decode PNG: {e}", "re-copy or re-export the file") from e


def decode_native(src: SourceFile, max_pixels: int) -> tuple[np.ndarray, bool]:
    """(H, W, C) samples as stored in the file (uint8, uint16, int32 or float32) and whether
    the last channel is alpha."""
    if is_tiff(src.data):
        arr, alpha = _decode_tiff(src)
    elif src.data[:4] == b"\x89PNG" and src.data[24] == 16 and src.data[25] in (2, 6):
        arr, alpha = _decode_png16_colour(src), src.data[25] == 6
    else:
        im = open_image(src, max_pixels)
        dtype, _, alpha = _PILLOW_MODES.get(im.mode, ("uint8", 3, False))
        if im.mode in ("P", "PA", "CMYK", "YCbCr", "LAB", "HSV", "RGBa", "La", "1") or im.mode not in _PILLOW_MODES:
            im = im.convert("RGBA" if alpha else "RGB")
        arr = np.asarray(im)
    if arr.shape[0] * arr.shape[1] > max_pixels:
        raise DecodeError(src.path, "too_large", f"{arr.shape[1]}x{arr.shape[0]} pixels is over --max-pixels "
                          f"{max_pixels}", "raise --max-pixels if the file is genuine")
    return (arr[:, :, None] if arr.ndim == 2 else arr), alpha


def _to_dtype(src: SourceFile, arr: np.ndarray, kind: ImageKind) -> np.ndarray:
    if arr.dtype == np.int32:  # Pillow's "I": a 16-bit TIFF or PNG opened wide
        if arr.size and (arr.min() < 0 or arr.max() > 0xFFFF):
            raise DecodeError(src.path, "image_dtype", f"32-bit integer samples up to {int(arr.max())}; imgshard "
                              "stores uint8 and uint16", "convert the image to 16-bit")
        arr = arr.astype(np.uint16)
    want = np.dtype(kind.dtype or "uint8")
    if arr.dtype == want:
        return arr
    if arr.dtype == np.uint16 and want == np.uint8 and kind.accept_reduction:
        return (arr >> 8).astype(np.uint8)
    if arr.dtype == np.uint16 and want == np.uint8:  # a 16-bit file the probe did not see
        raise DecodeError(src.path, "image_reduction", "a 16-bit image in a dataset of 8-bit images: storing it "
                          "would lose precision", "convert every image to one bit depth, or accept the loss with "
                          "--accept-reduction")
    raise DecodeError(src.path, "image_kind", f"a {arr.dtype} image in a dataset of {want} images",
                      "convert every image to one bit depth, or rebuild (--rebuild) so the kind is resolved again")


def _luma(arr: np.ndarray) -> np.ndarray:
    """ITU-R 601-2 luma, as Pillow's convert("L") (rounded fixed point), in the array's dtype."""
    rgb = arr[:, :, :3].astype(np.int64)
    return ((rgb[:, :, 0] * 19595 + rgb[:, :, 1] * 38470 + rgb[:, :, 2] * 7471 + 0x8000) >> 16).astype(arr.dtype)


def _to_channels(src: SourceFile, arr: np.ndarray, alpha: bool, kind: ImageKind) -> np.ndarray:
    if alpha and kind.alpha is AlphaMode.DROP:
        arr = arr[:, :, :-1]
    c, want = arr.shape[2], kind.channels or 3
    if c == want:
        return arr
    if c == 1 and want == 3:
        return np.repeat(arr, 3, axis=2)
    if c > want and kind.accept_reduction:
        return _luma(arr)[:, :, None] if want == 1 and c >= 3 else arr[:, :, :want]
    raise DecodeError(src.path, "image_kind", f"{c} channel(s) in a dataset of {want}-channel images",
                      "give every image the same bands, or accept the loss with --accept-reduction")


def resize_bands(arr: np.ndarray, geom: Geometry, image_filter: ImageFilter) -> np.ndarray:
    """(H, W, C) uint8/uint16 resampled band by band (Pillow's filters, `I;16` for uint16), padded with 0."""
    x0, y0, x1, y1 = geom.box
    if geom.resample_size is None:
        block = arr[int(y0):int(y1), int(x0):int(x1)]
    elif geom.resample_size == geom.src_size and geom.box == (0.0, 0.0, float(arr.shape[1]), float(arr.shape[0])):
        block = arr
    elif arr.dtype == np.uint8 and arr.shape[2] == 3:
        block = resample(arr, geom.resample_size, geom.box, image_filter)
    else:
        block = np.empty(geom.resample_size + arr.shape[2:], arr.dtype)
        for c in range(arr.shape[2]):
            block[:, :, c] = resample(np.ascontiguousarray(arr[:, :, c]), geom.resample_size, geom.box, image_filter)
    if block.shape[:2] == geom.out_size:
        return np.ascontiguousarray(block)
    out = np.zeros(geom.out_size + arr.shape[2:], arr.dtype)
    py, px = geom.offset
    out[py:py + block.shape[0], px:px + block.shape[1]] = block
    return out


def _stack_bands(src: SourceFile, arr: np.ndarray, alpha: bool, bands: Sequence[SourceFile],
                 reader: "ImageReader") -> np.ndarray:
    """The first band's samples and every other band file's, stacked (alpha dropped per file)."""
    parts = [arr[:, :, :-1] if alpha else arr]
    for band in bands:
        more, more_alpha = decode_native(band, reader.max_pixels)
        if more.shape[:2] != arr.shape[:2]:
            raise DecodeError(band.path, "size_mismatch", f"band file is {more.shape[1]}x{more.shape[0]} but the "
                              f"first band {src.path} is {arr.shape[1]}x{arr.shape[0]}",
                              "every band file of a sample must have the same size")
        if more.dtype != arr.dtype:
            raise DecodeError(band.path, "image_kind", f"a {more.dtype} band beside a {arr.dtype} first band "
                              f"({src.path})", "give every band the same bit depth")
        parts.append(more[:, :, :-1] if more_alpha else more)
    return np.concatenate(parts, axis=2)


def band_names_of(paths: Sequence[str]) -> tuple[str, ...]:
    """Band names for the manifest: the folder name of each band file."""
    import posixpath

    return tuple(posixpath.basename(posixpath.dirname(p.replace("\\", "/"))) for p in paths)


class ImageReader:
    """Decode + resize one source image into the stored kind (built once per worker)."""

    def __init__(self, kind: ImageKind, max_pixels: int, *, exif_transpose: bool = False) -> None:
        self.kind = kind
        self.max_pixels = max_pixels
        self.exif_transpose = exif_transpose

    def decode(self, src: SourceFile, bands: Sequence[SourceFile] = ()) -> np.ndarray:
        """(H, W) / (H, W, 3) uint8 for the default kind (the fast path), else (H, W, C) in the kind's
        dtype; `bands`: the other band files of a sample stacked from one file per band."""
        if self.kind.legacy and not bands:
            return decode_image(src, self.max_pixels, exif_transpose=self.exif_transpose,
                                reduce_wide=self.kind.accept_reduction)
        arr, alpha = decode_native(src, self.max_pixels)
        if bands:
            arr = _stack_bands(src, arr, alpha, bands, self)
            alpha = False
        if self.exif_transpose:  # photos and annotation files: as a viewer shows them (the first band's tag)
            arr = orient(arr, orientation_of(src))
        return _to_channels(src, _to_dtype(src, arr, self.kind), alpha, self.kind)

    def resize(self, arr: np.ndarray, geom: Geometry, image_filter: ImageFilter) -> np.ndarray:
        if self.kind.legacy:
            return resize_image(arr, geom, image_filter)
        return resize_bands(arr, geom, image_filter)


__all__ = ["PROBE_FILES", "ImageKindError", "ImageReader", "SourceKind", "check_encoding", "decode_native",
           "is_tiff", "keep_earlier_kind", "probe_path", "probe_samples", "probe_source", "resize_bands", "resolve_kind",
           "resolve_options"]
