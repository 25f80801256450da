"""Encoded storage of images and masks: what the writers encode, what the readers decode.

A record's image is stored as one of `IMAGE_CODECS`:

* ``raw``: H*W*3 uint8 bytes, row-major RGB (the default, fastest from RAM);
* ``png``: an 8-bit RGB PNG (lossless, bit-exact with raw);
* ``jpeg``: a baseline JPEG, 4:2:0 chroma subsampling, standard tables scaled by
  ``quality`` (default 90), no Huffman optimisation, not progressive, no metadata;
* ``webp``: a lossy WebP of ``quality`` (libwebp method 4), no metadata.

Masks are always lossless (`MASK_CODECS`): ``raw`` when the image is raw, otherwise a
greyscale PNG of the class map (8-bit ``L`` for up to 255 classes, 16-bit ``I;16``
above). A one-hot mask (``--mask-encoding onehot``) is stored as the PNG of its class
map (the plane that is 1 on each pixel; the ignore index where every plane is 0) and
expanded back to uint8 planes on read: the one-hot planes are an exact function of the
class map, so nothing is lost, and one plane compresses far better than C planes.

Encoding uses Pillow with every encoder parameter set explicitly, so the same pixels
and options give the same bytes in any worker process. Decoding uses Pillow (NumPy
paths, releasing the GIL: `parallel_for` decodes a batch on `DECODE_THREADS` threads)
or TensorFlow's decoders in graph pipelines (`tf_decode_images`, `tf_decode_masks`),
which give the same pixels (JPEG with ``dct_method="INTEGER_ACCURATE"``, libjpeg's
default that Pillow uses).

NumPy only at import time; Pillow and TensorFlow are imported where they are used.
"""

from __future__ import annotations

import io
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from readers.errors import FIX_HINT, describe, shard_error
from readers.formats import IMAGE_CODECS, MASK_CODECS, check_choice, workers
from readers.formats.classrange import problem
from readers.formats.pngmask import check_mask_png

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from readers.formats.spec import Record, RecordSpec

LOSSY_CODECS = ("jpeg", "webp")
DEFAULT_QUALITY = 90

#: Pillow's JPEG settings (besides quality): 4:2:0 chroma, baseline, standard Huffman tables.
JPEG_PARAMS = {"subsampling": 2, "optimize": False, "progressive": False}
#: libwebp's effort (0 fastest .. 6 smallest); 4 is libwebp's default.
WEBP_METHOD = 4
#: zlib level of PNG images and masks (Pillow's default, written out so it never drifts).
PNG_COMPRESS_LEVEL = 6

_PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
#: The mode Pillow decodes a stored image to, by (channels, dtype): grey PNG 8 and 16 bits.
_PIL_MODE = {(3, "uint8"): "RGB", (1, "uint8"): "L", (1, "uint16"): "I;16"}


def mask_codec_for(image_codec: str) -> str:
    """Masks are raw next to raw images, PNG next to any encoded image."""
    return "raw" if image_codec == "raw" else "png"


# -- encoding (converter workers) ----------------------------------------------------------------

def encode_image(image: np.ndarray, codec: str, quality: int | None = None) -> bytes:
    """The stored bytes of a (H, W, 3) uint8 image in `codec` (not "raw"); PNG also takes one
    channel of uint8 or uint16 (a 16-bit greyscale PNG: lossless, every bit)."""
    from PIL import Image

    check_choice(codec, IMAGE_CODECS[1:], "image codec")
    out = io.BytesIO()
    if codec == "png" and image.ndim == 3 and image.shape[2] == 1 and image.dtype in (np.uint8, np.uint16):
        grey = np.ascontiguousarray(image[:, :, 0], image.dtype.newbyteorder("="))
        Image.fromarray(grey).save(out, format="PNG", compress_level=PNG_COMPRESS_LEVEL, optimize=False)  # L / I;16
        return out.getvalue()
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"--image-encoding {codec} stores 8-bit RGB (PNG also one channel of 8 or 16 bits). "
                         f"Received: {image.dtype} {image.shape}")
    pil = Image.fromarray(np.ascontiguousarray(image, np.uint8), "RGB")
    if codec == "png":
        pil.save(out, format="PNG", compress_level=PNG_COMPRESS_LEVEL, optimize=False)
    elif codec == "jpeg":
        pil.save(out, format="JPEG", quality=int(quality or DEFAULT_QUALITY), **JPEG_PARAMS)
    else:
        pil.save(out, format="WEBP", quality=int(quality or DEFAULT_QUALITY), method=WEBP_METHOD,
                 lossless=False, exact=False)
    return out.getvalue()


def class_map_of_onehot(planes: np.ndarray, ignore_index: int) -> np.ndarray:
    """The class map whose one-hot expansion is `planes` (all-zero pixels -> `ignore_index`)."""
    dtype = np.uint8 if ignore_index <= 255 else np.uint16
    cmap = np.argmax(planes, axis=-1).astype(dtype)
    cmap[planes.max(axis=-1) == 0] = ignore_index
    return cmap


def encode_mask(mask: np.ndarray, ignore_index: int) -> bytes:
    """PNG of a class map (H, W) uint8/uint16, or of the class map of one-hot planes (H, W, C)."""
    from PIL import Image

    cmap = class_map_of_onehot(mask, ignore_index) if mask.ndim == 3 else mask
    if cmap.dtype == np.uint8:
        pil = Image.fromarray(np.ascontiguousarray(cmap), "L")
    else:
        pil = Image.fromarray(np.ascontiguousarray(cmap, np.uint16))  # 16-bit greyscale ("I;16")
    out = io.BytesIO()
    pil.save(out, format="PNG", compress_level=PNG_COMPRESS_LEVEL, optimize=False)
    return out.getvalue()


# -- decoding with Pillow (NumPy paths) -----------------------------------------------------------

def decode_image(data: Any, spec: "RecordSpec") -> np.ndarray:
    """(H, W, 3) uint8 from stored image bytes; ValueError saying what is wrong."""
    from PIL import Image

    codec = spec.image_codec
    try:
        with Image.open(io.BytesIO(data), formats=[_PIL_FORMATS[codec]]) as pil:
            if pil.size != (spec.width, spec.height):  # before decoding: a hostile header allocates nothing
                raise ValueError(f"is {pil.size[0]}x{pil.size[1]}, the manifest says {spec.width}x{spec.height}")
            pil.load()
            want = _PIL_MODE.get((spec.channels, spec.image_dtype), "RGB")
            if pil.mode != want:
                raise ValueError(f"decodes to mode {pil.mode!r}, expected {want!r}")
            array = np.asarray(pil)
            array = array.reshape(array.shape[:2] + (spec.channels,)) if array.ndim == 2 else array
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ValueError(f"image is not a valid {codec.upper()} ({describe(e)})") from e
    if array.shape != spec.image_shape:
        raise ValueError(f"image decodes to shape {array.shape}, the manifest says {spec.image_shape}")
    return array


def wide_class_map(spec: "RecordSpec") -> bool:
    """Whether the stored class map is 16-bit (more than 255 classes)."""
    return spec.mask_dtype == "uint16" or (spec.ignore_index is not None and spec.ignore_index > 255)


def decode_mask(data: Any, spec: "RecordSpec") -> np.ndarray:
    """The stored mask (class map, or one-hot planes) from PNG bytes."""
    from PIL import Image

    wide = wide_class_map(spec)
    modes = ("I;16", "I;16B", "I") if wide else ("L",)
    check_mask_png(data, spec.height, spec.width, 16 if wide else 8)  # before Pillow pads or converts anything
    try:
        with Image.open(io.BytesIO(data), formats=["PNG"]) as pil:
            if pil.size != (spec.width, spec.height):  # before decoding: a hostile header allocates nothing
                raise ValueError(f"is {pil.size[0]}x{pil.size[1]}, the manifest says {spec.width}x{spec.height}")
            pil.load()
            if pil.mode not in modes:
                raise ValueError(f"decodes to mode {pil.mode!r}, expected {modes[0]!r}")
            cmap = np.asarray(pil)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ValueError(f"mask is not a valid PNG class map ({describe(e)})") from e
    if cmap.shape != (spec.height, spec.width):
        raise ValueError(f"mask decodes to shape {cmap.shape}, the manifest says {(spec.height, spec.width)}")
    why = problem(cmap, replace(spec, mask_encoding="class_map"))  # stored one-hot: its class map
    if why is not None:
        raise ValueError(why)
    if spec.mask_encoding == "onehot":
        planes = np.arange(spec.num_classes, dtype=cmap.dtype)
        return (cmap[:, :, None] == planes).astype(np.uint8)
    return cmap.astype(spec.mask_np_dtype.newbyteorder("="), copy=False)


class EncodedColumn:
    """One field (image or mask) of a shard's records as stored bytes, decoded on access.

    `column[i]` decodes record i; `raw(i)` is its stored bytes. `row_shape` and
    `row_dtype` describe a decoded record, so a batch can be allocated before decoding.
    Decode errors raise `ShardError` naming the shard and the record.
    """

    def __init__(self, parts: Sequence[Any], decode: Callable[[Any, "RecordSpec"], np.ndarray],
                 spec: "RecordSpec", path: str, row_shape: tuple[int, ...], row_dtype: Any):
        self.parts = parts
        self._decode = decode
        self.spec = spec
        self.path = path
        self.row_shape = tuple(row_shape)
        self.row_dtype = np.dtype(row_dtype)

    def __len__(self) -> int:
        return len(self.parts)

    def raw(self, index: int) -> bytes:
        return bytes(self.parts[index])

    def __getitem__(self, index: int) -> np.ndarray:
        try:
            return self._decode(self.parts[index], self.spec)
        except ValueError as e:
            raise shard_error(self.path, str(e), record=int(index)) from e

    @property
    def nbytes(self) -> int:
        return sum(len(p) for p in self.parts)


def image_column(parts: Sequence[Any], spec: "RecordSpec", path: str) -> EncodedColumn:
    return EncodedColumn(parts, decode_image, spec, path, spec.image_shape, spec.image_np_dtype.newbyteorder("="))


def mask_column(parts: Sequence[Any], spec: "RecordSpec", path: str) -> EncodedColumn:
    return EncodedColumn(parts, decode_mask, spec, path, spec.mask_shape, spec.mask_np_dtype.newbyteorder("="))


def row_layout(column: Any) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of one decoded record of `column` (a column that knows it, or an array/sequence)."""
    if hasattr(column, "row_shape"):  # an `EncodedColumn` or a `layouts.MappedColumn`
        return column.row_shape, column.row_dtype
    first = np.asarray(column[0])
    return first.shape, first.dtype


# -- parallel decoding ---------------------------------------------------------------------------

#: Threads decoding a batch (Pillow releases the GIL while it decodes).
DECODE_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
#: Records decoded at a time by `decode_stored` (the NumPy `records()` path).
DECODE_CHUNK = 32

def decode_pool() -> workers.DaemonPool:
    """The process's decoder threads (daemons, started on first use; see `readers.formats.workers`)."""
    return workers.pool("decode", max(1, DECODE_THREADS - 1))


def parallel_for(n: int, fn: Callable[[int], None]) -> None:
    """Call fn(0) .. fn(n-1) on the decoder threads plus the calling one; re-raise the first error.

    Contiguous chunks, one per thread; the caller runs the last chunk itself. Never
    call it from inside `fn` (the pool would wait on itself).
    """
    threads = min(DECODE_THREADS, n)
    if threads <= 1:
        for j in range(n):
            fn(j)
        return

    def run(lo: int, hi: int) -> None:
        for j in range(lo, hi):
            fn(j)

    bounds = np.linspace(0, n, threads + 1).astype(int)
    pool = decode_pool()
    futures = [pool.submit(run, int(lo), int(hi)) for lo, hi in zip(bounds[:-2], bounds[1:-1])]
    error: BaseException | None = None
    try:
        run(int(bounds[-2]), int(bounds[-1]))
    except BaseException as e:  # noqa: BLE001 - re-raised below, after the other chunks end
        error = e
    for f in futures:
        try:
            f.result()
        except BaseException as e:  # noqa: BLE001 - the first error wins
            error = error or e
    if error is not None:
        raise error


def decode_record(rec: "Record", spec: "RecordSpec", path: str, index: int) -> "Record":
    """`rec` with its stored image/mask bytes decoded; errors name the shard and record."""
    try:
        image = decode_image(rec.image, spec) if spec.image_codec != "raw" else rec.image
        mask = rec.mask
        if mask is not None and spec.mask_codec != "raw":
            mask = decode_mask(mask, spec)
    except ValueError as e:
        raise shard_error(path, str(e), record=index) from e
    return replace(rec, image=image, mask=mask)


def decode_stored(stored: Iterator["Record"], spec: "RecordSpec", path: str) -> Iterator["Record"]:
    """Decode `Record`s whose image/mask are stored bytes, `DECODE_CHUNK` at a time in
    parallel; records of a raw dataset pass through untouched."""
    if spec.image_codec == "raw" and spec.mask_codec == "raw":
        yield from stored
        return
    base = 0
    while True:
        chunk = [r for _, r in zip(range(DECODE_CHUNK), stored)]
        if not chunk:
            return
        out: list[Any] = [None] * len(chunk)

        def one(j: int) -> None:
            out[j] = decode_record(chunk[j], spec, path, base + j)

        parallel_for(len(chunk), one)
        yield from out
        base += len(chunk)


# -- decoding in TensorFlow graphs -----------------------------------------------------------------

def tf_decode_one_image(data: "tf.Tensor", spec: "RecordSpec") -> "tf.Tensor":
    """(H, W, 3) uint8 from one stored image string (shape checked)."""
    import tensorflow as tf

    if spec.image_codec == "jpeg":
        image = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE")
    elif spec.image_codec == "png":
        image = tf.io.decode_png(data, channels=spec.channels, dtype=tf.dtypes.as_dtype(spec.image_dtype))
    else:
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
    return tf.ensure_shape(image, spec.image_shape)


def tf_decode_one_mask(data: "tf.Tensor", spec: "RecordSpec") -> "tf.Tensor":
    """The stored mask (class map or one-hot planes) from one PNG string."""
    import tensorflow as tf

    wide = wide_class_map(spec)
    cmap = tf.io.decode_png(data, channels=1, dtype=tf.uint16 if wide else tf.uint8)[..., 0]
    cmap = tf.ensure_shape(cmap, (spec.height, spec.width))
    if spec.mask_encoding == "onehot":
        return tf.one_hot(tf.cast(cmap, tf.int32), spec.num_classes, dtype=tf.uint8)
    return cmap


def tf_checked_mask_strings(strings: "tf.Tensor", paths: "tf.Tensor", indices: "tf.Tensor",
                            spec: "RecordSpec") -> "tf.Tensor":
    """In a graph (`ENGINE` = "tf"): a batch of stored mask PNGs after asserting the header
    rules of `readers.formats.pngmask.check_mask_png` (signature, IHDR of the manifest's
    size, greyscale, the dataset's bit depth, not interlaced), so `decode_png(channels=1)`
    never converts an RGB, palette, grey+alpha, other-depth or JPEG mask, and never
    allocates a size the manifest does not give. A failure names the shard and record of
    the first bad mask. (The default pipelines decode in the generator with every rule.)"""
    import struct

    import tensorflow as tf

    from readers.formats.pngmask import SIGNATURE

    depth = 16 if wide_class_map(spec) else 8
    head = tf.strings.join([tf.strings.substr(strings, 0, 29), tf.fill(tf.shape(strings), bytes(29))])
    ihdr = b"IHDR" + struct.pack(">IIBB", spec.width, spec.height, depth, 0)
    ok = (tf.equal(tf.strings.substr(head, 0, 8), SIGNATURE) & tf.equal(tf.strings.substr(head, 12, 14), ihdr)
          & tf.equal(tf.strings.substr(head, 28, 1), b"\0"))
    first = tf.argmin(tf.cast(ok, tf.int32), output_type=tf.int32)
    check = tf.debugging.Assert(tf.reduce_all(ok), [tf.strings.join([
        "shard ", paths[first], ", record ", tf.strings.as_string(indices[first]),
        f": mask is not the {spec.width}x{spec.height} {depth}-bit greyscale PNG class map the writer stores (RGB, "
        f"palette, grey+alpha, another size or bit depth, interlaced, or JPEG bytes). {FIX_HINT}"])])
    with tf.control_dependencies([check]):
        return tf.identity(strings)


def tf_decode_batch(strings: "tf.Tensor", spec: "RecordSpec", what: str) -> "tf.Tensor":
    """A batch of stored images (`what` "image") or masks ("mask") decoded: [n, ...]."""
    import tensorflow as tf

    if what == "image":
        fn, shape, dtype = tf_decode_one_image, spec.image_shape, tf.dtypes.as_dtype(spec.image_dtype)
    else:
        fn = tf_decode_one_mask
        shape = spec.mask_shape
        dtype = tf.uint16 if spec.mask_dtype == "uint16" else tf.uint8
    return tf.map_fn(lambda s: fn(s, spec), strings, fn_output_signature=tf.TensorSpec(shape, dtype),
                     parallel_iterations=max(2, DECODE_THREADS))


__all__ = [
    "DEFAULT_QUALITY",
    "IMAGE_CODECS",
    "LOSSY_CODECS",
    "MASK_CODECS",
    "EncodedColumn",
    "class_map_of_onehot",
    "decode_image",
    "decode_mask",
    "decode_stored",
    "encode_image",
    "encode_mask",
    "image_column",
    "mask_codec_for",
    "mask_column",
    "parallel_for",
    "row_layout",
    "tf_checked_mask_strings",
    "tf_decode_batch",
    "tf_decode_one_image",
    "tf_decode_one_mask",
]
